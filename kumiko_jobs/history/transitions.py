"""Every state change of a run or an attempt: the one module that writes their rows.

A run's row moves ``queued``/``deferred`` -> ``running`` -> an outcome, and each attempt leaves
one ``JobAttempt`` row; whoever moves it (the records step, the relay, the sweep, an operator's
cancel, a ``replace`` enqueue, a message for an unknown job) calls a function here, so the
conditions of each move and the bounds of each column are written once. The start, the finish
and the progress update are SQL text in ``run_sql``, an atomic run's success in ``atomic_sql``:
only this module calls those writes, and exports them, so the run side has one door to them.

Writes that are not a state change live beside their data: a new run's row is the enqueue's
(``enqueueing``: ``outbox.save``, ``fanout.insert_new``, ``bulk_rows``, cron ticks, boot jobs),
erasure is retention's (``retention``), and a workflow's cancel moves its queued runs in the
statement that cancels their steps (``workflows.cancel_queued_runs``).
``tests/unit/test_layers.py`` keeps every other module from writing these rows.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections, transaction
from django.utils import timezone

from ..core import session
from ..models import WAITING_STATUSES, JobAttempt, JobFailure, JobRun, RunStatus
from ..origin import ORIGIN_PATH_LIMIT
from .atomic_sql import atomic_success
from .columns import (
    CANCEL_BY_LIMIT,
    ERROR_MESSAGE_LIMIT,
    ERROR_TYPE_LIMIT,
    PAUSED_BY_LIMIT,
    REASON_LIMIT,
    TRACEBACK_LIMIT,
    TRIGGER_LIMIT,
    AttemptEnd,
    attempt_columns,
    clip_message,
    clip_type,
    run_columns,
)
from .run_sql import Started, finish, start, write_progress

__all__ = [
    "CANCEL_BY_LIMIT",
    "ERROR_MESSAGE_LIMIT",
    "ERROR_TYPE_LIMIT",
    "ORIGIN_PATH_LIMIT",
    "PAUSED_BY_LIMIT",
    "REASON_LIMIT",
    "TRACEBACK_LIMIT",
    "TRIGGER_LIMIT",
    "AttemptEnd",
    "Started",
    "atomic_success",
    "attempt_columns",
    "attempt_recorded",
    "cancel_abandoned",
    "cancel_waiting",
    "clear_failure",
    "committed_success",
    "end_stray_transaction",
    "fail_closed",
    "finish",
    "finish_attempt",
    "finish_in_transaction",
    "hand_back",
    "record_failure",
    "replace_waiting",
    "request_cancel",
    "run_columns",
    "run_row",
    "start",
    "take_over",
    "write_if_still_running",
    "write_progress",
]


# --- start -----------------------------------------------------------------------------------


def run_row(run_id: str) -> tuple[str, int] | None:
    """The run's status and attempts, read when ``start`` did not take the message (None: the
    run has no row)."""
    row = JobRun.objects.filter(pk=run_id).values("status", "attempts").first()
    return None if row is None else (row["status"], row["attempts"])


def take_over(run_id: str, attempt: int, started_at: datetime, atomic_key: str = "") -> None:
    """The run is ``running`` an earlier attempt whose worker died after scheduling this one:
    it runs ``attempt`` from now on (with this delivery's ``atomic_key``, as ``start``)."""
    JobRun.objects.filter(pk=run_id).update(
        attempts=attempt, started_at=started_at, atomic_key=atomic_key
    )


# --- finish ----------------------------------------------------------------------------------


def finish_attempt(
    end: AttemptEnd,
    *,
    clear_failure: tuple[str, str, str] | None = None,
    also: Callable[[], None] | None = None,
    expected: RunStatus = RunStatus.RUNNING,
) -> bool:
    """Write ``end``: one statement (``finish``; ``clear_failure`` deletes that subject's
    tenant-visible failure in it), or, with ``also`` (the run's other writes), one transaction
    (``finish_in_transaction``). Either only while the row is still this attempt's, with
    ``expected`` as its status (``running``; ``succeeded`` for an atomic attempt whose success
    function committed without the finish): False when it no longer was (handed back by the
    sweep, cancelled, taken over), and then nothing of it, ``also`` included, was written."""
    attempt, run = attempt_columns(end), run_columns(end)
    if also is None:
        return finish(attempt, run, end.run_id, clear_failure=clear_failure, expected=expected)
    return finish_in_transaction(attempt, run, end.run_id, also, expected)


class _NoLongerRunning(Exception):
    """Rolls ``finish_in_transaction``'s transaction back: the attempt is not the run's now."""


def finish_in_transaction(
    attempt: dict[str, Any],
    run_update: dict[str, Any],
    run_id: str,
    also: Callable[[], None],
    expected: RunStatus = RunStatus.RUNNING,
) -> bool:
    """``finish``'s two writes through the ORM, and ``also`` (the run's other writes: the
    tenant's failure, escape-hatch uses, follow-ups), in one transaction, fenced as ``finish``
    is: the run row first, only while it is this attempt's with ``expected`` as its status (the
    UPDATE waits for a sweep that holds the row's lock, then reads the row it left); False, and
    nothing written, if not."""
    try:
        with transaction.atomic():
            updated = JobRun.objects.filter(
                pk=run_id, status=expected, attempts=attempt["number"]
            ).update(**run_update)
            if not updated:
                raise _NoLongerRunning
            JobAttempt.objects.create(
                **{("run_id" if k == "run" else k): v for k, v in attempt.items()}
            )
            also()
    except _NoLongerRunning:
        return False
    return True


def write_if_still_running(run_id: str, attempt: int, write: Callable[[], object]) -> bool:
    """``write()`` in a transaction that first locks the run's row, if it still runs
    ``attempt`` (as the sweep claims a run: whoever locks it first decides); False if not.

    For a finish whose connection was lost: it committed or not, and the row says which
    (run.steps.finish_retries.write_finish).
    """
    with transaction.atomic():
        running = (
            JobRun.objects.filter(pk=run_id, status=RunStatus.RUNNING, attempts=attempt)
            .select_for_update()
            .values_list("pk", flat=True)
            .first()
            is not None
        )
        if running:
            write()
    return running


def attempt_recorded(run_id: str, attempt: int, finished_at: datetime) -> bool:
    """Whether this attempt's own finish is written: its attempt row, by the ``finished_at`` it
    carried (an attempt row the sweep wrote for it, handing it back, has another)."""
    rows = JobAttempt.objects.filter(run_id=uuid.UUID(run_id), number=attempt)
    return rows.filter(finished_at=finished_at).exists()


def committed_success(run_id: str, attempt: int) -> bool:
    """Whether the run's row says ``attempt`` succeeded: asked for an atomic attempt whose
    COMMIT's reply was lost (run.steps.records._settle_in_doubt). The row is locked as the sweep
    claims it, so a COMMIT still in flight on the server (its success function holds that lock)
    has ended, one way or the other, before the answer is read."""
    with transaction.atomic():
        row = JobRun.objects.filter(pk=run_id).select_for_update()
        found = row.values_list("status", "attempts").first()
    return found == (RunStatus.SUCCEEDED, attempt)


def end_stray_transaction() -> bool:
    """Roll back a transaction left open on the history's connection; True if there was one.

    The tenancy step already ends what a job leaves open (and fails the run); this is the
    history's own guarantee, for pipelines without that step: a run's outcome must commit,
    never join a transaction that nobody will commit. A transaction Django knows of (an inline
    run inside a caller's ``atomic()``) is the caller's, and left alone. The check is
    client-side: no round trip.
    """

    wrapper = connections[DEFAULT_DB_ALIAS]
    if wrapper.in_atomic_block or not session.in_transaction(wrapper):
        return False
    session.roll_back(wrapper)
    return True


def record_failure(
    schema: str, job: str, subject: str, message_key: str, failed_at: datetime, run_id: str
) -> None:
    """The tenant-visible failure of (tenant, job, subject): one row, the latest failure's."""
    JobFailure.objects.bulk_create(
        [
            JobFailure(
                schema_name=schema,
                job_name=job,
                subject=subject,
                message_key=message_key,
                failed_at=failed_at,
                run_id=uuid.UUID(run_id),
            )
        ],
        update_conflicts=True,
        unique_fields=("schema_name", "job_name", "subject"),
        update_fields=("message_key", "failed_at", "run_id"),
    )


def clear_failure(schema: str, job: str, subject: str) -> None:
    """A success clears that subject's tenant-visible failure (the finish statement does the
    same in the one-statement case: ``run_sql.finish``'s ``clear_failure``)."""
    JobFailure.objects.filter(schema_name=schema, job_name=job, subject=subject).delete()


# --- failed closed, cancelled, replaced ------------------------------------------------------


def fail_closed(run_id: Any, error_type: str, reason: str, *, attempts: int | None = None) -> bool:
    """The run fails without running: its message can never run (a job this worker does not
    know, a message no worker would accept). ``attempts``: the attempt the message was for
    (a worker's refusal; the relay's leaves the count). False: the run has no row."""
    columns: dict[str, Any] = {
        "status": RunStatus.FAILED,
        "finished_at": timezone.now(),
        "error_type": clip_type(error_type),
        "error_message": clip_message(reason),
    }
    if attempts is not None:
        columns["attempts"] = attempts
    return bool(JobRun.objects.filter(pk=run_id).update(**columns))


def cancel_waiting(run_id: Any, who: str, now: datetime) -> bool:
    """Cancel the run if it is still waiting (``queued`` or ``deferred``): one conditional
    UPDATE, so whichever of this and a worker's start commits first wins (the message left in
    Redis is dropped by the records step). False: it was not waiting."""
    return bool(
        JobRun.objects.filter(pk=run_id, status__in=WAITING_STATUSES).update(
            status=RunStatus.CANCELLED,
            finished_at=now,
            scheduled_for=None,
            error_type="",
            error_message=f"Cancelled by {who}." if who else "Cancelled by an operator.",
            cancel_requested_at=now,
            cancel_requested_by=who[:CANCEL_BY_LIMIT],
        )
    )


def request_cancel(run_ids: Sequence[Any], who: str, now: datetime) -> int:
    """Ask the running runs among ``run_ids`` to stop: who and when on the row (the worker
    also reads a Redis flag). The first request's time and author stand."""
    return JobRun.objects.filter(
        run_id__in=run_ids, status=RunStatus.RUNNING, cancel_requested_at__isnull=True
    ).update(cancel_requested_at=now, cancel_requested_by=who[:CANCEL_BY_LIMIT])


def replace_waiting(run_ids: Sequence[Any], now: datetime) -> int:
    """A ``replace``/``debounce`` enqueue cancels the runs of its job and tenant still queued;
    their messages are dropped when they arrive."""
    return JobRun.objects.filter(pk__in=run_ids, status=RunStatus.QUEUED).update(
        status=RunStatus.CANCELLED,
        finished_at=now,
        error_message="replaced by a newer enqueue",
    )


# --- handed back by the sweep (or a worker's watchdog) ---------------------------------------


def _abandoned_attempt(
    run: JobRun, outcome: str, error_type: str, message: str, now: datetime
) -> None:
    JobAttempt.objects.create(
        run=run,
        number=run.attempts,
        started_at=run.started_at or now,
        finished_at=now,
        duration_ms=0,
        outcome=outcome,
        error_type=clip_type(error_type),
        error_message=message,
    )


def hand_back(
    run: JobRun,
    *,
    outcome: str,
    error_type: str,
    reason: str,
    now: datetime,
    retry_at: datetime | None,
) -> None:
    """The claimed (locked) ``running`` run's attempt ended without its worker recording it:
    its attempt row, then the run ``queued`` again until ``retry_at`` (when the relay may
    check), or ``failed`` (``retry_at`` None). ``run`` is updated in place."""
    _abandoned_attempt(run, outcome, error_type, clip_message(reason), now)
    run.error_type, run.error_message = clip_type(error_type), clip_message(reason)
    if retry_at is not None:
        run.status = RunStatus.QUEUED
        run.scheduled_for = retry_at
        run.save(update_fields=["status", "scheduled_for", "error_type", "error_message"])
    else:
        run.status = RunStatus.FAILED
        run.finished_at = now
        run.save(update_fields=["status", "finished_at", "error_type", "error_message"])


def cancel_abandoned(
    run: JobRun, *, error_type: str, run_error_type: str, reason: str, now: datetime
) -> None:
    """Like ``hand_back`` for a run an operator asked to cancel: whatever ended the attempt,
    the run ends ``cancelled`` (its error type ``run_error_type``), never retried."""
    who = run.cancel_requested_by
    text = clip_message(f"cancelled on request{f' by {who}' if who else ''}: {reason}")
    _abandoned_attempt(run, JobAttempt.Outcome.CANCELLED, error_type, text, now)
    run.status = RunStatus.CANCELLED
    run.finished_at = now
    run.error_type, run.error_message = clip_type(run_error_type), text
    run.save(update_fields=["status", "finished_at", "error_type", "error_message"])
