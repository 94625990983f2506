"""The workflows' SQL: the counters that advance a workflow, in the finishing transaction.

Every change to a workflow's steps happens under its row's lock (``lock``, taken first by
every writer: the records step's finish, the reconciler, a cancellation), so two steps that
finish at once are counted one after the other and exactly one of them sees a dependent's
counter reach 0. A step leaves ``released`` once (``close``'s ``WHERE state = 'released'``):
a second finish of the same run (the reconciler after a crash, a redelivery) changes nothing.
The enqueue and release side (what a released step's run is) is ``enqueueing/workflows``.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import connection
from django.db.models import Q, QuerySet
from django.utils import timezone

from ..models import FINISHED_STATUSES, JobRun, RunStatus, StepState, Workflow, WorkflowStep
from .run_reads import reader_schema
from .transitions import REASON_LIMIT

_STEP = WorkflowStep._meta.db_table
_RUN = JobRun._meta.db_table
_WORKFLOW = Workflow._meta.db_table

# A run's final status -> the counter of its dependents it adds to.
_PRED_COLUMN = {
    StepState.SUCCEEDED: "preds_succeeded",
    StepState.FAILED: "preds_failed",
    StepState.CANCELLED: "preds_cancelled",
}


def step_state_of(status: str) -> StepState:
    """The final state of a step whose run ended ``status`` (a refusal counts as cancelled)."""
    if status == RunStatus.SUCCEEDED:
        return StepState.SUCCEEDED
    if status == RunStatus.FAILED:
        return StepState.FAILED
    return StepState.CANCELLED


@dataclass(frozen=True, slots=True)
class Closed:
    """A step that just reached its final state, and the keys of the steps waiting for it."""

    key: str
    dependents: list[str]
    state: StepState


@dataclass(frozen=True, slots=True)
class Ready:
    """A waiting step whose last predecessor just finished: to release or to skip."""

    id: int
    key: str
    job_name: str
    kwargs: dict[str, Any]
    dependents: list[str]
    always: bool
    preds_total: int
    preds_succeeded: int
    preds_failed: int
    preds_cancelled: int


def load(workflow_id: Any) -> Workflow | None:
    """The workflow, for a handle: from a tenant's context only that tenant's (another's is
    None, as an id no workflow has: ``run_reads.reader_schema``); operators read any."""
    rows = Workflow.objects.filter(pk=workflow_id)
    schema = reader_schema()
    if schema is not None:
        rows = rows.filter(schema_name=schema)
    return rows.first()


def ended_workflows(cutoff: Any) -> QuerySet[Workflow]:
    """Workflows that ended before ``cutoff`` (every step final), for retention: a running,
    waiting or still winding-down one is kept whatever its age."""
    return Workflow.objects.filter(
        # created_at comes first, so kj_wf_status (status, created_at) narrows the read.
        created_at__lt=cutoff,
        finished_at__lt=cutoff,
        steps_pending__lte=0,
        status__in=(RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED),
    )


def lock(workflow_id: uuid.UUID) -> Workflow | None:
    """The workflow's row, locked until the transaction ends (every writer takes it first)."""
    return Workflow.objects.select_for_update().filter(pk=workflow_id).first()


def lock_for_caller(workflow_id: uuid.UUID) -> Workflow | None:
    """``lock``, for a caller's act on the workflow (a cancel): from a tenant's context only
    that tenant's (another's is None, as an id no workflow has), as ``load`` reads."""
    rows = Workflow.objects.select_for_update().filter(pk=workflow_id)
    schema = reader_schema()
    if schema is not None:
        rows = rows.filter(schema_name=schema)
    return rows.first()


def close(
    workflow_id: uuid.UUID, run_id: uuid.UUID, state: StepState, reason: str
) -> Closed | None:
    """The step of ``run_id`` is final; None when it was already (closed once, ever)."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {_STEP} SET state = %s, reason = %s, finished_at = %s "
            f"WHERE workflow_id = %s AND run_id = %s AND state = %s RETURNING key, dependents",
            [state, reason[:REASON_LIMIT], timezone.now(), workflow_id, run_id, StepState.RELEASED],
        )
        row = cursor.fetchone()
    return None if row is None else Closed(row[0], _keys(row[1]), state)


def _keys(value: Any) -> list[str]:
    return list(json.loads(value) if isinstance(value, str) else value or [])


def count_down(workflow_id: uuid.UUID, keys: Sequence[str], state: StepState) -> list[Ready]:
    """One predecessor of each of ``keys`` reached ``state``: decrement their counters in one
    statement; the steps whose counter reached 0."""
    if not keys:
        return []
    column = _PRED_COLUMN[state]
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {_STEP} SET waiting_on = waiting_on - 1, {column} = {column} + 1 "
            f"WHERE workflow_id = %s AND key = ANY(%s) AND state = %s "
            f"RETURNING id, key, job_name, kwargs, dependents, always, waiting_on, preds_total, "
            f"preds_succeeded, preds_failed, preds_cancelled",
            [workflow_id, list(keys), StepState.WAITING],
        )
        rows = cursor.fetchall()
    return [
        Ready(r[0], r[1], r[2], _json(r[3]), _keys(r[4]), r[5], r[7], r[8], r[9], r[10])
        for r in rows
        if r[6] == 0
    ]


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def mark_released(pairs: Iterable[tuple[int, uuid.UUID]]) -> None:
    """These steps' runs exist now (the rows written in the same transaction)."""
    pairs = list(pairs)
    if not pairs:
        return
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {_STEP} AS s SET state = %s, run_id = v.run_id "
            f"FROM unnest(%s::bigint[], %s::uuid[]) AS v(id, run_id) WHERE s.id = v.id",
            [StepState.RELEASED, [p[0] for p in pairs], [p[1] for p in pairs]],
        )


def mark_skipped(ids: Sequence[int], reason: str) -> None:
    """Steps that never run: cancelled, with why."""
    if ids:
        WorkflowStep.objects.filter(pk__in=list(ids)).update(
            state=StepState.CANCELLED, reason=reason[:REASON_LIMIT], finished_at=timezone.now()
        )


def count_final(workflow_id: uuid.UUID, final: int, failed: int) -> tuple[int, int]:
    """``final`` more steps are final, ``failed`` of them did not succeed; the steps left, and
    the steps that did not succeed in all."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {_WORKFLOW} SET steps_pending = steps_pending - %s, "
            f"steps_failed = steps_failed + %s WHERE workflow_id = %s "
            f"RETURNING steps_pending, steps_failed",
            [final, failed, workflow_id],
        )
        row = cursor.fetchone()
    return (int(row[0]), int(row[1])) if row else (0, 0)


def end(workflow: Workflow, status: str, reason: str = "") -> None:
    """The workflow's status (finished when every step is final; cancelled at once)."""
    fields: dict[str, Any] = {"status": status}
    if reason:
        fields["reason"] = reason[:REASON_LIMIT]
    if status != RunStatus.RUNNING:
        fields["finished_at"] = timezone.now()
    Workflow.objects.filter(pk=workflow.pk).update(**fields)
    workflow.status = status


def cancel_waiting(workflow_id: uuid.UUID, reason: str) -> int:
    """Every step still waiting for its predecessors is cancelled; how many."""
    return WorkflowStep.objects.filter(workflow_id=workflow_id, state=StepState.WAITING).update(
        state=StepState.CANCELLED, reason=reason[:REASON_LIMIT], finished_at=timezone.now()
    )


def cancel_queued_runs(workflow_id: uuid.UUID, reason: str) -> int:
    """The released steps whose runs have not started: the runs and the steps cancelled (a
    message still in Redis is dropped by the records step); how many."""
    now = timezone.now()
    with connection.cursor() as cursor:
        cursor.execute(
            f"WITH runs AS (UPDATE {_RUN} AS r SET status = %s, finished_at = %s, "
            f"scheduled_for = NULL, error_message = %s FROM {_STEP} AS s "
            f"WHERE s.workflow_id = %s AND s.state = %s AND r.run_id = s.run_id "
            f"AND r.status IN (%s, %s) RETURNING r.run_id) "
            f"UPDATE {_STEP} AS s SET state = %s, reason = %s, finished_at = %s "
            f"FROM runs WHERE s.run_id = runs.run_id",
            [
                RunStatus.CANCELLED,
                now,
                reason[:REASON_LIMIT],
                workflow_id,
                StepState.RELEASED,
                RunStatus.QUEUED,
                RunStatus.DEFERRED,
                StepState.CANCELLED,
                reason[:REASON_LIMIT],
                now,
            ],
        )
        return int(cursor.rowcount)


def running_runs(workflow_id: uuid.UUID) -> list[uuid.UUID]:
    """The runs of released steps that are running now (a cancellation asks them to stop)."""
    released = WorkflowStep.objects.filter(
        workflow_id=workflow_id, state=StepState.RELEASED
    ).values("run_id")
    return list(
        JobRun.objects.filter(run_id__in=released, status=RunStatus.RUNNING).values_list(
            "run_id", flat=True
        )
    )


def predecessor_results(workflow_id: uuid.UUID, key: str) -> list[tuple[str, str, Any]]:
    """(key, state, result) of the steps ``key`` waits for (only for a job that asks for them:
    ``workflow_results``)."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT s.key, s.state, r.result FROM {_STEP} AS s "
            f"LEFT JOIN {_RUN} AS r ON r.run_id = s.run_id "
            f"WHERE s.workflow_id = %s AND s.dependents @> %s::jsonb ORDER BY s.id",
            [workflow_id, f'["{_quoted(key)}"]'],
        )
        return [(k, st, _json(res)) for k, st, res in cursor.fetchall()]


def step_results(workflow_id: uuid.UUID) -> tuple[str, list[tuple[str, str, Any]]]:
    """The workflow's tenant ("" for a system workflow) and (key, state, result) of each of
    its steps, in order (``ctx.workflow_results``: a system step's fan-in, with its grant);
    ``("", [])`` for an id no workflow has."""
    schema = Workflow.objects.filter(pk=workflow_id).values_list("schema_name", flat=True).first()
    if schema is None:
        return "", []
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT s.key, s.state, r.result FROM {_STEP} AS s "
            f"LEFT JOIN {_RUN} AS r ON r.run_id = s.run_id "
            f"WHERE s.workflow_id = %s ORDER BY s.id",
            [workflow_id],
        )
        return schema, [(k, st, _json(res)) for k, st, res in cursor.fetchall()]


def _quoted(key: str) -> str:
    return key.replace("\\", "\\\\").replace('"', '\\"')


def stranded(limit: int) -> list[tuple[uuid.UUID, uuid.UUID, str]]:
    """(workflow, run, run status) of released steps whose run is final but whose step is not:
    runs ended outside the records step's finish (cancelled while queued, failed by the sweep,
    a crash between an atomic body's commit and its finish). Read through the partial index of
    released steps, so the cost follows the steps in flight, not the history."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT s.workflow_id, s.run_id, r.status FROM {_STEP} AS s "
            f"JOIN {_RUN} AS r ON r.run_id = s.run_id "
            f"WHERE s.state = %s AND r.status IN ({', '.join(['%s'] * len(FINISHED_STATUSES))}) "
            f"ORDER BY s.id LIMIT %s",
            [StepState.RELEASED, *[str(s) for s in FINISHED_STATUSES], limit],
        )
        return [(w, r, st) for w, r, st in cursor.fetchall()]


def turn_lock(wf: Workflow) -> None:
    """Serialize the turns of a sequential workflow's name (and key) in a tenant (until the
    transaction ends): an enqueue deciding to wait and a finish looking for the next one never
    miss each other."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
            [f"kumiko_jobs.workflow:{wf.schema_name}:{wf.name}:{wf.sequence_key}"],
        )


def _sequential(wf: Workflow) -> QuerySet[Workflow]:
    return Workflow.objects.filter(
        name=wf.name, schema_name=wf.schema_name, sequence_key=wf.sequence_key, sequential=True
    )


def has_turn_taken(wf: Workflow, *, besides: uuid.UUID | None = None) -> bool:
    """A sequential workflow of ``wf``'s name, key and tenant is running, still winding down
    (cancelled with steps running) or, for an enqueue, waiting its turn."""
    active = Q(status=RunStatus.RUNNING) | Q(status=RunStatus.CANCELLED, steps_pending__gt=0)
    if besides is None:
        active |= Q(status=RunStatus.QUEUED)
    found = _sequential(wf).filter(active)
    if besides is not None:
        found = found.exclude(pk=besides)
    return found.exists()


def next_in_turn(wf: Workflow) -> Workflow | None:
    """The oldest sequential workflow of ``wf``'s name, key and tenant waiting its turn,
    locked."""
    return (
        _sequential(wf)
        .filter(status=RunStatus.QUEUED)
        .select_for_update()
        .order_by("created_at")
        .first()
    )


def roots(workflow_id: uuid.UUID, after: int, limit: int) -> list[Ready]:
    """Steps waiting for nothing that have no run yet (a queued workflow's first steps)."""
    rows = (
        WorkflowStep.objects.filter(
            workflow_id=workflow_id, state=StepState.WAITING, waiting_on=0, id__gt=after
        )
        .order_by("id")
        .values_list(
            "id",
            "key",
            "job_name",
            "kwargs",
            "dependents",
            "always",
            "preds_total",
            "preds_succeeded",
            "preds_failed",
            "preds_cancelled",
        )[:limit]
    )
    return [Ready(*row) for row in rows]
