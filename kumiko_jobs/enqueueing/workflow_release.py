"""A workflow moves on: a finished step's dependents released (or skipped), in the finish's
transaction; the reconciler for runs that ended elsewhere; cancelling a whole workflow.

``advance`` runs inside the transaction that records the step's run's final outcome (the
records step's finish), under the workflow row's lock (``history.workflows``). A released
step's run row is written there, ``queued``, and its message is pushed after the commit like a
follow-up's (``WorkflowLink.released``, pushed by the runner's dispatch): if the push fails,
the row is the outbox and the relay pushes it, as for any queued run. A run that ends without
the records step's finish (cancelled while queued, failed by the sweep) is found by
``reconcile``, which the workers' maintenance round calls; closing a step happens once, so the
two can never both advance it.
"""

from __future__ import annotations

import inspect
import json
import logging
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from django.db import transaction
from django.utils import timezone

from .. import transport
from ..core import conf
from ..core.envelope import Envelope
from ..core.exceptions import KumikoJobsError
from ..core.run_ids import new_run_id
from ..definition.registry import registry
from ..history import transitions
from ..history import workflows as sql
from ..models import JobRun, RunStatus, StepState, Workflow, WorkflowStep
from .fanout import insert_new
from .messages import message_for, row_for, waiting_envelope
from .validate import check_size, validated

logger = logging.getLogger("kumiko_jobs.workflows")

CHUNK = 500
# Keywords a job receives, when its function declares them, from the steps it waited for.
RESULTS_ARGUMENT = "workflow_results"
OUTCOMES_ARGUMENT = "workflow_outcomes"


@dataclass(slots=True)
class WorkflowLink:
    """A run's part in a workflow: which (from the start statement; None for a plain run), and
    the messages of the steps its finish released, pushed once that finish has committed."""

    workflow_id: uuid.UUID | None = None
    released: list[transport.Message] = field(default_factory=list)
    # The finish ended the workflow (its last step): handle.wait()'s signal is sent for it too.
    ended: bool = False


def advance(link: WorkflowLink, run_id: str, status: str) -> None:
    """The run ``run_id`` of ``link``'s workflow ended ``status`` (final): close its step and
    move the workflow on. In the caller's (the finish's) transaction."""
    if link.workflow_id is None:
        return
    wf = sql.lock(link.workflow_id)
    if wf is None:
        return
    closed = sql.close(wf.workflow_id, uuid.UUID(run_id), sql.step_state_of(status), "")
    if closed is not None:
        messages, link.ended = _settle(wf, [closed])
        link.released.extend(messages)


def _settle(wf: Workflow, closed: list[sql.Closed]) -> tuple[list[transport.Message], bool]:
    """Count ``closed`` down in their dependents, release or skip the ready ones (a skip is
    final too, and counts down further), stop the workflow on a failure if it asks, end it."""
    final, failed = len(closed), sum(c.state != StepState.SUCCEEDED for c in closed)
    # Returns the released steps' messages, and whether the workflow ended here.
    messages: list[transport.Message] = []
    todo = list(closed)
    while todo:
        done = todo.pop()
        ready = sql.count_down(wf.workflow_id, done.dependents, done.state)
        runs, skipped = _release(wf, ready)
        messages.extend(runs)
        for step, reason in skipped:
            sql.mark_skipped([step.id], reason)
            todo.append(sql.Closed(step.key, step.dependents, StepState.CANCELLED))
        final += len(skipped)
        failed += len(skipped)
    if failed and wf.stop_on_failure and wf.status == RunStatus.RUNNING:
        stopped = _stop(wf, "stop_on_failure: a step did not succeed")
        final += stopped
        failed += stopped
    ended = _end_if_done(wf, *sql.count_final(wf.workflow_id, final, failed))
    return messages, ended


def _end_if_done(wf: Workflow, pending: int, failed: int) -> bool:
    """The last step is final: the workflow ends (cancelled, failed, or succeeded), and a
    sequential one hands the turn to the next of its name and tenant. True when it ended."""
    if pending > 0:
        return False
    if wf.status == RunStatus.CANCELLED:
        sql.end(wf, RunStatus.CANCELLED)
    else:
        sql.end(wf, RunStatus.FAILED if failed else RunStatus.SUCCEEDED)
    if wf.sequential:
        _start_next(wf)
    return True


def _start_next(ended: Workflow) -> None:
    """Start the oldest workflow waiting for this turn, if no other holds it: its first steps'
    runs are written here, chunk by chunk, and pushed from their rows after the commit."""
    sql.turn_lock(ended)
    if sql.has_turn_taken(ended, besides=ended.workflow_id):
        return
    nxt = sql.next_in_turn(ended)
    if nxt is None:
        return
    sql.end(nxt, RunStatus.RUNNING)
    last = 0
    while chunk := sql.roots(nxt.workflow_id, last, CHUNK):
        last = chunk[-1].id
        _, skipped = _release(nxt, chunk)
        for step, reason in skipped:
            sql.mark_skipped([step.id], reason)
        if skipped:
            _settle(nxt, [sql.Closed(s.key, s.dependents, StepState.CANCELLED) for s, _ in skipped])
    workflow_id = nxt.workflow_id
    transaction.on_commit(lambda: push_released(workflow_id), robust=True)


def _release(
    wf: Workflow, ready: list[sql.Ready]
) -> tuple[list[transport.Message], list[tuple[sql.Ready, str]]]:
    """Runs for the ready steps that may run; the others, with the reason they are skipped."""
    skipped: list[tuple[sql.Ready, str]] = []
    rows: list[JobRun] = []
    messages: list[transport.Message] = []
    pairs: list[tuple[int, uuid.UUID]] = []
    for step in ready:
        reason = _skip_reason(wf, step)
        if reason is None:
            try:
                message, row = _run_of(wf, step)
            except KumikoJobsError as exc:
                reason = f"not started: {exc}"
            else:
                rows.append(row)
                messages.append(message)
                pairs.append((step.id, row.run_id))
                continue
        skipped.append((step, reason))
    insert_new(rows)
    sql.mark_released(pairs)
    return messages, skipped


def _skip_reason(wf: Workflow, step: sql.Ready) -> str | None:
    if wf.status != RunStatus.RUNNING:
        return f"skipped: the workflow was {wf.status}"
    if step.always:
        return None
    missed = step.preds_failed + step.preds_cancelled
    if missed:
        return f"skipped: {missed} of the {step.preds_total} steps it waits for did not succeed"
    return None


def _run_of(wf: Workflow, step: sql.Ready) -> tuple[transport.Message, JobRun]:
    definition = registry.get(step.job_name)
    kwargs = dict(step.kwargs)
    accepts = inspect.signature(definition.func).parameters
    if OUTCOMES_ARGUMENT in accepts:
        kwargs[OUTCOMES_ARGUMENT] = {
            "total": step.preds_total,
            "succeeded": step.preds_succeeded,
            "failed": step.preds_failed,
            "cancelled": step.preds_cancelled,
        }
    if RESULTS_ARGUMENT in accepts:
        kwargs[RESULTS_ARGUMENT] = _results(wf.workflow_id, step.key)
    schema = wf.schema_name or None
    env = Envelope(
        job=definition.name,
        schema=schema,
        kwargs=kwargs,
        run_id=new_run_id(),
        correlation_id=wf.correlation_id,
        trigger=f"workflow:{wf.name}",
    )
    message = message_for(definition, env, 0.0)
    check_size(definition, env, message)
    row = row_for(definition, env, validated(definition, kwargs), 0.0)
    row.workflow_id = wf.workflow_id
    return message, row


def _results(workflow_id: uuid.UUID, key: str) -> dict[str, Any]:
    """The results of the steps ``key`` waits for (None for one that did not succeed), at most
    ``MAX_RESULT_BYTES`` in all: over that, a marker saying so instead."""
    return bounded_results(sql.predecessor_results(workflow_id, key))


def bounded_results(rows: Iterable[tuple[str, str, Any]]) -> dict[str, Any]:
    """``{key: result}`` of ``(key, state, result)`` rows (None for a step that did not
    succeed), at most ``MAX_RESULT_BYTES`` in all: over that, a marker saying so instead."""
    limit = conf.get().MAX_RESULT_BYTES
    results: dict[str, Any] = {}
    size = 2
    for pred, state, result in rows:
        value = result if state == StepState.SUCCEEDED else None
        size += len(json.dumps(pred)) + len(json.dumps(value)) + 2
        if size > limit:
            return {"kumiko_results_not_kept": f"over MAX_RESULT_BYTES={limit}"}
        results[pred] = value
    return results


def _stop(wf: Workflow, reason: str) -> int:
    """Cancel what has not finished: waiting steps, runs not started; running runs are asked to
    stop (after commit). Returns the steps made final now."""
    sql.end(wf, RunStatus.CANCELLED, reason)
    stopped = sql.cancel_waiting(wf.workflow_id, reason) + sql.cancel_queued_runs(
        wf.workflow_id, reason
    )
    running = [r.hex for r in sql.running_runs(wf.workflow_id)]
    if running:
        transaction.on_commit(lambda: _ask_to_stop(running), robust=True)
    return stopped


def _ask_to_stop(run_hexes: list[str]) -> None:
    """Ask running steps to stop, after the commit: their rows are written outside the
    workflow's lock, since a finishing step holds its run's row while it waits for that lock
    (the other order would deadlock with it)."""
    transitions.request_cancel(run_hexes, "workflow", timezone.now())
    settings = conf.get()
    ttl = settings.DEFAULT_TIMEOUT + settings.TIMEOUT_KILL_AFTER + 2 * settings.WORKER_DEAD_AFTER
    redis = transport.connection_for(settings.DEFAULT_QUEUE)
    for run_hex in run_hexes:
        try:
            transport.request_cancel(redis, run_hex, "workflow", ttl)
        except Exception as exc:
            logger.error("could not send the cancellation of run %s: %r", run_hex, exc)


def cancel(workflow_id: uuid.UUID, *, by: Any = None) -> bool:
    """Cancel the workflow: every step that has not finished is cancelled (a running one is
    asked to stop, ``ctx.cancel_requested``); False when it had already finished, or is not
    the caller's to cancel: from a tenant's context (a tenant's request, its run's body)
    another tenant's workflow, or a system one, is answered as an unknown id."""
    who = getattr(by, "get_username", lambda: str(by or ""))()
    with transaction.atomic():
        wf = sql.lock_for_caller(workflow_id)
        if wf is None or wf.status not in (RunStatus.RUNNING, RunStatus.QUEUED):
            return False
        stopped = _stop(wf, f"cancelled by {who}" if who else "cancelled")
        ended = _end_if_done(wf, *sql.count_final(workflow_id, stopped, stopped))
    if ended:
        transaction.on_commit(lambda: _signal_done(workflow_id), robust=True)
    return True


def reconcile(limit: int = 500) -> int:
    """Advance the workflows whose steps' runs ended outside the records step's finish; how
    many steps were closed. Each in its own short transaction."""
    closed = 0
    for workflow_id, run_id, status in sql.stranded(limit):
        with transaction.atomic():
            wf = sql.lock(workflow_id)
            if wf is None:
                continue
            step = sql.close(workflow_id, run_id, sql.step_state_of(status), "")
            if step is None:
                continue
            messages, ended = _settle(wf, [step])
        closed += 1
        _push(messages)
        if ended:
            _signal_done(workflow_id)  # committed: the transaction above has ended
    return closed


def _signal_done(workflow_id: uuid.UUID) -> None:
    """The workflow ended outside a worker's finish (a cancel, the reconciler): wake its
    waiters (``handle.wait``) now, after the commit."""
    try:
        transport.signal_done(workflow_id.hex, conf.get().DEFAULT_QUEUE)
    except Exception as exc:
        logger.warning("workflow %s ended; its waiters not woken (%r)", workflow_id, exc)


def _push(messages: list[transport.Message]) -> None:
    try:
        transport.push_many(messages)
    except Exception as exc:
        logger.warning("released workflow steps not pushed (%r); the relay will push them", exc)


def push_released(workflow_id: uuid.UUID) -> None:
    """Push the messages of the workflow's queued runs, chunk by chunk, from their rows (an
    ``on_commit`` callback); what cannot be pushed waits in its row for the relay."""
    last = 0
    while True:
        chunk = list(
            WorkflowStep.objects.filter(
                workflow_id=workflow_id, state=StepState.RELEASED, id__gt=last
            )
            .order_by("id")
            .values_list("id", "run_id")[:CHUNK]
        )
        if not chunk:
            return
        last = chunk[-1][0]
        runs = {
            run.run_id: run
            for run in JobRun.objects.filter(
                run_id__in=[run for _, run in chunk], status=RunStatus.QUEUED, attempts=0
            )
        }
        # In the steps' order: the queue runs them first come, first served.
        messages = [
            message_for(registry.get(run.job_name), waiting_envelope(run), 0.0)
            for run in (runs.get(run_id) for _, run_id in chunk if run_id is not None)
            if run is not None
        ]
        try:
            transport.push_many(messages)
        except Exception as exc:
            logger.warning(
                "workflow %s: %d runs committed but not pushed (%r); the relay will push them",
                workflow_id,
                len(messages),
                exc,
            )
            return
