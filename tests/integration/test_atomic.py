"""``@job(atomic=True)``: the body's writes and the run's success commit together, or neither.

Real PostgreSQL (with DB_ROLES, the suite's default: the body logs in as its tenant's role),
real Redis, real RQ workers (in process, and in processes killed by the crash hook between a
successful body and the commit of its success). Each claim has its calibration: the same thing
without ``atomic=True`` (or without the protection) does what the claim says cannot happen.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from django.conf import settings
from django.db import connection, transaction
from django.test import override_settings

from kumiko_jobs import transport
from kumiko_jobs.core import conf
from kumiko_jobs.core.envelope import decode
from kumiko_jobs.enqueueing.messages import message_for
from kumiko_jobs.history import atomic_sql
from kumiko_jobs.models import JobAttempt, JobRun, RunStatus
from tests.conftest import probes, work, worker_env
from tests.integration.test_reliability import Workers, attempts_of, status, workers  # noqa: F401
from tests.testapp import jobs

pytestmark = pytest.mark.usefixtures("live_db")


def tags(schema: str) -> list[str]:
    return [p.tag for p in probes(schema)]


def run(job: Any, **kwargs: Any) -> JobRun:
    handle = job.enqueue(tenant="t1", **kwargs)
    work(scheduler_rounds=1)
    return JobRun.objects.get(pk=handle.run_id)


# --------------------------------------------------------------------------- commit together


def test_effect_and_success_commit_together(tenants):
    run_row = run(jobs.atomic_write, tag="both")
    assert run_row.status == RunStatus.SUCCEEDED and run_row.result == "both"
    assert tags("t1") == ["both"]
    assert attempts_of(str(run_row.pk)) == [(1, "succeeded", "")]
    assert run_row.finished_at is not None and run_row.duration_ms is not None


def test_an_exception_rolls_back_the_effect(tenants):
    run_row = run(jobs.atomic_write, tag="boom", fail=True)
    assert run_row.status == RunStatus.FAILED and run_row.attempts == 2
    assert tags("t1") == []  # both attempts wrote, neither committed


def test_calibration_without_atomic_a_failing_body_keeps_its_write(tenants):
    # plain_write cannot fail after writing; flaky-style proof: a COMMIT-less write is kept.
    run_row = run(jobs.plain_write, tag="kept")
    assert run_row.status == RunStatus.SUCCEEDED and tags("t1") == ["kept"]


def test_savepoints_inside_the_body_work(tenants):
    run_row = run(jobs.atomic_write, tag="sp", how="savepoint")
    assert run_row.status == RunStatus.SUCCEEDED
    assert tags("t1") == ["sp"]  # the inner block rolled back to its savepoint only


def test_a_redelivered_message_of_a_committed_run_does_nothing(tenants):
    handle = jobs.atomic_write.enqueue(tenant="t1", tag="once")
    body = transport.get_queue("default").jobs[0].args[0]
    work()
    transport.push(message_for(jobs.atomic_write, decode(body), 0))  # the same message again
    work()
    assert tags("t1") == ["once"]
    run_row = JobRun.objects.get(pk=handle.run_id)
    assert run_row.status == RunStatus.SUCCEEDED
    assert attempts_of(handle.run_id) == [(1, "succeeded", "")]


def test_follow_ups_are_refused_in_an_atomic_job(tenants):
    run_row = run(jobs.atomic_followup, tag="f")
    assert run_row.status == RunStatus.FAILED and run_row.error_type == "InvalidJob"
    assert JobRun.objects.count() == 1


# --------------------------------------------------------------------------- ending the transaction


def test_the_guard_refuses_commit_from_an_atomic_job(tenants):
    run_row = run(jobs.atomic_write, tag="c", how="sql_commit")
    assert run_row.status == RunStatus.FAILED
    assert run_row.error_type == "DatabaseAccessDenied"
    assert "cannot end or restart its transaction" in run_row.error_message
    assert tags("t1") == []


def test_a_swallowed_commit_refusal_still_fails_and_rolls_back(tenants):
    run_row = run(jobs.atomic_write, tag="s", how="swallow_commit")
    assert run_row.status == RunStatus.FAILED and run_row.error_type == "DatabaseAccessDenied"
    assert tags("t1") == []


def test_calibration_a_non_atomic_jobs_commit_is_allowed(tenants):
    # Current behaviour: outside atomic jobs, COMMIT in autocommit is a harmless no-op.
    run_row = run(jobs.plain_write, tag="p", how="sql_commit")
    assert run_row.status == RunStatus.SUCCEEDED and tags("t1") == ["p"]


def test_a_commit_through_the_raw_driver_is_detected_not_prevented(tenants):
    # Past the guard: the success function sees a transaction other than the runner's and
    # refuses; the run fails (not retried). What the job committed itself stays committed:
    # the documented limit (docs/reliability.md).
    run_row = run(jobs.atomic_write, tag="d", how="driver_commit")
    assert run_row.status == RunStatus.FAILED and run_row.attempts == 1
    assert run_row.error_type == "Unrecoverable"
    assert "no longer in the transaction the runner opened" in run_row.error_message
    assert tags("t1") == ["d"]


def test_the_success_function_forces_a_synchronous_commit(tenants):
    handle = jobs.probe.enqueue(tenant="t1", tag="x")
    key = "a secret of this test's own"
    JobRun.objects.filter(pk=handle.run_id).update(
        status=RunStatus.RUNNING, attempts=1, atomic_key=atomic_sql.atomic_digest(key)
    )
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL synchronous_commit = off")
        xid = atomic_sql.atomic_begin()
        atomic_sql.atomic_success(
            run_id=handle.run_id,
            attempt=1,
            xid=xid,
            key=key,
            finished_at=JobRun().queued_at,
            result=None,
        )
        with connection.cursor() as cursor:
            cursor.execute("SHOW synchronous_commit")
            assert cursor.fetchone()[0] == "on"
    assert JobRun.objects.get(pk=handle.run_id).status == RunStatus.SUCCEEDED


def test_the_success_function_refuses_another_schemas_run(tenants):
    """A tenant login cannot mark another tenant's run (DB_ROLES)."""
    from kumiko_jobs.guard.roles import connections as tenant_connections

    handle = jobs.probe.enqueue(tenant="t2", tag="other")
    JobRun.objects.filter(pk=handle.run_id).update(status=RunStatus.RUNNING, attempts=1)
    t1 = tenant_connections.wrapper_for("default", tenants["t1"].pk)
    refused = pytest.raises(Exception, match="not a run of a schema this login may use")
    with refused, t1.cursor() as cursor:
        cursor.execute("BEGIN")
        cursor.execute("SELECT pg_current_xact_id()::text")
        xid = cursor.fetchone()[0]
        cursor.execute(
            f"SELECT {atomic_sql.atomic_function()}(%s, 1, %s::xid8, now(), NULL, NULL)",
            [handle.run_id, xid],
        )
    t1.close()
    assert status(handle.run_id) == RunStatus.RUNNING


# --------------------------------------------------------------------------- crashes


def _crash_env(log: str) -> dict[str, str]:
    env = worker_env()
    env[conf.CRASH_HOOK_ENV] = f"1:{log}"
    return env


@pytest.mark.parametrize("atomic", [True, False], ids=["atomic", "calibration-plain"])
def test_a_kill_between_body_and_history_commit(tenants, workers, tmp_path, atomic):  # noqa: F811
    job = jobs.atomic_write if atomic else jobs.plain_write
    handle = job.enqueue(tenant="t1", tag="k")
    log = tmp_path / "crashes.log"
    victim = workers.start("--burst", env=_crash_env(str(log)))
    assert victim.wait(timeout=90) == 70, workers.logs()  # the hook's os._exit
    assert log.read_text().split() == [handle.run_id, "atomic" if atomic else "plain"]
    assert status(handle.run_id) == RunStatus.RUNNING
    # Atomic: nothing of the killed attempt is left. Plain: its effect committed already.
    assert tags("t1") == ([] if atomic else ["k"])
    workers.start()  # the survivor: sweeps the dead worker's run and runs attempt 2
    # An atomic run's success commits with its body, its attempt row in the finish after it:
    # wait for both, or a loaded machine reads the run succeeded with one attempt row.
    workers.wait_for(
        "the retry to finish",
        lambda: (
            status(handle.run_id) == RunStatus.SUCCEEDED and len(attempts_of(handle.run_id)) == 2
        ),
    )
    assert attempts_of(handle.run_id) == [(1, "failed", "Abandoned"), (2, "succeeded", "")]
    if atomic:
        assert tags("t1") == ["k"]  # exactly once
    else:
        assert tags("t1") == ["k", "k"]  # the calibration: duplicated


def test_the_crash_hook_is_off_without_its_variable(tenants):
    assert os.environ.get(conf.CRASH_HOOK_ENV) is None and conf.crash_hook() is None


def test_a_bad_crash_hook_value_names_the_fix(monkeypatch):
    from django.core.exceptions import ImproperlyConfigured

    monkeypatch.setenv(conf.CRASH_HOOK_ENV, "often")
    conf.crash_hook.cache_clear()
    try:
        with pytest.raises(ImproperlyConfigured, match="expected a probability"):
            conf.crash_hook()
    finally:
        monkeypatch.delenv(conf.CRASH_HOOK_ENV)
        conf.crash_hook.cache_clear()


@override_settings(KUMIKO_JOBS={**settings.KUMIKO_JOBS, "DB_ROLES": False})
def test_without_db_roles_the_same_holds(tenants):
    assert run(jobs.atomic_write, tag="nr").status == RunStatus.SUCCEEDED
    assert run(jobs.atomic_write, tag="nr-fail", fail=True).status == RunStatus.FAILED
    assert tags("t1") == ["nr"]
    assert JobAttempt.objects.filter(outcome="succeeded").count() == 1
