"""Which waiting messages a concurrency cap holds back, as the admin and the CLI ask.

The fair dequeue (``fair_caps.py``) names who waits for a full cap in ``kumiko:cap:<key>:w``
(members ``<lane>\\t<bucket>\\t<job>``, the job empty when the tenant's whole bucket waits), and
the keys with waiters in ``kumiko:cap:waiting``. Read at most once a second per Redis and
process, in two round trips (the keys, then their waiters in one pipeline), so a run list page
costs nothing per row.
"""

from __future__ import annotations

import time

from redis import Redis
from redis.exceptions import RedisError

from .fair import prefix_of
from .fair_caps import CAP_PREFIX, CAP_WAITING
from .fair_policy import bucket_of
from .queues import connection_for

_cache: dict[str, tuple[float, frozenset[str]]] = {}


def held_by_cap(queue: str, schema: str | None, priority: int, job: str) -> bool:
    """Whether ``job``'s waiting messages of this tenant and ``priority`` on ``queue`` wait for
    a slot of a concurrency cap (the tenant's, or the job's own); False when Redis cannot
    say."""
    redis = connection_for(queue)
    where = repr(redis.connection_pool)
    read_at, waiters = _cache.get(where, (0.0, frozenset()))
    if time.monotonic() - read_at > 1.0:
        waiters = frozenset(_waiters(redis))
        _cache[where] = (time.monotonic(), waiters)
    lane = f"{prefix_of(queue)}{priority}:"
    bucket = bucket_of(schema)
    return f"{lane}\t{bucket}\t" in waiters or f"{lane}\t{bucket}\t{job}" in waiters


def _waiters(redis: Redis) -> set[str]:
    try:
        keys = [_text(k) for k in redis.smembers(CAP_WAITING)]
        if not keys:
            return set()
        with redis.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.smembers(f"{CAP_PREFIX}{key}:w")
            replies = pipe.execute()
    except RedisError:
        return set()
    return {_text(m) for members in replies for m in members}


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
