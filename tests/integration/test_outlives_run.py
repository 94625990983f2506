"""Nothing outlives a run, and the atomic success function (issue 22): attacks through a worker.

Each test runs the planting job in tenant t1 through a real in-process RQ worker, then (where
the attack aims at later runs) a run of another tenant on the same worker, and reads the effect
through the test's own second connection (``observer``), in both ``DB_ROLES`` modes where both
apply. Proven able to fail: each test fails on the code before issue 22's fix (the commit that
added it says how it was checked), and the context test carries its own calibration (the fresh
context per attempt switched off).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.conf import settings
from django.db import connection, transaction
from django.test import override_settings
from django_tenants.utils import tenant_context

from kumiko_jobs.core import current, session
from kumiko_jobs.core.db import ADMISSION_LOCK_CLASS
from kumiko_jobs.guard.roles import names as role_names
from kumiko_jobs.models import JobRun, RunStatus
from tests.conftest import work
from tests.guardapp import outlive_jobs, support
from tests.testapp import jobs as testapp_jobs

pytestmark = pytest.mark.usefixtures("live_db")

ROLES = {**settings.KUMIKO_JOBS, "DB_GUARD": "enforce", "DB_ROLES": True}
CLASSIFIER = {**ROLES, "DB_ROLES": False}
MODES = pytest.mark.parametrize("mode", [ROLES, CLASSIFIER], ids=["roles", "classifier"])


def _runs(*jobs: tuple[Any, ...], mode: dict[str, Any]) -> list[JobRun]:
    """Enqueue ``(tenant, job[, kwargs])`` in order, then one worker drains them all."""
    handles = []
    with override_settings(KUMIKO_JOBS=mode):
        for tenant, job, *kwargs in jobs:
            with tenant_context(tenant):
                handles.append(job.enqueue(**(kwargs[0] if kwargs else {})))
        work()
    connection.set_schema_to_public()
    return [JobRun.objects.get(pk=h.run_id) for h in handles]


def _findings(observer: support.Observer, schema: str) -> dict[str, str]:
    rows = observer.rows(f'SELECT key, value FROM "{schema}".guardapp_finding ORDER BY id')
    return {key: value for key, value in rows}


def _succeeded(*runs: JobRun) -> None:
    for run in runs:
        assert run.status == RunStatus.SUCCEEDED, (run.job_name, run.error_type, run.error_message)


# --- 1. each attempt runs in a fresh context ----------------------------------------------------


class _SameContext:
    """The calibration: every attempt in the worker's own context, as before issue 22."""

    def run(self, function: Any, *args: Any) -> Any:
        return function(*args)


@pytest.fixture(params=["closed", "calibration"])
def context(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    if request.param == "calibration":
        monkeypatch.setattr(current, "attempt_context", _SameContext)
        monkeypatch.setattr(current, "reset_locale", lambda: None)
    try:
        yield str(request.param)
    finally:
        # Whatever a calibrated run left in the test's own context.
        outlive_jobs.LEAK.set("unset")
        current.reset_locale()


@MODES
def test_state_one_run_sets_never_reaches_the_next_run_of_another_tenant(
    tenants, guard_data, observer, mode, context
):
    """t1 sets a ContextVar, the translation and the time zone and resets none; it also sets
    every kumiko context variable it finds (the roles wall's inline flag among them, before
    issue 22). t2's next run on the same worker sees the defaults, and runs as t2's role."""
    planted, later = _runs(
        (tenants["t1"], outlive_jobs.set_state),
        (tenants["t2"], outlive_jobs.read_state),
        mode=mode,
    )
    _succeeded(planted, later)
    seen = _findings(observer, "t2")
    if context == "calibration":
        assert (seen["leak"], seen["language"], seen["time_zone"]) == (
            "set-by-t1",
            "de",
            "Asia/Tokyo",
        )
        return
    assert seen["leak"] == "unset"
    assert seen["language"] == settings.LANGUAGE_CODE
    assert seen["time_zone"] == settings.TIME_ZONE
    expected = role_names.role_name(tenants["t2"].pk) if mode["DB_ROLES"] else None
    if expected is not None:
        assert seen["identity"] == expected  # the wall stands for the later run


def test_kumikos_context_variables_are_all_named_and_reset():
    """``attempt_context`` drops every ``kumiko_jobs_*`` variable but the worker's alarm."""
    from kumiko_jobs.guard.watch import watching

    token = current.job_alarm.set(lambda: None)
    try:
        with watching(object()):  # type: ignore[arg-type]
            fresh = current.attempt_context()
        names = {var.name for var in fresh}
        assert "kumiko_jobs_current_watch" not in names
        assert "kumiko_jobs_job_alarm" in names
    finally:
        current.job_alarm.reset(token)


# --- 2. a thread that carries the run's context, after the run ---------------------------------


@MODES
def test_a_thread_carrying_the_runs_context_is_refused_after_the_run(
    tenants, guard_data, observer, mode
):
    outlive_jobs.LATE.clear()
    outlive_jobs.GO.clear()
    (run,) = _runs((tenants["t1"], outlive_jobs.leave_a_thread), mode=mode)
    _succeeded(run)
    outlive_jobs.GO.set()  # the run is over: the thread goes on
    outlive_jobs.LATE["thread"].join()
    assert "reached" not in outlive_jobs.LATE, outlive_jobs.LATE
    assert outlive_jobs.LATE["error"].startswith("DatabaseAccessDenied"), outlive_jobs.LATE
    assert "after the run ended" in outlive_jobs.LATE["error"]
    written = observer.value(
        "SELECT count(*) FROM public.catalog_plan WHERE name = 'written-after-the-run'"
    )
    assert written == 0


# --- 3. the session is reset whatever route its statements took ---------------------------------

ADMISSION_KEY = "kumiko_jobs:testapp.capped:t2"


@MODES
def test_a_session_lock_sent_through_libpq_is_released_after_the_run(
    tenants, guard_data, observer, mode
):
    """``pgconn.exec_()`` never meets a wrapper; the lock (on the key kumiko's admission used
    for t2 before issue 22) must not outlive the run on the pooled session. After a warm-up run:
    a tenant login's first run on a new session was reset anyway before issue 22."""
    _warm, run = _runs(
        (tenants["t1"], outlive_jobs.write_finding, {"value": "warm"}),
        (
            tenants["t1"],
            outlive_jobs.libpq_session_lock,
            {"key_class": ADMISSION_LOCK_CLASS, "key": ADMISSION_KEY},
        ),
        mode=mode,
    )
    _succeeded(_warm, run)
    assert _findings(observer, "t1")["lock"] == "2"  # calibration: PGRES_TUPLES_OK, it was taken
    free = observer.value(
        "SELECT pg_try_advisory_lock(%s, hashtext(%s))", (ADMISSION_LOCK_CLASS, ADMISSION_KEY)
    )
    observer.rows("SELECT pg_advisory_unlock_all()")
    assert free is True


@MODES
def test_a_temp_table_planted_on_a_hand_built_cursor_captures_no_later_write(
    tenants, guard_data, observer, mode
):
    _warm, planted, later = _runs(
        (tenants["t1"], outlive_jobs.write_finding, {"value": "warm"}),
        (tenants["t1"], outlive_jobs.hand_cursor_temp_table),
        (tenants["t1"], outlive_jobs.write_finding, {"value": "kept"}),
        mode=mode,
    )
    _succeeded(_warm, planted, later)
    written = observer.rows("SELECT value FROM t1.guardapp_finding WHERE key = 'written'")
    assert sorted(written) == [("kept",), ("warm",)]  # both in the tenant's real table


def test_a_permission_denied_swallowed_on_a_hand_built_cursor_fails_the_run(
    tenants, guard_data, observer
):
    _warm, run = _runs(
        (tenants["t1"], outlive_jobs.write_finding, {"value": "warm"}),
        (tenants["t1"], outlive_jobs.hand_cursor_swallowed_denial),
        mode=ROLES,
    )
    assert run.status == RunStatus.FAILED, (run.status, run.error_message)
    assert run.error_type == "DatabaseAccessDenied"
    assert "was denied by PostgreSQL" in run.error_message
    assert _findings(observer, "t1")["read"] == "denied, and swallowed"


def test_documented_gap_a_refusal_read_from_libpq_is_not_the_runs_failure(
    tenants, guard_data, observer
):
    """docs/guard.md, Not covered: ``pgconn.exec_()`` raises nothing, so a refusal the job reads
    and ignores there does not fail the run. PostgreSQL still refused it: nothing of t2 was
    read. Fails the day the gap is closed, so that the case moves into the attacks above."""
    (run,) = _runs((tenants["t1"], outlive_jobs.libpq_swallowed_denial), mode=ROLES)
    _succeeded(run)
    assert _findings(observer, "t1")["read"] == str(int(psycopg.pq.ExecStatus.FATAL_ERROR))


@pytest.mark.one_slot
def test_a_clean_warm_run_with_roles_costs_four_statements(tenants, guard_data):
    """start, the body's one statement, the reset (with the kept search path), the finish:
    every statement psycopg sends, on every connection."""
    counted: list[str] = []
    original = psycopg.Cursor.execute

    def counting(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        counted.append(str(query)[:60])
        return original(self, query, *args, **kwargs)

    # The tenant login's reset is sent past psycopg's cursor, without waiting (core.session).
    send_reset = session.send_reset

    def counting_reset(raw: Any, statement: str) -> None:
        counted.append(statement[:60])
        send_reset(raw, statement)

    _runs((tenants["t1"], outlive_jobs.write_finding, {"value": "warm"}), mode=ROLES)
    with override_settings(KUMIKO_JOBS=ROLES):
        with tenant_context(tenants["t1"]):
            handle = outlive_jobs.write_finding.enqueue(value="x")
        psycopg.Cursor.execute = counting  # type: ignore[method-assign]
        session.send_reset = counting_reset
        try:
            work()
        finally:
            psycopg.Cursor.execute = original  # type: ignore[method-assign]
            session.send_reset = send_reset
    connection.set_schema_to_public()
    _succeeded(JobRun.objects.get(pk=handle.run_id))
    assert len(counted) == 4, counted
    start, body, reset, finish = counted
    assert "kumiko_jobs_jobrun" in start and "guardapp_finding" in body, counted
    assert reset.startswith("CLOSE ALL") and finish.startswith("WITH run AS (UPDATE"), counted


# --- 4. kumiko's admission lock is not a tenant session's to take --------------------------------


def _lock_row(observer: support.Observer, key: str) -> psycopg.Connection[Any]:
    """Make sure the key's row exists, then try it with NOWAIT from a session of the test's."""
    observer.rows(
        "INSERT INTO public.kumiko_jobs_admissionlock (key) VALUES (%s) ON CONFLICT DO NOTHING",
        (key,),
    )
    session = observer.connect(autocommit=False)
    observer.sessions.append(session)
    return session


def _row_is_free(session: psycopg.Connection[Any], key: str) -> bool:
    try:
        session.execute(
            "SELECT 1 FROM public.kumiko_jobs_admissionlock WHERE key = %s FOR UPDATE NOWAIT",
            (key,),
        )
        return True
    except psycopg.errors.LockNotAvailable:
        return False
    finally:
        session.rollback()


def test_the_admission_lock_is_a_row_lock_held_by_the_enqueuing_transaction(tenants, observer):
    session = _lock_row(observer, ADMISSION_KEY)
    with tenant_context(tenants["t2"]), transaction.atomic():
        testapp_jobs.capped.enqueue(tag="a")
        assert not _row_is_free(session, ADMISSION_KEY)  # held while the enqueue's tx is open
    assert _row_is_free(session, ADMISSION_KEY)


def test_a_session_holding_the_old_advisory_key_does_not_block_admission(tenants, observer):
    """Before issue 22 a tenant session holding this advisory key stalled t2's limited
    enqueues; the lock_timeout bounds the wait of the enqueue on the code before the fix."""
    holder = observer.connect()
    observer.sessions.append(holder)
    holder.execute(
        "SELECT pg_advisory_lock(%s, hashtext(%s))", (ADMISSION_LOCK_CLASS, ADMISSION_KEY)
    )
    with tenant_context(tenants["t2"]), transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL lock_timeout = '5s'")
        handle = testapp_jobs.capped.enqueue(tag="b")
    assert handle.status == RunStatus.QUEUED


def test_a_tenant_login_cannot_take_the_admission_row_lock(tenants, guard_data, observer):
    """Roles on, through the raw driver: PostgreSQL refuses (no privilege), and the run fails."""
    session = _lock_row(observer, ADMISSION_KEY)
    (run,) = _runs((tenants["t1"], outlive_jobs.raw_admission_row_lock), mode=ROLES)
    # The tenant login's cursors raise PostgreSQL's refusal as the run's denial.
    assert _findings(observer, "t1")["locked"] == "DatabaseAccessDenied"
    assert run.status == RunStatus.FAILED and run.error_type == "DatabaseAccessDenied"
    assert _row_is_free(session, ADMISSION_KEY)


@MODES
def test_the_classifier_refuses_the_admission_table(tenants, guard_data, observer, mode):
    session = _lock_row(observer, ADMISSION_KEY)
    (run,) = _runs((tenants["t1"], outlive_jobs.orm_admission_row_lock), mode=mode)
    assert run.status == RunStatus.FAILED and run.error_type == "DatabaseAccessDenied"
    # Refused as one of kumiko's own tables (the rule that covers every one of them).
    assert "kumiko_jobs_admissionlock" in run.error_message
    assert "No grant allows this" in run.error_message
    assert _row_is_free(session, ADMISSION_KEY)


@pytest.mark.parametrize(
    "function", ["pg_advisory_lock", "pg_try_advisory_lock", "pg_advisory_lock_shared"]
)
def test_roles_off_session_advisory_locks_need_unsafe_raw(tenants, guard_data, observer, function):
    (run,) = _runs(
        (tenants["t1"], outlive_jobs.session_advisory_lock, {"function": function}),
        mode=CLASSIFIER,
    )
    assert run.status == RunStatus.FAILED and run.error_type == "DatabaseAccessDenied"
    assert "unsafe_raw" in run.error_message
    assert observer.value("SELECT pg_try_advisory_lock(4242)") is True
    observer.rows("SELECT pg_advisory_unlock_all()")


@MODES
def test_a_granted_session_advisory_lock_is_released_after_the_run(
    tenants, guard_data, observer, mode
):
    (run,) = _runs((tenants["t1"], outlive_jobs.granted_session_advisory_lock), mode=mode)
    _succeeded(run)
    assert observer.value("SELECT pg_try_advisory_lock(4242)") is True
    observer.rows("SELECT pg_advisory_unlock_all()")


# --- 5. the atomic success function -------------------------------------------------------------


def _running_run(tenant: Any) -> JobRun:
    """Another run of the tenant, running (as if on another worker)."""
    with tenant_context(tenant):
        handle = testapp_jobs.probe.enqueue(tag="victim")
    connection.set_schema_to_public()
    JobRun.objects.filter(pk=handle.run_id).update(status=RunStatus.RUNNING, attempts=1)
    return JobRun.objects.get(pk=handle.run_id)


def _victim_state(observer: support.Observer, run_id: str) -> tuple[str, Any]:
    row = observer.rows(
        "SELECT status, result FROM public.kumiko_jobs_jobrun WHERE run_id = %s", (run_id,)
    )
    return row[0][0], row[0][1]


def _planted(observer: support.Observer, run_id: str) -> int:
    """Attempt rows a forged finish (``outlive_jobs.FORGED_FINISH``) would have written."""
    rows = observer.rows(
        "SELECT count(*) FROM public.kumiko_jobs_jobattempt WHERE run_id = %s AND worker = %s",
        (run_id, "forged"),
    )
    return int(rows[0][0])


def test_a_grantless_job_cannot_mark_another_run_succeeded(tenants, guard_data, observer):
    """Roles on: a tenant login may execute the function; with its own pg_current_xact_id()
    and a result of its choice it marked any running run of its tenant succeeded."""
    victim = _running_run(tenants["t1"])
    (run,) = _runs(
        (tenants["t1"], outlive_jobs.forge_success_raw, {"run_id": str(victim.run_id)}),
        mode=ROLES,
    )
    assert "accepted" not in _findings(observer, "t1")["forged"]
    assert _victim_state(observer, str(victim.run_id)) == ("running", None)
    assert _planted(observer, str(victim.run_id)) == 0
    assert run.status in (RunStatus.SUCCEEDED, RunStatus.FAILED)


def test_unsafe_raw_cannot_mark_another_run_succeeded_either(tenants, guard_data, observer):
    """Roles off, with unsafe_raw, through Django's cursor: the function refuses without the
    attempt's key, whatever the caller's transaction."""
    victim = _running_run(tenants["t1"])
    (run,) = _runs(
        (tenants["t1"], outlive_jobs.forge_success_granted, {"run_id": str(victim.run_id)}),
        mode=CLASSIFIER,
    )
    _succeeded(run)
    assert _findings(observer, "t1")["forged"].startswith("refused")
    assert _victim_state(observer, str(victim.run_id)) == ("running", None)
    assert _planted(observer, str(victim.run_id)) == 0


@MODES
def test_an_atomic_job_cannot_choose_its_own_result(tenants, guard_data, observer, mode):
    (run,) = _runs((tenants["t1"], outlive_jobs.atomic_forges_its_own_success), mode=mode)
    _succeeded(run)
    status, result = _victim_state(observer, str(run.run_id))
    assert (status, result) == ("succeeded", {"returned": True})
    assert _planted(observer, str(run.run_id)) == 0
    assert "accepted" not in _findings(observer, "t1")["forged"]


def test_the_success_functions_of_migrations_0011_and_0017_are_gone(observer):
    for old in (
        "public.kumiko_jobs_atomic_success(uuid, integer, xid8, timestamptz, jsonb)",
        "public.kumiko_jobs_atomic_success(uuid, integer, xid8, timestamptz, jsonb, text)",
    ):
        assert observer.value("SELECT to_regprocedure(%s)", (old,)) is None, old
    new = "public.kumiko_jobs_atomic_success(uuid, integer, xid8, timestamptz, jsonb, text, jsonb)"
    assert observer.value("SELECT to_regprocedure(%s)::text", (new,)) is not None


def test_every_context_variable_of_kumiko_carries_its_prefix():
    """``attempt_context`` recognises kumiko's variables by name: a new one without the prefix
    would survive from run to run."""
    import pathlib
    import re

    root = pathlib.Path(current.__file__).parent.parent
    found = []
    for path in root.rglob("*.py"):
        found += re.findall(r"ContextVar\(\s*\"([^\"]+)\"", path.read_text())
    assert len(found) >= 6, found
    assert all(name.startswith(current.OWN_PREFIX) for name in found), found
