"""``kumiko_jobs.testing``: run enqueued jobs in a test, through the real pipeline, without a
worker and without Redis, in pytest-django's ``db`` fixture (a transaction that never commits)
and with real commits (``live_db``, like ``transaction=True``)."""

from __future__ import annotations

from typing import Any

import pytest
from django.conf import settings
from django.db import connection, transaction
from django.test import TestCase, override_settings
from django_tenants.utils import schema_context

from kumiko_jobs.models import JobAttempt, RunStatus
from kumiko_jobs.testing import KumikoJobs, TooManyRuns, run_jobs
from tests.conftest import probes
from tests.testapp import async_jobs, jobs

GUARD_ON = {**settings.KUMIKO_JOBS, "DB_GUARD": "enforce"}
GUARD_OFF = {**settings.KUMIKO_JOBS, "DB_GUARD": "off"}


@pytest.mark.django_db
def test_run_jobs_inside_the_db_fixtures_transaction(kumiko_jobs: KumikoJobs) -> None:
    assert connection.in_atomic_block  # the test's own transaction, never committed
    handle = jobs.probe.enqueue(tenant="t1", tag="in-db")
    kumiko_jobs.assert_enqueued(jobs.probe, tenant="t1", tag="in-db", count=1)
    ran = kumiko_jobs.run()
    assert [(r.job_name, r.schema_name, r.outcome, r.result) for r in ran] == [
        ("testapp.probe", "t1", "succeeded", "in-db")
    ]
    assert kumiko_jobs.assert_succeeded(handle) == "in-db"
    assert [(p.tag, p.schema_seen) for p in probes("t1")] == [("in-db", "t1")]
    assert probes("t2") == []
    # The on-commit push never happened (nothing committed), and run_jobs did not need it.
    assert len(kumiko_jobs.pushes) == 0
    assert connection.in_atomic_block  # the caller's transaction is left alone
    kumiko_jobs.assert_nothing_enqueued()


@pytest.mark.django_db
def test_retries_follow_ups_and_async_jobs_run_in_one_call(kumiko_jobs: KumikoJobs) -> None:
    flaky = jobs.flaky.enqueue(tenant="t2", tag="f", fail_times=1)
    parent = jobs.with_followup.enqueue(tenant="t2", tag="p")
    aio = async_jobs.async_probe.enqueue(tenant="t3", tag="a")
    ran = kumiko_jobs.run()
    assert sorted((r.job_name, r.attempt, r.outcome) for r in ran) == [
        ("testapp.async_probe", 1, "succeeded"),
        ("testapp.flaky", 1, "retrying"),
        ("testapp.flaky", 2, "succeeded"),
        ("testapp.probe", 1, "succeeded"),  # the follow-up
        ("testapp.with_followup", 1, "succeeded"),
    ]
    kumiko_jobs.assert_succeeded(flaky)
    kumiko_jobs.assert_succeeded(parent)
    assert kumiko_jobs.assert_succeeded(aio)["count"] == 1
    assert sorted(p.tag for p in probes("t2")) == ["f", "f", "p", "p-child"]
    # Both attempts of flaky wrote: the first one's write stays, as with a worker.
    attempts = JobAttempt.objects.filter(run_id=flaky.run_id).order_by("number")
    assert [a.outcome for a in attempts] == ["retrying", "succeeded"]


@pytest.mark.django_db
def test_a_deferral_waits_for_its_time_unless_the_clock_moves(kumiko_jobs: KumikoJobs) -> None:
    handle = jobs.defers_once.enqueue(tenant="t1", tag="d")
    assert [r.outcome for r in kumiko_jobs.run()] == ["deferred"]
    assert handle.refresh().status == RunStatus.DEFERRED
    assert kumiko_jobs.run() == []  # due in a second: not yet
    assert [r.outcome for r in kumiko_jobs.run(include_scheduled=True)] == ["succeeded"]
    assert [p.tag for p in probes("t1")] == ["d", "d-resumed"]


@pytest.mark.django_db
def test_delayed_runs_run_when_the_clock_passes_them(kumiko_jobs: KumikoJobs) -> None:
    from datetime import timedelta

    later = jobs.probe.enqueue_in(timedelta(hours=1), tenant="t1", tag="later")
    assert kumiko_jobs.run() == []
    assert kumiko_jobs.run(until=timedelta(minutes=59)) == []
    assert [r.run_id for r in kumiko_jobs.run(until=timedelta(minutes=61))] == [later.run_id]


@pytest.mark.django_db
def test_the_guard_still_refuses_and_a_failed_sql_statement_does_not_poison_the_test(
    kumiko_jobs: KumikoJobs,
) -> None:
    with override_settings(KUMIKO_JOBS=GUARD_ON):
        attack = async_jobs.async_writes_other.enqueue(tenant="t2", tag="x", other="t1")
        kumiko_jobs.run()
    kumiko_jobs.assert_failed(attack, "DatabaseAccessDenied")
    assert [p.schema_seen for p in probes("t1")] == []
    # Refused before it reached PostgreSQL: the body's own write before it stays, as with a
    # worker, and the test's transaction goes on.
    assert [p.tag for p in probes("t2")] == ["x"]


@pytest.mark.django_db
def test_a_failed_sql_statement_does_not_poison_the_tests_transaction(
    kumiko_jobs: KumikoJobs,
) -> None:
    with override_settings(KUMIKO_JOBS=GUARD_OFF):
        broken = async_jobs.async_writes_other.enqueue(tenant="t2", tag="y", other="nowhere")
        kumiko_jobs.run()
    run = kumiko_jobs.assert_failed(broken, "ProgrammingError")
    assert "nowhere" in run.error_message
    # Rolled back to the body's savepoint: its write is gone, the transaction still works.
    assert probes("t2") == []
    jobs.probe.enqueue(tenant="t2", tag="after")
    assert [r.outcome for r in kumiko_jobs.run()] == ["succeeded"]


@pytest.mark.django_db
def test_a_job_that_keeps_deferring_is_stopped_with_a_clear_error(kumiko_jobs: KumikoJobs) -> None:
    jobs.defers_forever.enqueue(tenant="t1", tag="loop")
    with pytest.raises(TooManyRuns, match="Pass max_runs="):
        kumiko_jobs.run(include_scheduled=True, max_runs=2)


@pytest.mark.django_db
def test_on_commit_pushes_are_captured_not_sent(
    kumiko_jobs: KumikoJobs,
    django_capture_on_commit_callbacks: Any,
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        handle = jobs.probe.enqueue(tenant="t3", tag="pushed")
    assert [m.job_id for m in kumiko_jobs.pushes.messages] == [
        JobAttempt._meta.get_field("run").remote_field.model.objects.get(pk=handle.run_id).rq_job_id
    ]
    assert [r.outcome for r in kumiko_jobs.run()] == ["succeeded"]


@pytest.mark.django_db
def test_a_test_inside_a_tenant_stays_there(kumiko_jobs: KumikoJobs) -> None:
    with schema_context("t2"):
        jobs.probe.enqueue(tag="from-t2")  # the tenant is the connection's
        kumiko_jobs.run()
        assert connection.schema_name == "t2"
    assert [p.tag for p in probes("t2")] == ["from-t2"]


def test_with_real_commits_nothing_reaches_redis(
    live_db: None,
    redis_conn: Any,
    kumiko_jobs: KumikoJobs,
) -> None:
    assert not connection.in_atomic_block
    handle = jobs.probe.enqueue(tenant="t1", tag="committed")  # commits (autocommit)
    assert len(kumiko_jobs.pushes) == 1  # captured instead of sent
    assert redis_conn.dbsize() == 0
    assert [r.outcome for r in run_jobs()] == ["succeeded"]
    kumiko_jobs.assert_succeeded(handle)
    assert redis_conn.dbsize() == 0
    with transaction.atomic():
        jobs.probe.enqueue(tenant="t1", tag="rolled-back")
        transaction.set_rollback(True)
    kumiko_jobs.assert_nothing_enqueued()
    assert run_jobs() == []


class TestInATestCase(TestCase):
    """Plain Django TestCase (the ``db`` fixture's transaction): ``run_jobs()`` alone."""

    databases = {"default"}

    def test_run_jobs(self) -> None:
        with self.captureOnCommitCallbacks() as callbacks:
            handle = jobs.probe.enqueue(tenant="t3", tag="testcase")
        assert len(callbacks) == 1  # the push, pending: this transaction never commits
        assert [r.outcome for r in run_jobs()] == ["succeeded"]
        assert handle.refresh().status == RunStatus.SUCCEEDED
