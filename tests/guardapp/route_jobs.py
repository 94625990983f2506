"""Jobs of the route and run-hygiene suites (tests/integration/test_guard_routes.py and
test_run_hygiene.py).

``route`` takes one of the ways around the execute wrapper, chosen by ``case``, in a tenant
run without grants; ``plant`` leaves one kind of session state behind (under ``unsafe_raw``),
and ``observe`` reports, from a later run on the same connection, what it finds.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from asgiref.sync import async_to_sync
from django.core.management import call_command
from django.db import connection, connections, transaction

from example_project.catalog.models import Plan
from kumiko_jobs import EscapeHatch, job, signals
from kumiko_jobs.run.context import JobContext

from .models import Finding, Secret

NEW_ALIAS = "route_new"  # an alias the job itself adds to the settings during its run
ADVISORY_KEY = 734_221  # the session advisory lock ``plant`` takes


def _note(key: str, value: str) -> None:
    Finding.objects.create(key=key, value=value)


# --- routes around the execute wrapper --------------------------------------------------------


def _callproc(ctx: JobContext) -> None:
    # psycopg 3 has no callproc: Django's cursor builds "SELECT * FROM name(args)" and runs it
    # on the psycopg cursor, past every execute wrapper.
    with connection.cursor() as cursor:
        cursor.callproc("query_to_xml", ["SELECT value FROM t2.guardapp_secret", True, True, ""])
        leaked = str(cursor.fetchone()[0])
    _note("leaked", leaked)


def _executemany(ctx: JobContext) -> None:
    with connection.cursor() as cursor:
        cursor.executemany(
            "INSERT INTO t2.guardapp_secret (label, value) VALUES (%s, %s)",
            [("planted", "many-1"), ("planted", "many-2")],
        )


def _copy(ctx: JobContext) -> None:
    with connection.cursor() as cursor, cursor.copy("COPY t2.guardapp_secret TO STDOUT") as copy:
        leaked = b"".join(bytes(chunk) for chunk in copy)
    _note("leaked", leaked.decode())


def _stream(ctx: JobContext) -> None:
    with connection.cursor() as cursor:
        leaked = [row[0] for row in cursor.stream("SELECT value FROM t2.guardapp_secret")]
    _note("leaked", ",".join(leaked))


def _new_alias_settings() -> None:
    connections.settings[NEW_ALIAS] = dict(connections["default"].settings_dict)


def _new_alias_shared_write(ctx: JobContext) -> None:
    _new_alias_settings()  # a wrapper made during the run: no execute wrapper installed on it
    Plan.objects.using(NEW_ALIAS).create(name="via-new-alias", monthly_price=Decimal("0.00"))


def _new_alias_reads_own(ctx: JobContext) -> None:
    _new_alias_settings()
    values = Secret.objects.using(NEW_ALIAS).values_list("value", flat=True)
    _note("new_alias", ",".join(sorted(values)))


def _replaced_default_shared_write(ctx: JobContext) -> None:
    # A fresh wrapper for the default alias: public schema, no execute wrapper, until adopted.
    del connections["default"]
    Plan.objects.create(name="via-fresh-wrapper", monthly_price=Decimal("0.00"))


def _async_orm(ctx: JobContext) -> None:
    # The async ORM runs the query with sync_to_async, in an executor thread with a connection
    # of its own (public schema, no wrapper).
    asyncio.run(Plan.objects.acreate(name="via-async-orm", monthly_price=Decimal("0.00")))


def _async_to_sync(ctx: JobContext) -> None:
    # async_to_sync hands the query back to this thread: the job's own, guarded connection.
    async_to_sync(Plan.objects.acreate)(name="via-async-to-sync", monthly_price=Decimal("0.00"))


class HostileError(Exception):
    """An exception whose text is computed with the ORM when it is rendered."""

    def __str__(self) -> str:
        Plan.objects.create(name="via-exception-str", monthly_price=Decimal("0.00"))
        return "hostile"


class ReadingError(Exception):
    """An exception whose text reads the run's own tenant: rendered in the wrong schema, it
    would fail (public has no guardapp tables) or read the wrong tenant."""

    def __str__(self) -> str:
        return "own secrets: " + ",".join(Secret.objects.values_list("value", flat=True))


def _exception_str(ctx: JobContext) -> None:
    raise HostileError()


def _exception_cause(ctx: JobContext) -> None:
    try:
        raise HostileError()
    except HostileError as exc:
        raise RuntimeError("the outer error") from exc


def _exception_group(ctx: JobContext) -> None:
    raise ExceptionGroup("several", [ValueError("plain"), HostileError()])


def _exception_reads_own(ctx: JobContext) -> None:
    raise ReadingError()


def _receiver_writes_plan(sender: Any, **kwargs: Any) -> None:
    Plan.objects.get_or_create(name="via-receiver", defaults={"monthly_price": Decimal("0.00")})


def _connect_receiver(ctx: JobContext) -> None:
    signals.job_succeeded.connect(_receiver_writes_plan, weak=False)


def _system_followup(ctx: JobContext) -> None:
    ctx.enqueue(route_system_closed, name="via-system-followup")


def _system_followup_by_api(ctx: JobContext) -> None:
    route_system_closed.enqueue(name="via-system-followup")


def _system_followup_allowed(ctx: JobContext) -> None:
    ctx.enqueue(route_system_open, name="via-system-followup")


def _dbshell(ctx: JobContext) -> None:
    call_command("dbshell", "--", "-c", "DELETE FROM t2.guardapp_secret")


ROUTES: dict[str, Callable[[JobContext], None]] = {
    "callproc": _callproc,
    "executemany": _executemany,
    "copy": _copy,
    "stream": _stream,
    "new_alias_shared_write": _new_alias_shared_write,
    "new_alias_reads_own": _new_alias_reads_own,
    "replaced_default_shared_write": _replaced_default_shared_write,
    "async_orm": _async_orm,
    "async_to_sync": _async_to_sync,
    "exception_str": _exception_str,
    "exception_cause": _exception_cause,
    "exception_group": _exception_group,
    "exception_reads_own": _exception_reads_own,
    "connect_receiver": _connect_receiver,
    "system_followup": _system_followup,
    "system_followup_by_api": _system_followup_by_api,
    "system_followup_allowed": _system_followup_allowed,
    "dbshell": _dbshell,
}


@job
def route(ctx: JobContext, *, case: str) -> None:
    """One way around the execute wrapper, from a run in t1 without grants."""
    ROUTES[case](ctx)


@job(system=True)
def route_system_closed(ctx: JobContext, *, name: str) -> None:
    with ctx.system_db():
        Plan.objects.create(name=name, monthly_price=Decimal("0.00"))


@job(system=True, tenant_may_start=True)
def route_system_open(ctx: JobContext, *, name: str) -> None:
    with ctx.system_db():
        Plan.objects.create(name=name, monthly_price=Decimal("0.00"))


# --- session state left behind ----------------------------------------------------------------


def _backend_pid() -> int:
    return int(_observations()["pid"])


def _raw(statement: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute(statement)


PLANTS: dict[str, str] = {
    "work_mem": "SET work_mem = '77MB'",
    "search_path": "SELECT set_config('search_path', 't2', false)",
    "pg_settings": "UPDATE pg_settings SET setting = '4242' WHERE name = 'statement_timeout'",
    "advisory_lock": f"SELECT pg_advisory_lock({ADVISORY_KEY})",
    "prepared": "PREPARE planted_statement AS SELECT 1",
    "listen": "LISTEN planted_channel",
    "temp_table": "CREATE TEMP TABLE planted_temp (n int)",
    "held_cursor": "DECLARE planted_cursor CURSOR WITH HOLD FOR SELECT 1",
}


OBSERVATIONS: dict[str, str] = {
    "work_mem": "SELECT current_setting('work_mem')",
    "statement_timeout": "SELECT current_setting('statement_timeout')",
    "search_path": "SELECT current_setting('search_path')",
    "advisory_lock": (
        f"SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = {ADVISORY_KEY}"
    ),
    "prepared": "SELECT count(*) FROM pg_prepared_statements",
    "listen": "SELECT count(*) FROM pg_listening_channels()",
    "temp_table": "SELECT count(*) FROM pg_class WHERE relname = 'planted_temp'",
    "held_cursor": "SELECT count(*) FROM pg_cursors",
    "transaction": "SELECT now() = statement_timestamp()",
    "time_zone": "SELECT current_setting('TimeZone')",
    "pid": "SELECT pg_backend_pid()",
}


def _observations() -> dict[str, str]:
    """What the session looks like (read-only catalog and settings queries).

    Read through the driver, past the guard: this is the suite's instrument, not job code under
    test, and the guard refuses several of these catalogs (pg_locks, pg_prepared_statements,
    pg_cursors) to tenant SQL. Same session, so it sees exactly what the run left behind.
    """
    found = {}
    connection.ensure_connection()
    with connection.connection.cursor() as cursor:
        for key, query in OBSERVATIONS.items():
            cursor.execute(query)
            row = cursor.fetchone()
            assert row is not None
            found[key] = str(row[0])
    return found


@job(
    escape_hatch=EscapeHatch(
        reason="run-hygiene suite: plants session state", grants=["unsafe_raw"]
    )
)
def plant(ctx: JobContext, *, kind: str) -> None:
    """Leave one kind of state on the worker's connection; note what the session then shows."""
    _note("pid", str(_backend_pid()))  # before the state: a planted search_path moves findings
    if kind == "raw_begin":
        with ctx.unsafe_raw():
            _raw("BEGIN")
        Secret.objects.create(label="in-leaked-tx", value="never committed")
    elif kind == "atomic_never_left":
        transaction.atomic().__enter__()
        Secret.objects.create(label="in-leaked-atomic", value="never committed")
    else:
        with ctx.unsafe_raw():
            _raw(PLANTS[kind])
            after = _observations()
        # Qualified: the planted search_path must not move the calibration into t2.
        with connection.cursor() as cursor:
            for key, value in after.items():
                cursor.execute(
                    f'INSERT INTO "{ctx.schema_name}".guardapp_finding (key, value) '
                    "VALUES (%s, %s)",
                    [f"after:{key}", value],
                )


@job(escape_hatch=EscapeHatch(reason="run-hygiene suite: reads the session", grants=["unsafe_raw"]))
def observe(ctx: JobContext) -> None:
    """What the session looks like to a later run."""
    with ctx.unsafe_raw():
        seen = _observations()
    for key, value in seen.items():
        _note(key, value)
    Secret.objects.create(label="observed", value=str(ctx.schema_name))


@job(escape_hatch=EscapeHatch(reason="run-hygiene suite: a raw BEGIN", grants=["unsafe_raw"]))
def leave_open(ctx: JobContext) -> None:
    """Returns normally with a transaction open on the worker's connection."""
    with ctx.unsafe_raw():
        _raw("BEGIN")
