"""Unique jobs: ``@job(unique=("invoice_id",), unique_for=...)``.

An enqueue whose key (the job, the tenant and the values of the unique arguments) matches a
queued, deferred or running run returns that run's handle instead of making a new run; with
``unique_for``, so does one that matches a run which succeeded or failed less than that long ago.
A cancelled run does not count: an operator stopped it, so the next enqueue is new work.

Settled in PostgreSQL, not by a lookup alone: every unique job's row carries its key
(``JobRun.unique_key``) and a partial unique index over the active statuses
(``kj_run_unique_active``, migration 0015) refuses a second active row of the same key. Two
concurrent enqueues therefore cannot both insert: the second INSERT waits for the first
transaction and fails once it commits, and the second enqueue then returns the first run. The
index holds whatever writes the row (an enqueue, a follow-up written at the end of its parent's
attempt, a fan-out child), so it holds across the outbox, the relay and every worker.

Unlike ``concurrency="skip"``, which refuses any second run of the job in the tenant and records
the refusal as a ``skipped`` run, a unique job refuses only the same arguments, records nothing,
and hands back the run that covers the work, so the caller can follow it.
"""

from __future__ import annotations

import hashlib
import inspect
import json
from datetime import timedelta
from typing import Any

from django.db import IntegrityError
from django.utils import timezone

from ..definition.job import JobDefinition
from ..models import JobRun, RunStatus

ACTIVE_INDEX = "kj_run_unique_active"
_ACTIVE = (RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.DEFERRED)
_FINISHED_FOR_WINDOW = (RunStatus.SUCCEEDED, RunStatus.FAILED)


def key_of(
    definition: JobDefinition, schema: str | None, kwargs: dict[str, Any], flow: str | None = None
) -> str | None:
    """The run's unique key, or None when the job is not unique.

    A system run a tenant's run started (``flow``: that tenant, ``Envelope.flow_schema``) has a
    key of that tenant's (``:<schema>``, which no schema name can be): held by that tenant's
    pause or caps, it must not stand for the same work enqueued by the system or another tenant.

    Arguments left to their defaults count with the default's value, so ``enqueue(x=1)`` and
    ``enqueue(x=1, force=False)`` of ``def job(ctx, *, x, force=False)`` are the same run. The
    values are already known to be JSON (``validate``); sorted keys make the text canonical.
    """
    if definition.unique is None:
        return None
    bound = inspect.signature(definition.func).bind(None, **kwargs)
    bound.apply_defaults()
    values = {name: bound.arguments.get(name) for name in definition.unique}
    text = json.dumps(
        [definition.name, schema or (f":{flow}" if flow else ""), values],
        sort_keys=True,
        separators=(",", ":"),
    )
    return hashlib.sha256(text.encode()).hexdigest()


def covering_run(definition: JobDefinition, key: str) -> JobRun | None:
    """The run that already covers ``key``: an active one, else (with ``unique_for``) the
    latest that finished inside the window. One index read each (the two partial indexes)."""
    active = JobRun.objects.filter(unique_key=key, status__in=_ACTIVE).first()
    if active is not None or not definition.unique_for:
        return active
    since = timezone.now() - timedelta(seconds=definition.unique_for)
    return (
        JobRun.objects.filter(
            unique_key=key, status__in=_FINISHED_FOR_WINDOW, finished_at__gte=since
        )
        .order_by("-finished_at")
        .first()
    )


def is_duplicate(error: IntegrityError) -> bool:
    """Did this INSERT fail on the active-key index (and not on some other constraint)?"""
    diag = getattr(error.__cause__, "diag", None)
    return getattr(diag, "constraint_name", None) == ACTIVE_INDEX
