"""The workers' background maintenance: the sweep, then the outbox relay, one worker at a time.

Long-running workers each run a maintenance thread (heart.py) that runs a round every
``MAINTENANCE_INTERVAL`` seconds; a Redis lock that expires after one interval makes it one
round per interval among all workers, whichever takes it (docs/reliability.md). Between rounds
it looks every ``WORKER_HEARTBEAT`` seconds for a worker whose beat key expired, and sweeps at
once when one did. Burst workers leave it to the long-running ones.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from typing import Any

from django.db import connections

from .. import transport
from ..core import conf
from ..enqueueing import workflow_release
from ..history import rollup
from .relay import RelayResult, relay_pending
from .sweep import sweep_abandoned

logger = logging.getLogger("kumiko_jobs.worker")


def run_maintenance(redis: Any = None) -> None:
    """One round of what workers do in the background: sweep, relay, then the rollup."""
    sweep_abandoned()
    # Workflow steps whose runs ended outside a finish (the sweep's, a cancellation's).
    workflow_release.reconcile()
    relay_slice(redis if redis is not None else transport.connection_for(conf.get().DEFAULT_QUEUE))
    # The dashboard's rollup of the buckets that ended (history/rollup.py); never a run's path.
    rollup.roll_up()


def relay_slice(redis: Any) -> RelayResult:
    """The round's relay: at most ``RELAY_ROWS_PER_ROUND`` waiting runs, from where the last
    round's slice stopped (a Redis key), so that a backlog of a million runs costs each round
    the same as one of twenty thousand (a full pass checks about 44 us a run: 4.4 s of a worker's
    CPU and PostgreSQL's every round at 100,000). A slice that pushed lost messages (a failover,
    a flush) goes on to the end of the pass at once, and the next round starts from the first:
    what Redis lost is back within two rounds, not a slice a round."""
    settings = conf.get()
    result = relay_pending(limit=settings.RELAY_ROWS_PER_ROUND, after=transport.relay_cursor(redis))
    if result.pushed and result.stopped_after is not None:
        rest = relay_pending(after=result.stopped_after)
        result = RelayResult(
            result.checked + rest.checked, result.pushed + rest.pushed, result.failed + rest.failed
        )
    # A pass left unfinished for ten rounds (every worker stopped) starts over.
    keep = max(60, 10 * settings.MAINTENANCE_INTERVAL)
    transport.set_relay_cursor(redis, result.stopped_after, keep)
    return result


def maintain(name: str, stop: threading.Event) -> None:
    """The maintenance thread of worker ``name``: a round per interval, until ``stop`` is set,
    and between rounds a look for dead workers every ``WORKER_HEARTBEAT`` seconds.

    The look is what bounds a killed worker's restart by ``WORKER_DEAD_AFTER`` plus one beat
    instead of plus ``MAINTENANCE_INTERVAL``: two Redis round trips (``vanished_workers``), and
    the sweep only when a worker's key expired. Rounds that fail (Redis or PostgreSQL away) are
    logged and tried again; the thread's database connection is closed when it ends.
    """
    settings = conf.get()
    interval, every = settings.MAINTENANCE_INTERVAL, settings.WORKER_HEARTBEAT
    redis = transport.connection_for(settings.DEFAULT_QUEUE)
    # Workers started together spread their rounds over the interval.
    next_round = time.monotonic() + random.uniform(0, interval)
    # After an outage every worker's key may have expired, and a live worker's next beat is up
    # to a beat away: no look (only the rounds) until WORKER_DEAD_AFTER has passed without error.
    quiet_until = 0.0
    try:
        while not stop.wait(min(every, max(next_round - time.monotonic(), 0))):
            try:
                if time.monotonic() >= next_round:
                    next_round = time.monotonic() + interval
                    # The lock is left to expire: one round per interval among all workers.
                    if transport.take_maintenance_turn(redis, name, interval):
                        run_maintenance(redis)
                elif time.monotonic() >= quiet_until:
                    sweep_if_dead(redis, name, every)
            except Exception as exc:
                logger.warning("worker %s: maintenance round failed: %r", name, exc)
                quiet_until = time.monotonic() + settings.WORKER_DEAD_AFTER
                # A connection broken by an outage must not fail every later round.
                connections.close_all()
    finally:
        connections.close_all()


def sweep_if_dead(redis: Any, name: str, every: int) -> bool:
    """Sweep now if a worker stopped beating (its key expired); one worker per ``every``
    seconds does, whichever sees it first. Returns whether this call swept.

    A live worker is never the reason: its beat thread renews its key whatever its job's body
    does (busy, blocked, sleeping), so it is not in ``vanished_workers``; and the sweep itself
    hands back only runs no live worker beats for (sweep.py).
    """
    dead = transport.vanished_workers(redis)
    if not dead or not transport.take_dead_sweep_turn(redis, name, every):
        return False
    logger.info("worker %s: worker(s) %s stopped beating; sweeping", name, ", ".join(dead))
    sweep_abandoned()
    workflow_release.reconcile()  # a step the sweep failed on its last attempt moves on now
    return True
