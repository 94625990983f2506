"""A run's (or a workflow's) "done" signal, for ``handle.wait()``: no database polling.

The worker that finishes a run in a final state adds two commands to its finish's existing
pipeline (``done_on``; one ``MULTI/EXEC`` it sends anyway): an ``RPUSH`` of a token on
``kumiko:done:<id hex>`` and an ``EXPIRE`` of ``DONE_TTL`` seconds. No round trip more, for
runs nobody waits on too; the short list expires on its own. The finish's database
transaction has committed before (the run's function returned), so a waiter woken by the token
reads the final row.

A waiter (``wait_for``) blocks on ``BLPOP`` of that list and, when it gets the token, pushes it
back for the other waiters of the same id. The token is a wake-up, never the truth: the caller
reads the row after it, and reads it again when the ``BLPOP`` times out (a run can end without
the worker's finish: cancelled while queued, failed by the sweep, finished by a forking worker,
whose finish is RQ's own in the work horse).
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from rq import get_current_job

from .errors import RedisTimeoutError
from .keys import DONE_KEY
from .queues import connection_for

# Seconds a done signal outlives the finish: longer than the gap between a waiter's first
# read of the row and its BLPOP; a waiter that comes later reads the final row first.
DONE_TTL = 60
# Seconds one BLPOP blocks at most (and at most half the client's socket timeout).
_LONGEST = 2.0
# Set on the RQ job being executed (the worker's finish pipeline reads it): the ids to signal.
_ATTRIBUTE = "kumiko_done"


def _key(some_id: str) -> str:
    return f"{DONE_KEY}{uuid.UUID(str(some_id)).hex}"


def note_done(*ids: str) -> None:
    """In the worker, while the run's function returns: these runs and workflows reached their
    final state; the finish pipeline signals them (``done_on``). No I/O here."""
    job = get_current_job()
    if job is not None and ids:
        setattr(job, _ATTRIBUTE, [*getattr(job, _ATTRIBUTE, []), *ids])


def done_on(pipeline: Any, job: Any) -> None:
    """Add the done signals ``note_done`` left on ``job`` to the finish's ``pipeline``."""
    for some_id in getattr(job, _ATTRIBUTE, ()):
        key = _key(some_id)
        pipeline.rpush(key, "1")
        pipeline.expire(key, DONE_TTL)


def signal_done(some_id: str, queue: str) -> None:
    """Signal ``some_id`` done now, on ``queue``'s Redis (one round trip): for what ends
    outside a worker's finish (a workflow's cancel, its reconciler), after the commit."""
    with connection_for(queue).pipeline() as pipe:
        key = _key(some_id)
        pipe.rpush(key, "1")
        pipe.expire(key, DONE_TTL)
        pipe.execute()


def wait_for(some_id: str, timeout: float, queue: str) -> bool:
    """Block up to ``timeout`` seconds for the done signal of ``some_id`` on ``queue``'s Redis
    (the finishing worker's); True when it came (then it is put back for any other waiter).
    Never a truth: read the row after it.

    Each ``BLPOP`` blocks for less than the client's ``SOCKET_TIMEOUT`` (a client that waits
    longer than that for an answer gives up on the connection), so a long wait is several
    short ones: Redis round trips, no database read."""
    redis = connection_for(queue)
    key = _key(some_id)
    kwargs = redis.connection_pool.connection_kwargs
    # redis-py 7 keeps the configured value apart (it may relax the live one for a while).
    socket_timeout = kwargs.get("socket_timeout") or kwargs.get("orig_socket_timeout")
    longest = max(min(socket_timeout / 2, _LONGEST), 0.1) if socket_timeout else _LONGEST
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        try:
            got = redis.blpop([key], timeout=max(min(left, longest), 0.01))
        except RedisTimeoutError:  # a slow answer: the connection is dropped, wait on
            continue
        if got is not None:
            signal_done(some_id, queue)
            return True
    return False
