"""Admission: the job's concurrency options applied to an enqueue, atomically.

``concurrency="skip"``, ``"replace"``, ``"debounce"`` and ``max_per_tenant`` decide at enqueue
time whether a new run is admitted, counting the job's active runs under a row lock on kumiko's
``AdmissionLock`` table (one row per job and owner, held until the enqueuing transaction ends),
so two requests can never both see "no run queued". ``"sequential"`` and
``tenant_concurrency`` are not decided here: they hold messages back in RQ (``messages``'s
rate limit). ``concurrency_owner`` says, for both, whose runs count.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

from django.db import connection, transaction
from django.utils import timezone

from .. import signals
from ..core import project_settings
from ..core.db import ADMISSION_LOCK_TABLE
from ..definition.job import JobDefinition
from ..history import transitions
from ..models import AdmissionLock, JobRun, RunStatus


def concurrency_owner(definition: JobDefinition, schema: str | None) -> str | None:
    """Whose runs a job's concurrency options count: the run's tenant, or for a system job the
    system (its runs' ``schema_name`` is empty). None for a fan-out parent: its children are
    the runs of tenants, and ``sequential`` holds each of them back per tenant."""
    if schema is not None:
        return schema
    return "" if definition.system else None


_ACTIVE = (RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.DEFERRED)


def _lock_sql() -> str:
    """The lock: the key's row, inserted or updated (so locked) in one statement. Concurrent
    enqueues of the same key wait on the row (or on its uncommitted insert) until the holder's
    transaction ends. Qualified: the enqueuing connection may be in a tenant's search path."""
    qn = connection.ops.quote_name
    table = f"{qn(project_settings.public_schema_name())}.{qn(ADMISSION_LOCK_TABLE)}"
    key = qn(str(AdmissionLock._meta.get_field("key").column))
    return (
        f"INSERT INTO {table} ({key}) VALUES (%s) "
        f"ON CONFLICT ({key}) DO UPDATE SET {key} = EXCLUDED.{key}"
    )


@contextlib.contextmanager
def admission(
    definition: JobDefinition, schema: str | None, flow: str | None = None
) -> Iterator[RunStatus | None]:
    """Apply ``concurrency`` skip/replace/debounce and ``max_per_tenant`` atomically.

    Yields None when the run is admitted, else why not (``RunStatus.SKIPPED`` or ``CAPPED``).
    A row lock per (job, tenant) serialises concurrent enqueues of the same job for the same
    tenant until the enqueuing transaction commits, so two requests can never both see "no run
    queued" and both enqueue. A system job's tenant is the system: its
    runs (``schema_name`` empty) are counted under the same lock, keyed ``<job>:``, except the
    ones a tenant's run started (``flow_schema``), which count against that tenant: one of
    those (``flow``: an operator's retry) is admitted as its follow-up was, without them.
    """
    limited = definition.concurrency in ("skip", "replace", "debounce") or definition.max_per_tenant
    owner = concurrency_owner(definition, schema)
    if owner is None or not limited or flow:
        yield None
        return
    with transaction.atomic():
        with connection.cursor() as cursor:
            # A row lock on kumiko's own table, held until the enqueuing transaction ends: no
            # tenant login may take it (no privilege; the classifier refuses the table), unlike
            # the advisory lock it replaced, which a tenant session could hold on any key.
            cursor.execute(_lock_sql(), [f"kumiko_jobs:{definition.name}:{owner}"])
        # A system run a tenant's run started (``flow_schema``) is that tenant's, not the
        # system's: held by that tenant's pause or caps, it must not hold the system's own
        # enqueues and cron ticks of the job back (tenants' rows never have one).
        active = JobRun.objects.filter(
            job_name=definition.name, schema_name=owner, flow_schema="", status__in=_ACTIVE
        )
        if definition.concurrency == "skip" and active.exists():
            yield RunStatus.SKIPPED
            return
        if definition.max_per_tenant and active.count() >= definition.max_per_tenant:
            yield RunStatus.CAPPED
            return
        if definition.concurrency in ("replace", "debounce"):
            _replace_queued(definition, owner)
        yield None


def _replace_queued(definition: JobDefinition, schema: str) -> None:
    """Cancel the runs still waiting; their messages are dropped when they arrive."""
    waiting = list(
        JobRun.objects.filter(
            job_name=definition.name, schema_name=schema, flow_schema="", status=RunStatus.QUEUED
        ).values_list("pk", flat=True)
    )
    if not waiting:
        return
    transitions.replace_waiting(waiting, timezone.now())
    for run_id in waiting:
        transaction.on_commit(
            functools.partial(
                signals.send,
                signals.job_dropped,
                run_id=run_id.hex,
                job_name=definition.name,
                schema_name=schema or None,
                attempt=0,
                outcome="dropped",
                error=None,
                reason="replaced by a newer enqueue",
            ),
            robust=True,
        )
