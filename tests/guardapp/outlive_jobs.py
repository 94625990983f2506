"""Jobs of tests/integration/test_outlives_run.py: what one run tries to leave for later runs
(issue 22, "Nothing outlives a run" and "The atomic success function")."""

from __future__ import annotations

import contextvars
import threading
from typing import Any

import psycopg
from django.db import connection, transaction
from django.utils import timezone, translation

from example_project.catalog.models import Plan
from kumiko_jobs import EscapeHatch, job
from kumiko_jobs.run.context import JobContext

from .models import Finding

# A context variable of the job's own code: honest code that sets it and forgets to reset it.
LEAK: contextvars.ContextVar[str] = contextvars.ContextVar("guardapp_leak", default="unset")


def _note(key: str, value: Any) -> None:
    Finding.objects.create(key=key, value=str(value))


def _raw() -> Any:
    connection.ensure_connection()
    return connection.connection


@job
def set_state(ctx: JobContext) -> None:
    """Sets a ContextVar, the translation and the time zone, and never resets them; and sets
    every context variable of kumiko it can find to something hostile."""
    LEAK.set(f"set-by-{ctx.tenant.schema_name}")
    translation.activate("de")
    timezone.activate("Asia/Tokyo")
    from kumiko_jobs.guard.roles import connections as tenant_connections

    # The flag issue 22 found: set once, it turned the roles wall off for every later run.
    flag = getattr(tenant_connections, "inline_in_callers_transaction", None)
    if flag is not None:
        flag.set(True)
    for var in contextvars.copy_context():
        if var.name.startswith("kumiko_jobs_") and var.name != "kumiko_jobs_job_alarm":
            var.set(None)


@job
def read_state(ctx: JobContext) -> None:
    """What a later run sees of the state above, and who it is in PostgreSQL."""
    _note("leak", LEAK.get())
    _note("language", translation.get_language())
    _note("time_zone", timezone.get_current_timezone_name())
    with connection.cursor() as cursor:
        cursor.execute("SELECT session_user")
        _note("identity", cursor.fetchone()[0])


# --- a thread that carries the run's context and outlives the run -----------------------------

LATE: dict[str, Any] = {}
GO = threading.Event()


def _late_work() -> None:
    GO.wait()
    try:
        # The write the guard refuses in the run (a shared table, no grant); and who it is.
        Plan.objects.create(name="written-after-the-run", monthly_price=0)
        with connection.cursor() as cursor:
            cursor.execute("SELECT session_user, current_schema()")
            LATE["reached"] = cursor.fetchone()
    except Exception as exc:
        LATE["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        connection.close()


@job
def leave_a_thread(ctx: JobContext) -> None:
    """Starts a thread in a copy of the run's context that uses the database once the run is
    over (the test releases it after the worker finished)."""
    thread = threading.Thread(target=contextvars.copy_context().run, args=(_late_work,))
    LATE["thread"] = thread
    thread.start()


# --- statements past the guard's wrapper (libpq, a hand-built cursor) ---------------------------


@job
def libpq_session_lock(ctx: JobContext, *, key_class: int, key: str) -> None:
    """A session advisory lock sent through libpq itself (``pgconn.exec_``)."""
    raw = _raw()
    sql = f"SELECT pg_advisory_lock({int(key_class)}, hashtext('{key}'))"
    result = raw.pgconn.exec_(sql.encode())
    _note("lock", int(result.status))


@job
def hand_cursor_temp_table(ctx: JobContext) -> None:
    """A temp table shadowing the tenant's own finding table, on a hand-built psycopg cursor."""
    cursor = psycopg.Cursor(_raw())
    cursor.execute("CREATE TEMP TABLE guardapp_finding (id serial, key text, value text)")


@job
def write_finding(ctx: JobContext, *, value: str) -> None:
    _note("written", value)


@job
def hand_cursor_swallowed_denial(ctx: JobContext) -> None:
    """Reads t2 on a hand-built cursor and swallows PostgreSQL's ``permission denied``."""
    cursor = psycopg.Cursor(_raw())
    try:
        cursor.execute("SELECT value FROM t2.guardapp_secret")
        _note("read", cursor.fetchone())
    except psycopg.errors.InsufficientPrivilege:
        _note("read", "denied, and swallowed")


@job
def libpq_swallowed_denial(ctx: JobContext) -> None:
    """The same read through libpq itself: nothing is raised, the job just ignores the result."""
    result = _raw().pgconn.exec_(b"SELECT value FROM t2.guardapp_secret")
    _note("read", int(result.status))


# --- kumiko's admission lock ------------------------------------------------------------------


@job
def raw_admission_row_lock(ctx: JobContext) -> None:
    """The admission lock's rows, locked through the raw driver (PostgreSQL judges it)."""
    raw = _raw()
    try:
        with raw.transaction():
            raw.execute("SELECT key FROM public.kumiko_jobs_admissionlock FOR UPDATE")
            _note("locked", "yes")
    except Exception as exc:  # swallowed: the run fails all the same
        _note("locked", type(exc).__name__)


@job
def orm_admission_row_lock(ctx: JobContext) -> None:
    """The same through Django's cursor (the classifier judges it first), held to the end."""
    transaction.atomic().__enter__()  # never left: the run's transaction stays open
    with connection.cursor() as cursor:
        cursor.execute("SELECT key FROM public.kumiko_jobs_admissionlock FOR UPDATE")


@job
def session_advisory_lock(ctx: JobContext, *, function: str) -> None:
    """A session-level advisory lock through Django's cursor, without a grant."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {function}(4242)")


@job(escape_hatch=EscapeHatch(reason="test: a session lock", grants=["unsafe_raw"]))
def granted_session_advisory_lock(ctx: JobContext) -> None:
    with ctx.unsafe_raw(), connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_lock(4242)")


# --- the atomic success function ----------------------------------------------------------------

FORGED = {"forged": True}
# A finish a forger would have the function write with the success (migration 0029's seventh
# argument): an attempt row and the run's duration of its choice.
FORGED_FINISH = (
    '{"started_at": "2026-01-01T00:00:00+00:00", "duration_ms": 1, "log": ["forged"], '
    '"worker": "forged", "clear_subject": ""}'
)


def _call_success(cursor: Any, run_id: str, attempt: int) -> str:
    """Call the success function for ``run_id`` with this transaction's own id and a result of
    the job's choice, in every signature it had (0011: five arguments, 0017: six, 0029: seven)."""
    calls = [
        "SELECT public.kumiko_jobs_atomic_success(%s::uuid, %s, pg_current_xact_id(), now(), "
        "%s::jsonb, %s, %s::jsonb)",
        "SELECT public.kumiko_jobs_atomic_success(%s::uuid, %s, pg_current_xact_id(), now(), "
        "%s::jsonb, %s)",
        "SELECT public.kumiko_jobs_atomic_success(%s::uuid, %s, pg_current_xact_id(), now(), "
        "%s::jsonb)",
    ]
    outcomes = []
    for sql in calls:
        params: list[Any] = [run_id, attempt, '{"forged": true}']
        if sql.count("%s") >= 4:
            params.append("a guessed key")
        if sql.count("%s") == 5:
            params.append(FORGED_FINISH)
        try:
            with transaction.atomic():
                cursor.execute(sql, params)
            return "accepted"
        except Exception as exc:
            outcomes.append(type(exc).__name__)
    return "refused: " + ", ".join(outcomes)


def _raw_success(raw: Any, run_id: str, attempt: int) -> str:
    """``_call_success`` on the raw driver, each call in a savepoint (or its own transaction)."""
    outcomes = []
    for sql, params in (
        (
            "SELECT public.kumiko_jobs_atomic_success(%s::uuid, %s, pg_current_xact_id(), now(), "
            "%s::jsonb, %s, %s::jsonb)",
            [run_id, attempt, '{"forged": true}', "a guessed key", FORGED_FINISH],
        ),
        (
            "SELECT public.kumiko_jobs_atomic_success(%s::uuid, %s, pg_current_xact_id(), now(), "
            "%s::jsonb, %s)",
            [run_id, attempt, '{"forged": true}', "a guessed key"],
        ),
        (
            "SELECT public.kumiko_jobs_atomic_success(%s::uuid, %s, pg_current_xact_id(), now(), "
            "%s::jsonb)",
            [run_id, attempt, '{"forged": true}'],
        ),
    ):
        try:
            with raw.transaction():
                raw.execute(sql, params)
            outcomes.append("accepted")
            break
        except psycopg.Error as exc:
            outcomes.append(type(exc).__name__)
    return ",".join(outcomes)


@job
def forge_success_raw(ctx: JobContext, *, run_id: str, attempt: int = 1) -> None:
    """No grant: the function through the raw driver (a tenant login may execute it)."""
    _note("forged", _raw_success(_raw(), run_id, attempt))


@job(escape_hatch=EscapeHatch(reason="test: call the function", grants=["unsafe_raw"]))
def forge_success_granted(ctx: JobContext, *, run_id: str, attempt: int = 1) -> None:
    """With unsafe_raw, through Django's cursor (DB_ROLES off: the project's own login)."""
    with ctx.unsafe_raw(), connection.cursor() as cursor:
        outcome = _call_success(cursor, run_id, attempt)
    _note("forged", outcome)


@job(atomic=True)
def atomic_forges_its_own_success(ctx: JobContext) -> dict[str, bool]:
    """An atomic job marking its own run succeeded, with its own transaction's id (the
    runner's), through the raw driver in a savepoint."""
    _note("forged", _raw_success(_raw(), ctx.run_id, ctx.attempt))
    return {"returned": True}
