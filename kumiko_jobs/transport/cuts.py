"""A Redis call tried again after its connection was cut, a bounded number of times.

A client that django-rq builds from a ``URL`` retries nothing (redis-py's connections get a
``Retry`` of 0 tries): a command whose connection was cut in flight raises at once. The calls a
process makes once, outside RQ's loop, where one cut would end the process (a worker's
registration: ``worker_cuts``; the boot jobs' dataset token: ``queues``), go through
``through_cuts`` instead: each is tried ``TRIES`` times with a doubling pause (0.25 s to 4 s:
about 8 s in all), then the process ends with a line that says what failed and for how long.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

logger = logging.getLogger("kumiko_jobs.worker")

TRIES = 6  # the first included
FIRST_PAUSE = 0.25  # seconds before the second try, doubled before each next one
CUT = (RedisConnectionError, RedisTimeoutError)


def through_cuts[T](call: Callable[[], T], what: str, who: str) -> T:
    """``call()``'s value, tried again after a lost connection (``TRIES`` in all, pauses
    doubling from ``FIRST_PAUSE``); the last try's error is raised after a line saying what
    failed. ``call`` must be safe to repeat: its last try may have been applied unheard.
    ``who`` names the process in those lines ("worker <name>")."""
    pause, started = FIRST_PAUSE, time.monotonic()
    for tries_left in range(TRIES - 1, -1, -1):
        try:
            return call()
        except CUT as exc:
            if tries_left == 0:
                logger.error(
                    "%s: Redis unreachable while %s (%d tries in %.1f s: %s); exiting",
                    who,
                    what,
                    TRIES,
                    time.monotonic() - started,
                    exc,
                )
                raise
            logger.warning(
                "%s: lost Redis while %s (%s); trying again in %.2f s",
                who,
                what,
                exc,
                pause,
            )
            time.sleep(pause)
            pause *= 2
    raise AssertionError("unreachable: the last try returns or raises")
