"""A finish whose connection was lost under it: asked of the row, and written again if it did
not commit (split from ``records``, which calls ``write_finish`` for its one-statement finish)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import datetime

from django.db import DEFAULT_DB_ALIAS, InterfaceError, OperationalError, connections

from ...history import transitions
from ..state import RunState

logger = logging.getLogger("kumiko_jobs.records")


# Tries of a finish whose connection was lost (the first included), and the pause before each
# try again: a restarted PostgreSQL or a cut network takes a moment to take connections again.
FINISH_TRIES = 4
FINISH_PAUSE = 0.5


def write_finish(state: RunState, write: Callable[[], bool], finished_at: datetime) -> bool:
    """``write()`` the run's finish; if the connection is lost under it, write it again.

    A finish cut off (the session ended by ``pg_terminate_backend`` or a PostgreSQL restart, the
    connection cut by the network) may or may not have committed: the client cannot tell.
    Left so, the run stays ``running`` under a worker that has moved on, the sweep abandons it
    and a retry repeats the body, whose effects a plain job has already committed. So the
    worker asks the row on a new connection, locked as the sweep claims it: still ``running``
    this attempt means the finish did not commit, and it is written again in that transaction;
    anything else (the finish committed, or the sweep or an operator took the run) writes
    nothing, and the attempt's own row, found by its ``finished_at``, tells which of the two it
    was: False when the run was taken (nothing of this attempt is then pushed or signalled).
    The sweep leaves the run alone meanwhile: this worker still beats for its message.
    A connection lost again is tried ``FINISH_TRIES`` times in all, then the run is left to
    the sweep as before. Only this one-statement finish is written again; a finish with more
    to write (follow-ups, a tenant's failure, a workflow's next step) is not.
    """
    try:
        return write()
    except (OperationalError, InterfaceError):
        if connections[DEFAULT_DB_ALIAS].in_atomic_block:
            raise  # an inline run inside the caller's transaction: the caller's to handle
        logger.warning(
            "run %s: the connection was lost under its finish; asking the row on a new one",
            state.envelope.run_id,
            exc_info=True,
        )
    env = state.envelope
    for tries_left in range(FINISH_TRIES - 1, 0, -1):
        connections[DEFAULT_DB_ALIAS].close()
        try:
            written = transitions.write_if_still_running(env.run_id, env.attempt, write)
        except (OperationalError, InterfaceError):
            if tries_left == 1:
                raise
            time.sleep(FINISH_PAUSE)
            continue
        if written:
            return True
        if transitions.attempt_recorded(env.run_id, env.attempt, finished_at):
            logger.info("run %s: its finish had committed before its connection went", env.run_id)
            return True
        logger.info("run %s: taken while its finish's connection was lost", env.run_id)
        return False
    return True  # not reached: the last try raises
