"""Is delayed work overdue because no scheduler runs? Said by the worker log, the admin, W003.

Retries, ``enqueue_in`` runs, deferrals and cron ticks wait in rq-scheduler's sorted set until
``manage.py rqscheduler`` moves them to their queue. Without a scheduler they stay ``queued``
(or ``deferred``) forever and nothing fails, so the silence itself has to be reported. The
test is the work, not the process: messages due longer ago than
``KUMIKO_JOBS["SCHEDULER_OVERDUE_AFTER"]`` seconds. Whether a scheduler is registered only
changes the advice (start one, or look at the one that is stuck).
"""

from __future__ import annotations

import logging
import time

from redis.exceptions import RedisError

from ..core import conf
from .scheduler import scheduler_lag

logger = logging.getLogger("kumiko_jobs.scheduler")


def overdue_problem() -> str:
    """A sentence saying that scheduled work is overdue and why, or ``""`` when it is not.

    ``""`` too when the check is off (``SCHEDULER_OVERDUE_AFTER = 0``) or Redis cannot be
    read: an outage is reported elsewhere, and this runs inside admin pages and worker threads.
    """
    after = conf.get().SCHEDULER_OVERDUE_AFTER
    if not after:
        return ""
    try:
        lag = scheduler_lag(after)
    except (RedisError, OSError) as exc:
        logger.debug("scheduler liveness not checked, Redis unavailable: %s", exc)
        return ""
    if not lag.overdue:
        return ""
    late = round(time.time() - lag.oldest_due) if lag.oldest_due is not None else after
    head = (
        f"{lag.overdue} scheduled message(s) (retries, enqueue_in, deferrals, cron ticks) are "
        f"overdue, the oldest by {late} s"
    )
    if lag.scheduler_registered:
        return (
            f"{head}: an rqscheduler is registered but does not move them; check that it uses "
            "this Redis and is not stuck (its log), or restart it."
        )
    return (
        f"{head}: no scheduler is running. Start one: `python manage.py rqscheduler "
        "--interval 1` (they stay queued until then)."
    )


class RateLimitedWarning:
    """Logs ``overdue_problem()`` at most once per ``every`` seconds while it lasts, and once
    when it is over, so a worker's log says it without repeating it on every beat."""

    def __init__(self, every: float = 600.0, check_every: float = 30.0) -> None:
        self.every = every
        self.check_every = check_every
        self._checked_at = float("-inf")
        self._warned_at = float("-inf")
        self._warned = False

    def poll(self, worker: str) -> None:
        """Check (at most every ``check_every`` s) and log for ``worker`` as the class says."""
        now = time.monotonic()
        if now - self._checked_at < self.check_every:
            return
        self._checked_at = now
        problem = overdue_problem()
        if problem and now - self._warned_at >= self.every:
            logger.warning("worker %s: %s", worker, problem)
            self._warned_at = now
            self._warned = True
        elif not problem and self._warned:
            logger.warning("worker %s: scheduled messages are moved again; none overdue", worker)
            self._warned = False
            self._warned_at = float("-inf")
