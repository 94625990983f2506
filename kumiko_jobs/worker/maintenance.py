"""The workers' background maintenance: the sweep, then the outbox relay, one worker at a time.

Long-running workers each run a maintenance thread (heart.py) that wakes every
``MAINTENANCE_INTERVAL`` seconds; a Redis lock that expires after one interval makes it one
round per interval among all workers, whichever takes it (docs/reliability.md). Burst workers
leave it to the long-running ones.
"""

from __future__ import annotations

import logging
import random
import threading

from django.db import connections

from .. import transport
from ..core import conf
from ..enqueueing import workflow_release
from .relay import relay_pending
from .sweep import sweep_abandoned

logger = logging.getLogger("kumiko_jobs.worker")


def run_maintenance() -> None:
    """One round of what workers do in the background: sweep, then relay."""
    sweep_abandoned()
    # Workflow steps whose runs ended outside a finish (the sweep's, a cancellation's).
    workflow_release.reconcile()
    relay_pending()


def maintain(name: str, stop: threading.Event) -> None:
    """The maintenance thread of worker ``name``: a round per interval, until ``stop`` is set.

    Rounds that fail (Redis or PostgreSQL away) are logged and tried again next interval; the
    thread's database connection is closed when it ends.
    """
    interval = conf.get().MAINTENANCE_INTERVAL
    redis = transport.connection_for(conf.get().DEFAULT_QUEUE)
    try:
        # Workers started together spread their rounds over the interval.
        if stop.wait(random.uniform(0, interval)):
            return
        while True:
            try:
                # The lock is left to expire: one round per interval among all workers.
                if redis.set(transport.MAINTENANCE_LOCK, name, nx=True, ex=interval):
                    run_maintenance()
            except Exception as exc:
                logger.warning("worker %s: maintenance round failed: %r", name, exc)
                # A connection broken by an outage must not fail every later round.
                connections.close_all()
            if stop.wait(interval):
                return
    finally:
        connections.close_all()
