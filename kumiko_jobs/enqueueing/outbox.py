"""The push after commit: a committed run's message goes to Redis, or waits in its row.

The run row is written in the caller's transaction and is the outbox: when Redis does not
answer, the request that enqueued must not fail (its transaction has committed), and the
relay pushes the message later. After a failed push this process stops trying for
``PUSH_FAILURE_PAUSE`` seconds, so that requests do not each wait out redis-py's retries.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from django.db import transaction

from .. import signals, transport
from ..core import conf
from ..models import JobRun

logger = logging.getLogger("kumiko_jobs.enqueueing")

# time.monotonic() of this process's last failed push, None after a push that worked.
_push_failed_at: float | None = None


def save(row: JobRun, on_commit: Callable[[], None]) -> None:
    """Insert the new run's ``row`` in the caller's transaction; ``on_commit`` (its push, or
    the signal of a refused enqueue) runs once that commits, at once outside a transaction,
    never after a rollback. A robust callback: its failure never fails the caller."""
    row.save(force_insert=True)
    transaction.on_commit(on_commit, robust=True)


def push_paused() -> bool:
    """Did a push fail less than ``PUSH_FAILURE_PAUSE`` seconds ago (so the relay pushes)?"""
    failed_at = _push_failed_at
    return failed_at is not None and time.monotonic() - failed_at < conf.get().PUSH_FAILURE_PAUSE


def note_push_failed(at: float | None) -> None:
    """Remember when a push failed (``time.monotonic()``), or None after one that worked."""
    global _push_failed_at
    _push_failed_at = at


def push_committed(message: transport.Message, row: JobRun) -> None:
    """Push the message of the committed run ``row`` (an ``on_commit`` callback), and send
    ``job_queued``; on failure log, and leave the message to the relay."""
    global _push_failed_at
    failed_at, pause = _push_failed_at, conf.get().PUSH_FAILURE_PAUSE
    if failed_at is not None and time.monotonic() - failed_at < pause:
        # Redis just failed: do not make this request wait out redis-py's retries (about 4 s)
        # again. The committed row is the outbox; the relay pushes it.
        logger.warning(
            "run %s of %s is committed but not pushed: a push failed %.1f s ago, so for "
            "PUSH_FAILURE_PAUSE=%d s the relay pushes instead",
            row.run_id,
            row.job_name,
            time.monotonic() - failed_at,
            pause,
        )
        return
    try:
        transport.push(message)
    except Exception as exc:
        # The run is committed: its row is the outbox, and the relay pushes its message once
        # Redis answers again. The request that enqueued it must not fail for that.
        _push_failed_at = time.monotonic()
        logger.warning(
            "run %s of %s is committed but not pushed (%s: %s); the relay will push it",
            row.run_id,
            row.job_name,
            type(exc).__name__,
            exc,
        )
        return
    _push_failed_at = None
    signals.send(
        signals.job_queued,
        run_id=str(row.run_id),
        job_name=row.job_name,
        schema_name=row.schema_name or None,
        attempt=1,
        outcome="queued",
        error=None,
    )
