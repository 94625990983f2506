"""The two statements every run costs: its start (with its tenant) and its finish.

They are the history's hot path, so they are written once as SQL instead of being compiled by
the ORM for every run, and every table in them is qualified with the public schema. That makes
them independent of the connection's ``search_path``, so they run on a cursor that skips
django-tenants' ``SET search_path``: between two runs the worker's connection would otherwise
switch to public and back for nothing. Every other statement still goes through django-tenants'
cursor, which sets the path again because the tenancy step has marked it stale.

Per run, this makes the history cost one statement at the start (the run's ``running`` row and
the run's tenant together) and one at the end (the attempt row and the run's outcome
together), each its own implicit transaction. The rarer paths around them (a message the start
did not take, a finish with more to write than its two rows) are ORM writes in ``transitions``,
which is the only caller of the writes here: the run side reaches the history's rows through it.
With ``DB_ROLES`` on, the start and the finish are sent as prepared statements (``prepared``).

The start always commits asynchronously (``set_config('synchronous_commit', 'off', true)``
inside the statement, so it applies to that one transaction and never to the job's own): it does
not wait for the WAL flush, which the run's next synchronous commit (the body's, or the finish)
does for it. With ``HISTORY_SYNCHRONOUS_COMMIT = False`` the finish does the same. Other
sessions see them at once; only a crash of the PostgreSQL server can lose the last fraction of a
second of them, and a run whose state was lost is delivered again by the relay (a lost start) or
handed back by the sweep (a lost finish), as after a worker crash. docs/reliability.md has the
details.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connection, connections
from django_tenants.postgresql_backend.base import DatabaseWrapper as TenantDatabaseWrapper
from django_tenants.utils import get_tenant_model

from ..core import conf, project_settings, session
from ..models import JobAttempt, JobFailure, JobRun, RunStatus
from . import prepared


@contextmanager
def public_cursor() -> Iterator[Any]:
    """``connection.cursor()`` as Django makes it (health check, execute wrappers, error
    translation, query logging), minus the ``SET search_path`` django-tenants adds to it.

    Only for statements whose every table is schema-qualified; anything else must use
    ``connection.cursor()``. (A project's own subclass of django-tenants' wrapper is bypassed
    here too; its ``_cursor`` additions do not apply to these two statements.)
    """
    wrapper = connections[DEFAULT_DB_ALIAS]  # ``connection`` is only a proxy to it
    if isinstance(wrapper, TenantDatabaseWrapper):
        cursor = super(TenantDatabaseWrapper, wrapper)._cursor()
    else:  # not django-tenants' backend (the system checks say so): nothing to skip
        cursor = wrapper.cursor()
    try:
        yield cursor
    finally:
        cursor.close()


def _qualified(table: str) -> str:
    qn = connection.ops.quote_name
    return f"{qn(project_settings.public_schema_name())}.{qn(table)}"


@dataclass(frozen=True, slots=True)
class _TenantColumns:
    names: tuple[str, ...]  # attnames, in the model's concrete field order
    sql: str  # the SELECT list, qualified with the alias "tenant"
    converters: tuple[tuple[int, tuple[Callable[..., Any], ...], Any], ...]


@functools.cache
def _tenant_columns() -> _TenantColumns:
    """The tenant model's columns, and the converters the ORM would apply to them.

    Every concrete field is loaded, as ``Tenant.objects.get()`` would: jobs read
    ``ctx.tenant``, and a deferred field would cost a query inside the guarded job.
    """
    model = get_tenant_model()
    qn = connection.ops.quote_name
    fields = model._meta.concrete_fields
    converters = []
    for index, field in enumerate(fields):
        col = field.get_col("tenant")
        found = tuple(connection.ops.get_db_converters(col) + col.get_db_converters(connection))
        if found:
            converters.append((index, found, col))
    return _TenantColumns(
        names=tuple(field.attname for field in fields),
        sql=", ".join(f"tenant.{qn(field.column)}" for field in fields),
        converters=tuple(converters),
    )


def _tenant_from(values: Sequence[Any]) -> Any:
    """The tenant instance for a row of ``_TenantColumns``, or None when the join found none."""
    columns = _tenant_columns()
    if values[0] is None:  # the primary key: nothing joined
        return None
    row = list(values)
    for index, converters, col in columns.converters:
        for convert in converters:
            row[index] = convert(row[index], col, connection)
    return get_tenant_model().from_db(connection.alias, list(columns.names), row)


def _schema_column() -> str:
    field: Any = get_tenant_model()._meta.get_field("schema_name")
    return connection.ops.quote_name(field.column)


_ASYNCHRONOUS = "(SELECT set_config('synchronous_commit', 'off', true))"


def _commit_mode() -> str:
    """A one-row FROM item that sets this transaction's commit mode (see the module's doc)."""
    if conf.get().HISTORY_SYNCHRONOUS_COMMIT:
        return "(SELECT 1)"
    return _ASYNCHRONOUS


@functools.cache
def _start_sql(commit_mode: str) -> str:
    qn = connection.ops.quote_name
    tenant_model = get_tenant_model()

    def col(name: str) -> str:
        field: Any = JobRun._meta.get_field(name)
        return qn(field.column)

    return (
        f"WITH started AS (UPDATE {_qualified(JobRun._meta.db_table)} SET "
        f"{col('status')} = %s, {col('attempts')} = %s, {col('started_at')} = %s, "
        f"{col('finished_at')} = NULL, {col('scheduled_for')} = NULL, "
        f"{col('defer_count')} = %s, {col('gate_defer_count')} = %s, {col('rq_job_id')} = %s, "
        f"{col('atomic_key')} = %s "
        # Only the message the run waits for (enqueueing.messages.pending_counters states the
        # same rule): a queued run waits for the attempt after its last, with its deferral
        # counts; a deferred one for the same attempt with one more deferral of either kind.
        f"WHERE {col('run_id')} = %s AND ("
        f"({col('status')} = %s AND {col('attempts')} + 1 = %s "
        f"AND {col('defer_count')} = %s AND {col('gate_defer_count')} = %s) OR "
        f"({col('status')} = %s AND GREATEST({col('attempts')}, 1) = %s AND ("
        f"({col('defer_count')} + 1 = %s AND {col('gate_defer_count')} = %s) OR "
        f"({col('defer_count')} = %s AND {col('gate_defer_count')} + 1 = %s)))"
        f") RETURNING {col('workflow_id')} AS workflow_id) "
        # The run's workflow (NULL for a plain run) rides along: its finish decides from it
        # whether a workflow moves on, without a statement for runs outside one.
        f"SELECT (SELECT count(*) FROM started), (SELECT workflow_id FROM started), "
        f"{_tenant_columns().sql} "
        f"FROM {commit_mode} AS one LEFT JOIN {_qualified(tenant_model._meta.db_table)} AS tenant "
        f"ON tenant.{_schema_column()} = %s"
    )


@dataclass(frozen=True, slots=True)
class Started:
    """What the start statement found: whether the run was marked ``running`` for this message, and
    the tenant it names, loaded in the same statement for the gates step.
    """

    updated: bool  # False: the run does not wait for this message (or its row is gone)
    tenant: Any  # the tenant whose schema_name the message names, or None
    workflow_id: uuid.UUID | None = None  # the workflow the run is a step of (docs/workflows.md)


def start(
    *,
    run_id: str,
    attempt: int,
    started_at: datetime,
    defers: int,
    gate_defers: int,
    rq_job_id: str,
    schema: str | None,
    atomic_key: str = "",
) -> Started:
    """Mark the run ``running`` if it waits for this message, and load its tenant, in one
    round trip.

    A run waits for exactly one message: a queued run after attempt n for attempt n + 1 (with
    the run's deferral counts), a deferred one for its attempt with one more deferral.
    Anything else is a duplicate or a stale delivery (say, attempt n delivered again after the
    run was queued for n + 1), and running it would repeat an attempt that already ran.

    The tenant is looked up by ``schema_name`` in the tenant table itself; a custom default
    manager's filters do not hide a tenant from its runs (``TENANT_ACTIVE_FIELD`` does).

    ``atomic_key`` (an ``atomic=True`` run's ``atomic_digest``, else ``""``) is written with the
    start, so the attempt's success can be recorded only by this delivery (``atomic_success``).
    """
    params = [
        RunStatus.RUNNING.value,
        attempt,
        started_at,
        defers,
        gate_defers,
        rq_job_id,
        atomic_key,
        uuid.UUID(run_id),
        RunStatus.QUEUED.value,
        attempt,
        defers,
        gate_defers,
        RunStatus.DEFERRED.value,
        attempt,
        defers,
        gate_defers,
        defers,
        gate_defers,
        schema,
    ]
    # Asynchronous whatever HISTORY_SYNCHRONOUS_COMMIT says: the next synchronous commit
    # anywhere on the server (the body's own, the finish's) flushes the WAL up to and past
    # it, and a start lost with the server's last fraction of a second leaves the run
    # queued for the relay to push again (docs/reliability.md, "A PostgreSQL crash and
    # asynchronous history commits"). It saves a WAL flush per run.
    row = prepared.execute(public_cursor, _start_sql(_ASYNCHRONOUS), params, fetch=True)
    return Started(updated=bool(row[0]), tenant=_tenant_from(row[2:]), workflow_id=row[1])


def find_tenant(schema: str) -> Any:
    """The tenant with this schema_name, or None: the same lookup as ``start`` makes."""
    tenant_table = _qualified(get_tenant_model()._meta.db_table)
    with public_cursor() as cursor:
        cursor.execute(
            f"SELECT {_tenant_columns().sql} FROM {tenant_table} AS tenant "
            f"WHERE tenant.{_schema_column()} = %s",
            [schema],
        )
        row = cursor.fetchone()
    return None if row is None else _tenant_from(row)


@dataclass(frozen=True, slots=True)
class _FinishStatement:
    sql: str
    attempt_fields: tuple[Any, ...]
    run_fields: tuple[Any, ...]


# What identifies a tenant-visible failure: one row per (tenant, job, subject).
_FAILURE_SUBJECT = ("schema_name", "job_name", "subject")


def _column(meta: Any, name: str) -> str:
    return str(meta.get_field(name).column)


def _typed(field: Any) -> str:
    """A placeholder cast to ``field``'s column type: in ``INSERT ... SELECT`` (the finish's
    attempt row) a value has no column to take its type from as it would in ``VALUES``. Text
    columns are cast to ``text`` (a cast to ``varchar(n)`` would cut a longer value silently;
    the column's own check still refuses it)."""
    if field.get_internal_type() in ("CharField", "TextField"):
        return "%s::text"
    return f"%s::{field.db_type(connection)}"


@functools.cache
def _finish_statement(
    attempt_names: tuple[str, ...],
    run_names: tuple[str, ...],
    commit_mode: str,
    clears_failure: bool = False,
) -> _FinishStatement:
    """The finish for these columns, built once per combination (a handful: the outcomes).

    Fenced: the run row is updated only while it still runs this attempt (``running``, its
    ``attempts``), and the attempt row and the failure's deletion happen only if it was. A
    finish that comes after the sweep handed the attempt back (its worker looked dead), an
    operator's cancellation ended it, or another delivery took the run over, writes nothing
    and says so (``SELECT count(*)``: 0), in the same one statement as before.
    """
    qn = connection.ops.quote_name
    a_meta, r_meta, f_meta = JobAttempt._meta, JobRun._meta, JobFailure._meta
    a_fields: tuple[Any, ...] = tuple(a_meta.get_field(name) for name in attempt_names)
    r_fields: tuple[Any, ...] = tuple(r_meta.get_field(name) for name in run_names)
    # A tenant's success clears that subject's failure (the unique index finds it, or not).
    cleared = (
        f", cleared AS (DELETE FROM {_qualified(f_meta.db_table)} WHERE "
        + " AND ".join(f"{qn(_column(f_meta, n))} = %s" for n in _FAILURE_SUBJECT)
        + " AND EXISTS (SELECT FROM run))"
        if clears_failure
        else ""
    )
    sql = (
        f"WITH run AS (UPDATE {_qualified(r_meta.db_table)} SET "
        f"{', '.join(f'{qn(f.column)} = %s' for f in r_fields)} "
        f"FROM {commit_mode} AS commit_mode "
        f"WHERE {qn(str(r_meta.pk.column))} = %s AND {qn(_column(r_meta, 'status'))} = %s "
        f"AND {qn(_column(r_meta, 'attempts'))} = %s RETURNING 1), "
        f"attempt AS (INSERT INTO {_qualified(a_meta.db_table)} "
        f"({', '.join(qn(f.column) for f in a_fields)}) "
        f"SELECT {', '.join(_typed(f) for f in a_fields)} FROM run){cleared} "
        f"SELECT count(*) FROM run"
    )
    return _FinishStatement(sql, a_fields, r_fields)


def finish(
    attempt: dict[str, Any],
    run_update: dict[str, Any],
    run_id: str,
    *,
    clear_failure: tuple[str, str, str] | None = None,
    expected: RunStatus = RunStatus.RUNNING,
) -> bool:
    """``WITH run AS (UPDATE ...), attempt AS (INSERT ...) SELECT ...``: both writes in one
    statement, only while the run is still ``attempt["number"]``'s with ``expected`` as its
    status (``running``; ``succeeded`` after an atomic success function that committed without
    the finish); False: it no longer was, and nothing was written (``_finish_statement``).

    ``clear_failure`` (schema, job, subject): a success also deletes that subject's
    tenant-visible failure, in the same statement (no round trip more), whichever way the
    failure was recorded (declared ``tenant_visible_failure`` or a ``TenantVisibleError``).
    """
    statement = _finish_statement(
        tuple(attempt), tuple(run_update), _commit_mode(), clear_failure is not None
    )
    params: list[Any] = [
        f.get_db_prep_save(run_update[f.name], connection) for f in statement.run_fields
    ]
    params += [uuid.UUID(run_id), expected.value, attempt["number"]]
    params += [f.get_db_prep_save(attempt[f.name], connection) for f in statement.attempt_fields]
    params += list(clear_failure or ())
    row = prepared.execute(public_cursor, statement.sql, params, fetch=True)
    return bool(row[0])


def write_progress(
    conn: Any, run_id: str, attempt: int, fraction: float | None, message: str
) -> None:
    """A running run's progress (``run/progress``: at most every ``PROGRESS_INTERVAL`` s), on
    ``conn``, the project's connection, in its own implicit transaction; only while the row
    still runs this attempt."""
    qn = connection.ops.quote_name
    with session.plain_cursor(conn) as cursor:
        cursor.execute(
            f"UPDATE {_qualified(JobRun._meta.db_table)} SET {qn('progress')} = %s, "
            f"{qn('progress_message')} = %s "
            f"WHERE {qn('run_id')} = %s AND {qn('status')} = %s AND {qn('attempts')} = %s",
            [fraction, message, uuid.UUID(run_id), RunStatus.RUNNING.value, attempt],
        )
