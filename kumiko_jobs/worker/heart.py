"""The worker's threads: the liveness beat, the watchdog, and the maintenance rounds.

A small thread beats a liveness key in Redis naming the RQ job the worker executes, so the
sweep can tell a run whose worker died (SIGKILL, OOM, a lost machine) from one that is merely
long, within ``WORKER_DEAD_AFTER`` seconds instead of the job's timeout (docs/reliability.md).
A cancellation of the run being executed rides on the same beat. The watchdog ends an attempt
that outlived its timeout by ``TIMEOUT_KILL_AFTER`` seconds, or a cancelled one still running
``CANCEL_GRACE`` seconds after the request, through callbacks the worker class provides
(classes.py: how depends on where the body runs). Threads, because an in-process worker is busy
in the job's code for as long as a run lasts: nothing else could beat meanwhile.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from django.db import connections

from .. import transport
from ..core import conf
from ..transport import RedisError
from ..transport.scheduler_liveness import RateLimitedWarning
from .maintenance import maintain

logger = logging.getLogger("kumiko_jobs.worker")
_WATCH_EVERY = 0.5  # seconds between the watchdog's looks at the attempt being executed


def _redis() -> Any:
    return transport.connection_for(conf.get().DEFAULT_QUEUE)


class Heart:
    """The worker's liveness beat and, for long-running workers, its maintenance rounds.

    Threads, because an in-process worker is busy in the job's code for as long as a run lasts:
    nothing else could beat meanwhile. Each thread has its own Redis client and database
    connection, closed when it ends.
    """

    def __init__(
        self,
        name: str,
        overran: Callable[[str], None] | None = None,
        cancel_seen: Callable[[str, str], None] | None = None,
        cancel_overran: Callable[[str], None] | None = None,
    ) -> None:
        self.name = name
        self.current = ""  # the RQ job id being executed; set by the worker's main thread
        # Called with (RQ job id, who) when the beat finds a cancellation of the current run,
        # and with the RQ job id when a cancelled attempt is still running CANCEL_GRACE s later.
        self._cancel_seen = cancel_seen
        self._cancel_overran = cancel_overran
        # (RQ job id, monotonic deadline) of a cancelled attempt; see _watch.
        self.cancel_deadline: tuple[str, float] | None = None
        # (RQ job id, monotonic deadline) of the attempt being executed, one assignment so the
        # watchdog never pairs one job's id with another's deadline. See _watch.
        self.watched: tuple[str, float] | None = None
        self._overran = overran
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self, *, maintenance: bool) -> None:
        """Start the beat, the watchdog (if the worker can end an attempt) and, if asked and
        ``MAINTENANCE_INTERVAL`` is set, the maintenance thread."""
        self._threads.append(threading.Thread(target=self._beat, name="kumiko-beat", daemon=True))
        if self._overran is not None:
            self._threads.append(
                threading.Thread(target=self._watch, name="kumiko-watchdog", daemon=True)
            )
        if maintenance and conf.get().MAINTENANCE_INTERVAL:
            self._threads.append(
                threading.Thread(
                    target=maintain,
                    args=(self.name, self._stop),
                    name="kumiko-maintenance",
                    daemon=True,
                )
            )
        for thread in self._threads:
            thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """End the threads and say goodbye, so nobody waits for the key to expire."""
        self._stop.set()
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(timeout)
        transport.goodbye(_redis(), self.name)

    def _beat(self) -> None:
        settings = conf.get()
        redis = _redis()
        failing = False
        # Delayed work overdue because no rqscheduler runs: said in this worker's log, at most
        # every ten minutes while it lasts (the check itself runs every 30 s at most).
        scheduler_warning = RateLimitedWarning()
        while True:
            try:
                current = self.current
                # A cancellation of the run being executed rides on the beat.
                who = transport.beat(redis, self.name, current, settings.WORKER_DEAD_AFTER)
                if who is not None:
                    self._cancel_requested(current, who)
                if failing:
                    logger.warning("worker %s: liveness beats reach Redis again", self.name)
                failing = False
            except RedisError as exc:
                if not failing:
                    logger.warning("worker %s: liveness beat failed (%s)", self.name, exc)
                failing = True
            try:
                scheduler_warning.poll(self.name)
            except Exception as exc:  # never let the report stop the beats
                logger.debug("worker %s: scheduler liveness check failed: %r", self.name, exc)
            if self._stop.wait(settings.WORKER_HEARTBEAT):
                return

    def _cancel_requested(self, job_id: str, who: str) -> None:
        if self._cancel_seen is None or self.current != job_id:
            return
        first = self.cancel_deadline is None or self.cancel_deadline[0] != job_id
        if first:
            self.cancel_deadline = (job_id, time.monotonic() + conf.get().CANCEL_GRACE)
            self._cancel_seen(job_id, who)

    def watch(self, job_id: str, timeout: int | None) -> None:
        """Watch the attempt the main thread starts now (None: it ended)."""
        if timeout is None or not job_id:
            self.watched = None
            return
        limit = timeout + conf.get().TIMEOUT_KILL_AFTER
        self.watched = (job_id, time.monotonic() + limit)

    def _watch(self) -> None:
        """End an attempt that outlived its timeout by ``TIMEOUT_KILL_AFTER`` seconds.

        Its job caught the timeout and went on, or sits in a call no signal interrupts. The
        liveness beats go on meanwhile, so the sweep waits (docs/reliability.md, Timeouts);
        this is what ends the wait. Checked every ``_WATCH_EVERY`` seconds.
        """
        ended = ""
        while not self._stop.wait(_WATCH_EVERY):
            self._watch_cancelled()
            watched = self.watched
            if watched is None or watched[0] == ended or time.monotonic() < watched[1]:
                continue
            ended = watched[0]
            try:
                if self._overran is not None:
                    self._overran(ended)
            except Exception:
                logger.exception("worker %s: could not end the overrunning %s", self.name, ended)
            finally:
                connections.close_all()

    def _watch_cancelled(self) -> None:
        """Stop a cancelled attempt still running ``CANCEL_GRACE`` seconds after the request
        reached the worker (only the forking worker can: it kills the work horse)."""
        pending = self.cancel_deadline
        if pending is None or self._cancel_overran is None or time.monotonic() < pending[1]:
            return
        self.cancel_deadline = (pending[0], float("inf"))  # once per attempt
        if self.current != pending[0]:
            return
        try:
            self._cancel_overran(pending[0])
        except Exception:
            logger.exception("worker %s: could not stop the cancelled %s", self.name, pending[0])
        finally:
            connections.close_all()
