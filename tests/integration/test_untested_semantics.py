"""Behaviour that was implemented but untested (issue 14), on real PostgreSQL, Redis and RQ."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.db import connections

from kumiko_jobs import transport
from kumiko_jobs.enqueueing.schedules import fire, schedule_id
from kumiko_jobs.models import JobAttempt, JobRun, RunStatus
from tests.conftest import probes, work
from tests.testapp import jobs

pytestmark = pytest.mark.usefixtures("live_db")


def _active_sleeps() -> int:
    """Backends still running the probe's sleep, seen from a second, separate connection."""
    from django.db import connection

    with connections["default"].temporary_connection() as cursor:  # type: ignore[attr-defined]
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' "
            "AND query LIKE %s AND pid <> pg_backend_pid()",
            ["%kumiko-timeout-probe%"],
        )
        count = int(cursor.fetchone()[0])
    assert connection.connection is None or not connection.connection.closed
    return count


def test_a_timeout_cancels_the_statement_on_the_server_and_leaves_a_clean_connection(tenants):
    timed_out = jobs.sleeps_in_postgres.enqueue(tenant="t1", tag="sleep")
    after = jobs.reports_backend.enqueue(tenant="t1", tag="next")
    work()
    run = JobRun.objects.get(pk=timed_out.run_id)
    assert run.status == RunStatus.FAILED and run.error_type == "JobTimeoutException"
    attempt = JobAttempt.objects.get(run=run)
    # PostgreSQL itself ended the statement ("canceling statement due to user request")...
    assert "QueryCanceled" in attempt.traceback
    assert "woke up" not in [p.note for p in probes("t1")]
    # ...so no backend still sleeps for a run that is over.
    assert _active_sleeps() == 0
    # The next run on the same worker used the same session, and it was clean.
    notes = [p.note for p in probes("t1")]
    assert JobRun.objects.get(pk=after.run_id).status == RunStatus.SUCCEEDED
    assert notes[0].startswith("pid ") and notes[-1] == notes[0]


def test_final_attempt_is_true_on_the_only_attempt_of_a_job_without_retries(tenants):
    jobs.final_attempt_probe.enqueue(tenant="t1", tag="once")
    work()
    assert [p.note for p in probes("t1")] == ["attempt 1 final True"]


def test_a_failing_sequential_run_releases_its_slot(tenants):
    failing = jobs.sequential_may_fail.enqueue(tenant="t1", tag="first", fail=True)
    waiting = jobs.sequential_may_fail.enqueue(tenant="t1", tag="second")
    assert transport.queue_length("default") == 2  # both queued; the dequeue holds the second
    for _ in range(3):
        work()
    assert JobRun.objects.get(pk=failing.run_id).status == RunStatus.FAILED
    assert JobRun.objects.get(pk=waiting.run_id).status == RunStatus.SUCCEEDED
    assert [p.tag for p in probes("t1")] == ["first", "second"]


def test_a_cron_tick_is_retried(tenants):
    firing = fire(schedule_id(jobs.cron_retried), now=datetime(2026, 4, 1, 6, 0, 1, tzinfo=UTC))
    assert firing.message is not None
    transport.push(firing.message)
    work(scheduler_rounds=2)
    run = JobRun.objects.get(pk=firing.run_id)
    assert (run.status, run.attempts, run.trigger) == (RunStatus.SUCCEEDED, 2, "cron")
    outcomes = list(JobAttempt.objects.filter(run=run).values_list("outcome", flat=True))
    assert outcomes == ["retrying", "succeeded"]


def test_a_boot_job_is_retried(tenants, monkeypatch):
    from kumiko_jobs.definition.options import build_definition
    from kumiko_jobs.definition.registry import registry
    from kumiko_jobs.worker.boot import enqueue_boot_jobs

    def boot_flaky(ctx) -> None:
        _fail_on_first_attempt(ctx)

    definition = build_definition(
        boot_flaky,
        {
            "name": "boot.flaky",
            "system": True,
            "run_on_boot": True,
            "retries": 1,
            "backoff": {"type": "fixed", "delay": 0},
        },
    )
    with registry.override(definition):
        [run_id] = enqueue_boot_jobs()
        work(scheduler_rounds=2)
    run = JobRun.objects.get(pk=run_id)
    assert (run.status, run.attempts, run.trigger) == (RunStatus.SUCCEEDED, 2, "boot")


def test_fan_out_children_are_retried(tenants):
    parent = jobs.fanout_child_retried.enqueue(tag="fan")
    work(scheduler_rounds=3)
    children = JobRun.objects.filter(parent_run_id=parent.run_id)
    assert sorted(children.values_list("schema_name", "status", "attempts")) == [
        (schema, RunStatus.SUCCEEDED, 2) for schema in ("t1", "t2", "t3")
    ]
    for schema in ("t1", "t2", "t3"):
        assert [p.note for p in probes(schema)] == ["attempt 1", "attempt 2"]


def test_a_later_success_clears_the_tenant_visible_failure(tenants):
    from kumiko_jobs.models import JobFailure

    jobs.flaky.enqueue(tenant="t1", tag="inv-7", fail_times=99)
    jobs.flaky.enqueue(tenant="t2", tag="inv-7", fail_times=99)
    work(scheduler_rounds=4)
    failures = JobFailure.objects.filter(job_name="testapp.flaky")
    assert sorted(failures.values_list("schema_name", "message_key")) == [
        ("t1", "testapp.flaky_failed"),
        ("t2", "testapp.flaky_failed"),
    ]
    jobs.flaky.enqueue(tenant="t1", tag="inv-7", fail_times=0)
    work()
    # t1's failure is resolved; t2's (same job and subject, another tenant) still stands.
    assert list(failures.values_list("schema_name", flat=True)) == ["t2"]


def _fail_on_first_attempt(ctx) -> None:
    if ctx.attempt == 1:
        raise ConnectionError("attempt 1 failed")
