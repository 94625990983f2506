"""Loading a run by its id, for whoever asks: in the caller's tenant only.

A run id travels (a URL, a form field, a ``TaskResult.id``, a ``RunHandle`` kept in a cache),
so holding one proves nothing. ``RunHandle.refresh()`` and the task backend's ``get_result()``
load runs through here, and from a tenant's context they see that tenant's runs only: another
tenant's id is answered as an id no run has ("does not exist"), which tells the caller nothing
about it. A tenant's context is a tenant run (its schema is taken from the run's signed
envelope, which the body cannot change) or, outside a run, a connection set to a tenant's
schema (a tenant's request, ``tenant_context()``, ``schema_context()``). Operators' code (the
public schema outside a run) and system runs read any run.

Inside a tenant run with ``DB_ROLES`` on, the body's connection is the tenant's own login,
which holds no privilege on kumiko's tables (docs/guard.md, "Two walls"): the read goes through
the project's connection that the body's swap set aside (``tenant_connections.project_identity``,
the route ``ctx.system_db()`` takes), with the tenant fixed here. Nothing is granted to the
tenant's role, so PostgreSQL still refuses the body's own reads of every run, its tenant's
included (docs/tasks.md, "Results by id").
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from typing import Any

from django.db import connection

from ..core import current, project_settings
from ..guard.roles import connections as tenant_connections
from ..guard.watch import current_watch
from ..models import JobAttempt, JobRun


def reader_schema() -> str | None:
    """The schema whose runs the caller may load; None: any run (operators, system runs).

    A tenant run's tenant comes from its envelope. A run whose envelope names no tenant (a
    system run, a fan-out) reads any run only while its connection is in the public schema
    too: the envelope is a context variable that the body could replace with one naming no
    tenant, and the body's connection is in its tenant's schema whatever the body sets in
    Python (a swap to the project's connection puts it back: ``tenant_connections``).
    """
    envelope = current.current_envelope.get()
    if envelope is not None and envelope.schema is not None:
        return envelope.schema
    public = project_settings.public_schema_name()
    schema = getattr(connection, "schema_name", public)
    return None if schema == public else str(schema)


def parse_id(run_id: Any) -> uuid.UUID | None:
    """The run id as a UUID (hex, dashed or a UUID), or None when it is not one."""
    if isinstance(run_id, uuid.UUID):
        return run_id
    try:
        return uuid.UUID(str(run_id))
    except ValueError:
        return None


@contextlib.contextmanager
def history_connection() -> Iterator[None]:
    """Kumiko's history readable on the default alias for the block: inside a run's body, the
    project's own connection (under DB_ROLES, in place of the tenant's login) with the guard
    stepped aside, as ``ctx.system_db()`` does. The classifier refuses kumiko's tables to the
    body's own SQL in both modes; only kumiko's code runs in this block, and it fixes the
    tenant itself (``reader_schema``). Outside a body: as it is."""
    watch = current_watch()
    if watch is None:
        yield
        return
    with tenant_connections.project_identity(watch), watch.stepped_aside():
        yield


def load_run(run_id: Any) -> JobRun | None:
    """The run with this id if the caller may see it (``reader_schema``), else None."""
    with history_connection():
        return _run(run_id)


def load_run_and_attempts(
    run_id: Any, *, with_traceback: bool
) -> tuple[JobRun | None, list[tuple[str, str, str, str, str]]]:
    """``load_run`` and, for a run found, ``(outcome, traceback, error_type, error_message,
    worker)`` of each of its attempts in order, in one switch of connection (a tenant run under
    DB_ROLES: one ``SET search_path`` for both); the traceback is ``""`` unless
    ``with_traceback``."""
    with history_connection():
        run = _run(run_id)
        return run, _attempts(run, with_traceback) if run is not None else []


def _run(run_id: Any) -> JobRun | None:
    pk = parse_id(run_id)
    if pk is None:
        return None
    runs = JobRun.objects.filter(pk=pk)
    schema = reader_schema()
    if schema is not None:
        runs = runs.filter(schema_name=schema)
    return runs.first()


def _attempts(run: JobRun, with_traceback: bool) -> list[tuple[str, str, str, str, str]]:
    columns = ["outcome", "error_type", "error_message", "worker"]
    if with_traceback:
        columns.insert(1, "traceback")
    rows = list(
        JobAttempt.objects.filter(run_id=run.pk)
        .order_by("number", "started_at")
        .values_list(*columns)
    )
    if with_traceback:
        return [(r[0], r[1], r[2], r[3], r[4]) for r in rows]
    return [(r[0], "", r[1], r[2], r[3]) for r in rows]
