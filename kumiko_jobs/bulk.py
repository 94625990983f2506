"""Retry or cancel every run matching a filter, in bounded background batches.

An operator confirms a count on the admin's confirmation page; ``start`` lists at most that
many runs (history/bulk.py says how the list is bounded) and enqueues the first batch, a
system job of kumiko's own (``kumiko_jobs.bulk_batch``, jobs.py). Each batch acts on the next
``BATCH_SIZE`` runs of the list in one transaction, through the same ``operations.retry_run`` /
``cancel_run`` as the run list's actions (so a run already retried is skipped, a running one
is asked to stop through the running-cancel path), writes their outcomes, and enqueues the
next batch in that same transaction: a batch that fails rolls back whole and its retry
starts over where the last committed one ended; nothing is acted on twice.

Everything a batch enqueues is an ordinary enqueue (``followups.detached``), not a follow-up of
the batch's run: the retried runs belong to their tenants, and they must commit with the
batch's own transaction, not after the run ends.
"""

from __future__ import annotations

import logging
import uuid
from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import QuerySet
from django.utils.translation import gettext

from . import operations
from .core.exceptions import KumikoJobsError, OperationRefused
from .definition.registry import registry
from .enqueueing import followups
from .enqueueing.submit import submit
from .history import bulk as rows
from .history import transitions
from .history.bulk import Outcome, Result
from .models import BulkKind, BulkOperation, JobRun

logger = logging.getLogger("kumiko_jobs.bulk")

BATCH_JOB = "kumiko_jobs.bulk_batch"
# Runs one batch acts on: one transaction, about a second of work at a few hundred runs/s.
BATCH_SIZE = 500
# The most runs one operation may list: a confirmation of more is refused (narrow the filter).
MAX_RUNS = 100_000


def start(
    kind: BulkKind,
    runs: QuerySet[JobRun],
    *,
    query: str,
    confirmed: int,
    as_of: datetime,
    by: str,
) -> BulkOperation:
    """List at most ``confirmed`` of ``runs`` (queued up to ``as_of``) and enqueue the first
    batch, in one transaction. ``OperationRefused`` for a count outside 1..``MAX_RUNS``."""
    if not 1 <= confirmed <= MAX_RUNS:
        raise OperationRefused(
            f"A bulk operation acts on 1 to {MAX_RUNS} runs; {confirmed} were confirmed. "
            "Filter the run list to fewer runs.",
            reason=gettext("count out of range"),
        )
    with transaction.atomic():
        # The batches' own runs are never listed: cancelling one would stall its operation.
        operation = rows.create(
            kind,
            runs,
            query=query,
            confirmed=confirmed,
            as_of=as_of,
            by=by,
            exclude_jobs=(BATCH_JOB,),
        )
        if operation.listed:
            _enqueue_batch(operation.pk, by)
    logger.info(
        "bulk %s %s of %d runs (%d confirmed) by %s",
        kind,
        operation.pk,
        operation.listed,
        confirmed,
        by or "-",
    )
    return operation


def _enqueue_batch(operation_id: uuid.UUID, by: str) -> None:
    submit(
        registry.get(BATCH_JOB),
        None,
        {"operation_id": operation_id.hex},
        delay=0.0,
        trigger=f"bulk:{operation_id.hex}"[: transitions.TRIGGER_LIMIT],
    )


def run_batch(operation_id: str) -> bool:
    """One batch of the operation (the job's body): act on its next runs and record what became
    of each, enqueueing the next batch when runs are left. True when it did."""
    with followups.detached(), transaction.atomic():
        operation, items = rows.claim(operation_id, BATCH_SIZE)
        if operation is None:
            return False
        if not items:
            rows.finish_if_through(operation)
            return False
        found = {r.pk: r for r in JobRun.objects.filter(pk__in=[i.run_id for i in items])}
        results = []
        for item in items:
            run = found.get(item.run_id)
            if run is None:
                results.append(Result(item.pk, Outcome.SKIPPED, gettext("run no longer exists")))
                continue
            outcome, note = _act(BulkKind(operation.kind), run, operation.requested_by)
            results.append(Result(item.pk, outcome, note))
        more = rows.record(operation, results)
        if more:
            _enqueue_batch(operation.pk, operation.requested_by)
    return more


def _act(kind: BulkKind, run: JobRun, by: str) -> tuple[Outcome, str]:
    """One run, in a savepoint of the batch: a refusal skips this run only (``retry_run`` is a
    savepoint of its own: a second one around it would cost two statements a run for nothing)."""
    try:
        if kind == BulkKind.RETRY:
            operations.retry_run(run, by=by)
            return Outcome.DONE, ""
        with transaction.atomic():
            done = operations.cancel_run(run, by=by)
    except OperationRefused as exc:
        return Outcome.SKIPPED, str(exc.reason)
    except KumikoJobsError:
        return Outcome.FAILED, gettext("cannot be enqueued (tenant or arguments no longer valid)")
    if not done:
        return Outcome.SKIPPED, gettext("already finished")
    if done == operations.CANCEL_REQUESTED:
        return Outcome.DONE, gettext("running: asked to stop")
    return Outcome.DONE, ""


def stop(operation: BulkOperation, *, by: Any) -> bool:
    """Stop ``operation``: runs not reached yet stay as they are. False when it had ended."""
    who = operations.actor(by)
    stopped = rows.stop(operation.pk, by=who)
    if stopped:
        logger.info("bulk operation %s stopped by %s", operation.pk, who or "-")
    return stopped
