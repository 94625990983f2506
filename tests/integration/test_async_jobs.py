"""``async def`` jobs run for real: in their tenant, on the worker's connection, under the guard.

Before, an async job's coroutine was never awaited and its run recorded ``succeeded``. Every
test runs the job through a real in-process kumiko worker (RQ, Redis, PostgreSQL).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.conf import settings
from django.db import connection
from django.test import override_settings

from kumiko_jobs.models import JobAttempt, JobRun, RunStatus
from tests.conftest import probes, work
from tests.testapp import async_jobs

pytestmark = pytest.mark.usefixtures("live_db")

# The first wall on its own: these tests are about the classifier and the worker's own
# connection, so the second wall (DB_ROLES, which would also stop the write) is off here;
# test_an_async_job_runs_as_its_tenants_role covers async bodies with it.
GUARD_OFF = {**settings.KUMIKO_JOBS, "DB_GUARD": "off", "DB_ROLES": False}
GUARD_ON = {**settings.KUMIKO_JOBS, "DB_GUARD": "enforce", "DB_ROLES": False}


def _stolen_rows(schema: str) -> int:
    """Rows marked stolen in ``schema``, read through a connection of its own."""
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    with psycopg.connect(**params) as other:
        row = other.execute(
            f"SELECT count(*) FROM \"{schema}\".testapp_probe WHERE schema_seen = 'stolen'"
        ).fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.one_slot
def test_an_async_job_runs_in_its_tenant_on_the_workers_connection(tenants: Any) -> None:
    with override_settings(KUMIKO_JOBS=GUARD_ON):
        handle = async_jobs.async_probe.enqueue(tenant="t2", tag="a")
        work()
    run = handle.refresh()
    assert run.status == RunStatus.SUCCEEDED, run.error_message
    assert [(p.tag, p.schema_seen) for p in probes("t2")] == [("a", "t2")]
    assert probes("t1") == [] and probes("t3") == []
    result = handle.result
    assert result["tag"] == "a" and result["count"] == 1  # counted in t2 only
    # The in-process worker runs in this thread, on this thread's connection: the async ORM's
    # queries went through that same session, not through a connection of another thread.
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        assert result["backend_pid"] == cursor.fetchone()[0]


def test_the_guard_refuses_an_async_jobs_write_to_another_tenant(tenants: Any) -> None:
    # Calibration: without the guard, the raw write into t1 from a t2 run lands.
    with override_settings(KUMIKO_JOBS=GUARD_OFF):
        off = async_jobs.async_writes_other.enqueue(tenant="t2", tag="calibration", other="t1")
        work()
    assert off.refresh().status == RunStatus.SUCCEEDED
    assert _stolen_rows("t1") == 1

    with override_settings(KUMIKO_JOBS=GUARD_ON):
        on = async_jobs.async_writes_other.enqueue(tenant="t2", tag="attack", other="t3")
        work()
    run = on.refresh()
    assert run.status == RunStatus.FAILED
    assert run.error_type == "DatabaseAccessDenied"
    assert _stolen_rows("t3") == 0
    # Its own tenant's write was allowed (and committed: autocommit, before the refusal).
    assert "attack" in [p.tag for p in probes("t2")]


def test_a_query_from_another_thread_is_refused(tenants: Any) -> None:
    with override_settings(KUMIKO_JOBS=GUARD_ON):
        handle = async_jobs.async_other_thread.enqueue(tenant="t1", tag="x")
        work()
    run = handle.refresh()
    assert run.status == RunStatus.FAILED
    assert run.error_type == "DatabaseAccessDenied"


def test_an_async_job_is_retried_like_a_sync_one(tenants: Any) -> None:
    handle = async_jobs.async_flaky.enqueue(tenant="t1", tag="f", fail_times=1)
    work(scheduler_rounds=2)
    run = handle.refresh()
    assert run.status == RunStatus.SUCCEEDED
    assert run.attempts == 2
    assert handle.result == "done on attempt 2"
    outcomes = list(JobAttempt.objects.filter(run=run).values_list("outcome", "error_message"))
    assert outcomes == [("retrying", "async boom on attempt 1"), ("succeeded", "")]


def test_an_async_job_defers_and_resumes(tenants: Any) -> None:
    handle = async_jobs.async_defers_once.enqueue(tenant="t3", tag="d")
    work()
    run = handle.refresh()
    assert run.status == RunStatus.DEFERRED
    assert handle.result is None  # a deferral is not a result
    work(scheduler_rounds=2)
    run = handle.refresh()
    assert run.status == RunStatus.SUCCEEDED
    assert run.defer_count == 1
    assert handle.result == "resumed"


@pytest.mark.parametrize("how", ["sleep", "orm", "sync"])
def test_a_timeout_cancels_the_coroutine_before_the_outcome_is_recorded(
    tenants: Any, tmp_path: Path, how: str
) -> None:
    marks = tmp_path / "marks"
    handle = async_jobs.async_overruns.enqueue(tenant="t1", tag="late", marks=str(marks), how=how)
    work()
    run = handle.refresh()
    assert run.status == RunStatus.FAILED
    assert run.error_type == "JobTimeoutException"
    events = marks.read_text().split()
    # The worker returned only after the coroutine had ended: its last mark is the
    # cancellation, nothing ran after it, and it never reached its end on its own.
    assert events[0] == "start" and events[-1] == "cancelled", events
    assert "end" not in events
    if how == "sync":
        # The alarm fired inside the sync call: the coroutine was cancelled right there, and
        # neither swallowed the timeout nor wrote after it.
        assert events == ["start", "cancelled"], events
    else:
        assert "tick" in events  # it did run (for about its 1 s) before the timeout
    assert "after the timeout" not in [p.schema_seen for p in probes("t1")]
    final = JobRun.objects.get(pk=handle.run_id)
    assert final.result is None
    # Nothing written after the run's outcome: the run's rows in t1 and its marks stay as
    # they were when the worker returned.
    count = len(probes("t1"))
    work()
    assert len(probes("t1")) == count
    assert marks.read_text().split() == events


def test_an_async_job_runs_as_its_tenants_role(tenants: Any) -> None:
    """With DB_ROLES (the suite's default) the async ORM's queries go through the body's
    connection too: the tenant role's, so PostgreSQL refuses the write into another tenant."""
    from kumiko_jobs.guard.roles import names as role_names

    ok = async_jobs.async_probe.enqueue(tenant="t2", tag="as-role")
    attack = async_jobs.async_writes_other.enqueue(tenant="t2", tag="role-attack", other="t3")
    work()
    assert ok.refresh().status == RunStatus.SUCCEEDED
    assert [(p.tag, p.schema_seen) for p in probes("t2")][:1] == [("as-role", "t2")]
    run = attack.refresh()
    assert (run.status, run.error_type) == (RunStatus.FAILED, "DatabaseAccessDenied")
    assert _stolen_rows("t3") == 0
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT usename FROM pg_stat_activity WHERE pid = %s", [ok.result["backend_pid"]]
        )
        assert cursor.fetchone()[0] == role_names.role_name(tenants["t2"].pk)


def test_async_runs_in_four_slots_run_at_once_each_in_its_own_tenant_and_session(
    tenants: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four async runs of three tenants in one 4-slot worker process (WORKER_CONCURRENCY):
    each awaits until all four run at once (a barrier, so no time is asserted), then writes
    and counts with the async ORM. Each ran in its own slot's thread, on its own session, in
    its own tenant, and saw only its tenant's rows. Calibrated: with one slot the barrier
    breaks (the runs come one at a time) and every run fails."""
    import threading

    from kumiko_jobs.core import conf
    from tests import slot_harness

    if slot_harness.slots_wanted() > 1:
        pytest.skip("makes its own slots; KUMIKO_TEST_SLOTS pins a suite's runs to one")
    monkeypatch.setenv(conf.CONCURRENCY_ENV, "4")
    async_jobs.MEETING["runs"] = threading.Barrier(4)
    schemas = ["t1", "t2", "t3", "t1"]
    handles = [
        async_jobs.async_meets.enqueue(tenant=s, tag=f"meet-{n}") for n, s in enumerate(schemas)
    ]
    try:
        work()
    finally:
        async_jobs.MEETING.clear()
    runs = [JobRun.objects.get(pk=h.run_id) for h in handles]
    assert [r.status for r in runs] == [RunStatus.SUCCEEDED] * 4, [r.error_message for r in runs]
    seen = [str(r.result).split() for r in runs]
    assert [s[0] for s in seen] == schemas
    assert len({s[1] for s in seen}) == 4  # four sessions
    assert len({s[2] for s in seen}) == 4  # four slots' threads
    for schema in ("t1", "t2", "t3"):
        assert all(p.schema_seen == schema for p in probes(schema))
    assert {len(probes(s)) for s in ("t2", "t3")} == {1} and len(probes("t1")) == 2
