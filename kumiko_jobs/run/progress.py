"""``ctx.progress(fraction, message=None)``: how far a run is, kept in memory, written seldom.

A job may report its progress in a tight loop (every row of an import), so a call costs no
statement: the value is kept here and written on the run's row at most every
``PROGRESS_INTERVAL`` seconds while the run runs (one short ``UPDATE`` from the body's thread,
on the project's connection, past the guard), and with the finish, as two more columns of the
finish's existing statement (``records``). A run that never calls it writes nothing more: the
finish's columns are only added when there is something new to write.

An interim write is skipped (the value waits for the next one, or the finish) where it would
join a transaction that is not the history's: an atomic run's, one the body opened itself, a
caller's around an inline test run; and from another thread than the run's (an async body's
event loop), which has no connection of the run.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass
from typing import Any

from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections

from ..core import conf, session
from ..core.exceptions import InvalidJob
from ..core.text import text_problem
from ..guard.watch import Watch
from ..history import transitions

logger = logging.getLogger("kumiko_jobs.progress")

# JobRun.progress_message holds this many characters.
MESSAGE_MAX_LENGTH = 200


@dataclass(slots=True)
class Progress:
    """The run's last reported progress and what of it the row already has (one writer: the
    job's ``ctx.progress``; read by the records step's finish)."""

    fraction: float | None = None
    message: str = ""
    # Whether the row lacks the last report, and when it was last written (monotonic).
    dirty: bool = False
    written_at: float = 0.0

    def finish_columns(self) -> dict[str, Any]:
        """The columns the finish's statement adds: none when the row has the last report."""
        if not self.dirty:
            return {}
        self.dirty = False
        return {"progress": self.fraction, "progress_message": self.message}


def checked(fraction: Any, message: Any) -> tuple[float, str]:
    """``(fraction, message)`` validated, or ``InvalidJob`` saying what to pass instead."""
    if (
        isinstance(fraction, bool)
        or not isinstance(fraction, int | float)
        or math.isnan(fraction)
        or not 0 <= fraction <= 1
    ):
        raise InvalidJob(
            f"ctx.progress() takes a fraction from 0 to 1 (0.25 for a quarter), got {fraction!r}."
        )
    if message is None:
        return float(fraction), ""
    if not isinstance(message, str):
        raise InvalidJob(f"ctx.progress(message=...) takes text, got {type(message).__name__}.")
    if len(message) > MESSAGE_MAX_LENGTH:
        raise InvalidJob(
            f"ctx.progress(message=...) is {len(message)} characters long; at most "
            f"{MESSAGE_MAX_LENGTH} are kept. Say it shorter (details belong in ctx.log)."
        )
    problem = text_problem(message)
    if problem:
        raise InvalidJob(f"ctx.progress(message=...) {problem}; pass plain text.")
    return float(fraction), message


def report(
    progress: Progress, watch: Watch, run_id: str, attempt: int, fraction: Any, message: Any
) -> None:
    """Keep the report; write it now if the last write is ``PROGRESS_INTERVAL`` seconds old."""
    progress.fraction, progress.message = checked(fraction, message)
    progress.dirty = True
    interval = conf.get().PROGRESS_INTERVAL
    now = time.monotonic()
    if not interval or now - progress.written_at < interval:
        return
    progress.written_at = now  # also when skipped below: the next try waits as long
    project = _project_connection(watch)
    if project is None:
        return
    try:
        with watch.stepped_aside():  # kumiko's own write, not the body's
            transitions.write_progress(
                project, run_id, attempt, progress.fraction, progress.message
            )
    except DatabaseError as exc:  # the job goes on; the report waits for the finish
        logger.warning("run %s: its progress was not written (%r)", run_id, exc)
        return
    progress.dirty = False


def _project_connection(watch: Watch) -> Any:
    """The connection to write the run's row on now, or None where a write must wait."""
    if watch.thread != threading.get_ident():
        return None
    identity = watch.db_identity
    if identity is not None:  # DB_ROLES: the body's login cannot write kumiko's tables
        conn = identity.project_wrapper(DEFAULT_DB_ALIAS)
    else:
        conn = connections[DEFAULT_DB_ALIAS]
    if watch.in_callers_transaction or session.in_transaction(conn):
        return None
    return conn
