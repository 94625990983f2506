"""Which runs wait for a rate window, as the admin shows them (never on a worker's path).

The fair dequeue (``fair.py``) moves a bucket whose head is over a rate limit into its queue's
``rwait`` set until the window reopens; every queued message of that bucket and priority level
waits for it (the head for its window, the others behind the head, FIFO). Over a per-job limit
only that job's messages of the bucket wait (member ``<level>\t<bucket>\t<job>``). Read at
most once a second per queue and process, so a list page costs one round trip per queue shown.
"""

from __future__ import annotations

import time

from redis.exceptions import RedisError

from .fair import prefix_of
from .fair_policy import bucket_of
from .queues import connection_for

_cache: dict[str, tuple[float, dict[tuple[int, str, str], float]]] = {}


def rate_wait_until(queue: str, schema: str | None, priority: int, job: str = "") -> float | None:
    """When (epoch seconds, Redis's clock) the window holding back this tenant's messages of
    ``priority`` on ``queue`` (or those of ``job`` only) reopens; None when none does (or Redis
    cannot say)."""
    read_at, waiting = _cache.get(queue, (0.0, {}))
    if time.monotonic() - read_at > 1.0:
        try:
            rows = list(
                connection_for(queue).zrange(prefix_of(queue) + "rwait", 0, -1, withscores=True)
            )
        except RedisError:
            rows = []
        waiting = {}
        for row in rows:
            member, score = row[0], row[1]
            text = member.decode() if isinstance(member, bytes) else str(member)
            level, _, rest = text.partition("\t")
            bucket, _, name = rest.partition("\t")
            waiting[(int(level), bucket, name)] = float(score)
        _cache[queue] = (time.monotonic(), waiting)
    bucket = bucket_of(schema)
    tenant_wide = waiting.get((priority, bucket, ""))
    return tenant_wide if tenant_wide is not None else waiting.get((priority, bucket, job))
