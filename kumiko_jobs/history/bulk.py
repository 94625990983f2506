"""The rows of the operators' bulk retries and cancels: the list of runs an operation may act
on, and the batches' progress.

The list is taken once, in the database, when the operator confirms: one ``INSERT ... SELECT``
of the filter's runs queued up to the confirmation page's time, in queue order, ``LIMIT`` the
count that page showed. So an operation can never act on more runs than its operator
confirmed, whatever matches later (new failures, a filter that now catches more); a listed run
that no longer qualifies when its batch reaches it (retried meanwhile, finished, deleted by
retention) is skipped and counted. The batches (kumiko_jobs/bulk.py) claim the next runs of the
list under the operation row's lock, so two batches never act on the same run, and write each
run's outcome and the counters in the transaction that acted on it.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from django.db import connection
from django.db.models import F, QuerySet
from django.utils import timezone

from ..models import BulkItem, BulkKind, BulkOperation, BulkState, JobRun

_BY_MAX = BulkOperation._meta.get_field("requested_by").max_length or 150
_NOTE_MAX = BulkItem._meta.get_field("note").max_length or 200


class Outcome(StrEnum):
    """What a batch did with one listed run."""

    DONE = "done"  # retried, cancelled, or (a running run) asked to stop
    SKIPPED = "skipped"  # no longer qualifies: the reason is its note
    FAILED = "failed"  # qualified, and the retry could not be enqueued


@dataclass(frozen=True, slots=True)
class Result:
    """A listed run's outcome, and why (empty when there is nothing to say)."""

    item_id: int
    outcome: Outcome
    note: str = ""


def create(
    kind: BulkKind,
    runs: QuerySet[JobRun],
    *,
    query: str,
    confirmed: int,
    as_of: datetime,
    by: str,
    exclude_jobs: Sequence[str] = (),
) -> BulkOperation:
    """A new operation and its list: at most ``confirmed`` of ``runs``, those queued up to
    ``as_of``, oldest first. Call it inside the transaction that enqueues the first batch."""
    operation = BulkOperation.objects.create(
        kind=kind,
        requested_by=by[:_BY_MAX],
        requested_at=timezone.now(),
        filter_query=query,
        as_of=as_of,
        confirmed=confirmed,
    )
    chosen = (
        runs.filter(queued_at__lte=as_of)
        .exclude(job_name__in=list(exclude_jobs))
        .order_by("queued_at", "run_id")
        .values_list("run_id", flat=True)[:confirmed]
    )
    sql, params = chosen.query.sql_with_params()
    table = connection.ops.quote_name(BulkItem._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} (operation_id, run_id, outcome, note) "
            f"SELECT %s, chosen.run_id, '', '' FROM ({sql}) AS chosen(run_id)",
            [operation.pk, *params],
        )
        listed = max(cursor.rowcount, 0)
    operation.listed = listed
    if not listed:
        operation.state = BulkState.DONE
        operation.finished_at = timezone.now()
    operation.save(update_fields=["listed", "state", "finished_at"])
    return operation


def claim(operation_id: uuid.UUID | str, size: int) -> tuple[BulkOperation | None, list[BulkItem]]:
    """The operation, locked until the caller's transaction ends, and the next ``size`` runs of
    its list not reached yet; none when it is stopped or done (or gone)."""
    operation = BulkOperation.objects.select_for_update().filter(pk=operation_id).first()
    if operation is None or operation.state != BulkState.RUNNING:
        return operation, []
    items = list(BulkItem.objects.filter(operation=operation, outcome="").order_by("id")[:size])
    return operation, items


def record(operation: BulkOperation, results: Sequence[Result]) -> bool:
    """Write the batch's outcomes and counters (the operation is locked by ``claim``); the
    operation is ``done`` once its list is through. True when runs are left for another batch."""
    by_id = {r.item_id: r for r in results}
    items = list(BulkItem.objects.filter(pk__in=list(by_id)))
    for item in items:
        item.outcome = by_id[item.pk].outcome
        item.note = by_id[item.pk].note[:_NOTE_MAX]
    BulkItem.objects.bulk_update(items, ["outcome", "note"])
    counts = Counter(r.outcome for r in results)
    reasons = Counter(operation.reasons)
    reasons.update(r.note for r in results if r.note)
    now = timezone.now()
    left = BulkItem.objects.filter(operation=operation, outcome="").exists()
    changes: dict[str, Any] = {
        "done": F("done") + counts[Outcome.DONE],
        "skipped": F("skipped") + counts[Outcome.SKIPPED],
        "failed": F("failed") + counts[Outcome.FAILED],
        "batches": F("batches") + 1,
        "reasons": dict(reasons),
        "progressed_at": now,
    }
    if not left:
        changes.update(state=BulkState.DONE, finished_at=now)
    BulkOperation.objects.filter(pk=operation.pk).update(**changes)
    return left


def finish_if_through(operation: BulkOperation) -> None:
    """A running operation whose list has no run left is done (a batch found nothing to do)."""
    if operation.state == BulkState.RUNNING:
        BulkOperation.objects.filter(pk=operation.pk, state=BulkState.RUNNING).update(
            state=BulkState.DONE, finished_at=timezone.now()
        )


def stop(operation_id: uuid.UUID | str, *, by: str) -> bool:
    """Stop a running operation: the batch under way finishes its runs, no further batch acts.
    False when it had already ended."""
    return bool(
        BulkOperation.objects.filter(pk=operation_id, state=BulkState.RUNNING).update(
            state=BulkState.STOPPED, finished_at=timezone.now(), stopped_by=by[:_BY_MAX]
        )
    )
