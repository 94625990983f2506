"""The queues' doorbells: how an idle worker learns at once that a message arrived, while
messages it may not take (paused, over a rate limit) or several queues keep it from blocking on
RQ's list.

A worker with nothing to take on one queue whose list is empty blocks on that list itself
(``BLMOVE`` of the list onto itself, ``rq_worker.py``). But the fair dequeue leaves a token in
the list for every message it sorted (so that RQ counts them), and a paused tenant's or a
rate-limited job's messages keep their tokens there: the list is not empty, ``BLMOVE`` returns
at once, and the worker could only look again after a while (a second), however soon another
tenant's message came. A worker serving several queues cannot block on several lists with
``BLMOVE`` either.

So every push rings the queue's bell, in the pipeline that pushes (no extra round trip): one
entry pushed onto a short list, ``kumiko:fair:<queue>:bell``, trimmed to ``BELL_SIZE``. A
waiting worker blocks on the bells of its queues (``BLPOP``, one call for all of them) and
looks again when one rings: an arrival wakes one waiting worker. A ring nobody waited for
stays on the list and later wakes a worker for one look that finds nothing (one script call;
at most ``BELL_SIZE`` of them after a busy spell): a spurious look is cheap, a missed one costs
a second. Resuming a pause rings with ``BELL_SIZE`` entries, to wake every waiting worker.
Paths that put a message on RQ's list without kumiko (RQ's own requeue of an abandoned job,
django-rq's "requeue" button) do not ring: the wait stays bounded (``RING_WAIT_MAX``) for them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from redis import Redis

from .keys import FAIR_PREFIX

# Rings kept per queue: enough to wake every worker a deployment runs on one queue at once,
# few enough that stale rings cost nothing.
BELL_SIZE = 64
# The longest a waiting worker blocks on the bells before it looks again on its own: an
# arrival by a path that does not ring waits at most this long.
RING_WAIT_MAX = 1.0


def bell_of(queue: str) -> str:
    """The bell key of ``queue`` (beside its lanes: ``fair.prefix_of(queue) + "bell"``)."""
    return f"{FAIR_PREFIX}{queue}:bell"


def ring(pipeline: Any, queue: str, times: int = 1) -> None:
    """Queue a ring of ``queue``'s bell on ``pipeline`` (the push's own: no round trip)."""
    key = bell_of(queue)
    pipeline.lpush(key, *(["1"] * max(1, min(times, BELL_SIZE))))
    pipeline.ltrim(key, 0, BELL_SIZE - 1)


def wait_for_ring(connection: Redis, queues: Sequence[str], timeout: float) -> bool:
    """Block until one of ``queues``' bells rings, at most ``timeout`` seconds (bounded by
    ``RING_WAIT_MAX``); True when it rang (look again now), False when the time ran out."""
    wait = min(timeout, RING_WAIT_MAX)
    if wait <= 0:
        return False
    # BLPOP takes its timeout in seconds as a float since Redis 6.0.
    return connection.blpop([bell_of(q) for q in queues], timeout=wait) is not None
