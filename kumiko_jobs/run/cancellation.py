"""Cancelling a running run: the request's way from an operator to the job's code.

An operator (admin action, ``manage.py kumiko_jobs cancel``) records the request on the run
row (``cancel_requested_at`` / ``_by``) and sets a Redis key per run. The worker executing the
run reads that key with its liveness beat (one more command in the beat's existing pipeline,
no extra round trip and no database read while the job body runs) and marks the run here, in
the process that executes the body: the in-process worker directly, the forking worker by
signalling its work horse (``SIGNAL``). The job sees the mark through ``ctx.cancel_requested``
and ``ctx.check_cancelled()``; the outcome rules are in ``settle_cancellation`` of the
deferral step (docs/reliability.md, Cancellation).
"""

from __future__ import annotations

import logging
import signal
from typing import Any

logger = logging.getLogger("kumiko_jobs.cancellation")

# Sent by a forking worker to its work horse when the run it executes is to be cancelled.
SIGNAL = signal.SIGUSR1
# Run ids (hex) whose cancellation reached this process, with who asked ("" when unknown).
_requested: dict[str, str] = {}


def mark(run_id: str, who: str) -> None:
    """The cancellation of ``run_id`` reached this process (called by the worker)."""
    _requested.setdefault(run_id, who)


def forget(run_id: str) -> None:
    """Drop the cancellation mark of ``run_id`` once its run is over, so the mark does not outlive
    the run in a long-lived worker.
    """
    _requested.pop(run_id, None)


def requested_by(run_id: str) -> str | None:
    """Who asked to cancel ``run_id`` ("" if unknown), or None when nobody did (yet)."""
    return _requested.get(run_id)


# The run the work horse in this process executes (set in the horse only).
_horse_run: str | None = None


def _on_signal(signum: int, frame: Any) -> None:
    if _horse_run is not None:
        mark(_horse_run, "")


def listen_for_signal() -> None:
    """In a forking worker before it forks: the handler every work horse inherits, so a
    request signalled right after the fork cannot hit the default action (terminate)."""
    signal.signal(SIGNAL, _on_signal)


def horse_executes(run_id: str) -> None:
    """In a work horse: the run whose cancellation ``SIGNAL`` means."""
    global _horse_run
    _horse_run = run_id


def message(who: str | None) -> str:
    """The run's error message for a cancellation ``who`` asked for."""
    return f"cancellation requested{by_whom(who)}"


def by_whom(who: str | None) -> str:
    """`` by <who>`` for messages, or nothing when nobody is known (``-``: the operator's
    identity was not recorded)."""
    return f" by {who}" if who and who != "-" else ""
