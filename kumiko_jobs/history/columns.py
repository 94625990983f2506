"""What the history's rows hold: the bounds of their columns, and the columns an attempt's end
leaves on the run's row and its attempt's (``AttemptEnd``). Pure: no query; ``transitions``,
the one writer of those rows, writes what is made here (and re-exports it).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from ..core.outcome import Outcome
from ..models import FlowPause, JobAttempt, JobRun


def _max_length(model: Any, name: str) -> int:
    length = model._meta.get_field(name).max_length
    assert length is not None, f"{model.__name__}.{name} has no max_length"
    return int(length)


# One bound per column, defined here only: this module applies them, and the few writers of
# these columns outside it (a new run's trigger, a workflow's reasons) import them. Free text
# (a ``TextField``) has no bound in the table; 4000 characters is what an operator reads of a
# message, and a traceback keeps its last 20,000 (the innermost frames, where it failed).
ERROR_MESSAGE_LIMIT = 4000  # JobRun.error_message, JobAttempt.error_message
TRACEBACK_LIMIT = 20_000  # JobAttempt.traceback, its tail
REASON_LIMIT = 4000  # Workflow.reason, WorkflowStep.reason (history/workflows.py writes them)
CANCEL_BY_LIMIT = _max_length(JobRun, "cancel_requested_by")
TRIGGER_LIMIT = _max_length(JobRun, "trigger")  # written with a new run (enqueueing)
# JobRun.error_type, JobAttempt.error_type: an exception's class name, which a job chooses.
ERROR_TYPE_LIMIT = min(_max_length(JobRun, "error_type"), _max_length(JobAttempt, "error_type"))
PAUSED_BY_LIMIT = _max_length(FlowPause, "paused_by")  # written by worker/pauses.py
# ORIGIN_PATH_LIMIT (JobRun.origin's "path"): origin.py's, where it is written, below us.


def clip_message(text: str) -> str:
    """An error message as the history keeps it."""
    return text[:ERROR_MESSAGE_LIMIT]


def clip_type(name: str) -> str:
    """An error type (an exception's class name) as the history keeps it."""
    return name[:ERROR_TYPE_LIMIT]


@dataclass(frozen=True, slots=True)
class AttemptEnd:
    """How an attempt ended, as the records step knows it: what ``finish_attempt`` writes to
    the attempt's row and the run's."""

    run_id: str
    number: int
    outcome: Outcome
    started_at: datetime
    finished_at: datetime
    duration_ms: float
    # None: no error to describe (the error columns are then cleared only by a success).
    error_type: str | None
    error_message: str
    traceback: str
    log: list[Any]
    worker: str
    waiting_for: str = ""  # the deferral a deferred run waits for
    retry_in: float | None = None  # seconds until the next attempt is due
    result: Any = None  # a success's, already plain JSON (or a marker)
    drop_reason: str = ""
    progress: Mapping[str, Any] = field(default_factory=dict)  # the row's missing progress


def run_columns(end: AttemptEnd) -> dict[str, Any]:
    """The run row's columns after ``end``, in the order the finish statement sets them (the
    statement is built once per set of columns)."""
    outcome = end.outcome
    columns: dict[str, Any] = {
        "status": outcome.status,
        "duration_ms": end.duration_ms,
        # Which deferral the run now waits for, so its next message is rebuilt from the row
        # (relay) without a guess; cleared for every other outcome. In the same statement.
        "waiting_for": end.waiting_for if outcome is Outcome.DEFERRED else "",
    }
    if outcome.final:
        columns["finished_at"] = end.finished_at
    if end.retry_in is not None:
        columns["scheduled_for"] = end.finished_at + timedelta(seconds=end.retry_in)
    if end.error_type is not None:
        columns["error_type"] = clip_type(end.error_type)
        columns["error_message"] = clip_message(end.error_message)
    elif outcome is Outcome.SUCCEEDED:
        columns["error_type"] = ""
        columns["error_message"] = ""
    if outcome is Outcome.SUCCEEDED:
        columns["result"] = end.result
    if outcome is Outcome.DROPPED:
        columns["error_message"] = clip_message(end.drop_reason)
    columns.update(end.progress)
    return columns


def attempt_columns(end: AttemptEnd) -> dict[str, Any]:
    """The attempt row ``end`` leaves."""
    return {
        "run": uuid.UUID(end.run_id),
        "number": end.number,
        "started_at": end.started_at,
        "finished_at": end.finished_at,
        "duration_ms": end.duration_ms,
        "outcome": str(end.outcome),
        "error_type": clip_type(end.error_type or ""),
        "error_message": clip_message(end.error_message) if end.error_type is not None else "",
        "traceback": end.traceback[-TRACEBACK_LIMIT:],
        "log": end.log,
        "worker": end.worker,
    }
