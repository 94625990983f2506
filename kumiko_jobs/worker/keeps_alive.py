"""Worker mixin: keep every run accounted for, and survive a Redis outage.

RQ's worker loop quits on any Redis error outside its blocking dequeue, and a worker that quits
in the middle of an outage leaves nothing to pick the work up when Redis is back. Kumiko's
history is in PostgreSQL, so RQ's bookkeeping calls (heartbeat, state, suspension check,
maintenance, teardown) can wait: a lost Redis is logged once, the worker keeps its loop, and it
registers itself again when Redis returns without its data. A message that never started is
still a queued run, which the relay pushes again. Its calls before and after the loop (the
worker's name on its connection, its registration with the kumiko mark, its command channel, a
shutdown request's note) ride out a cut connection in the transport (transport/worker_cuts.py).

The mixin also owns the worker's ``Heart`` (heart.py) for as long as ``work()`` runs, and tells
it which RQ job the main thread executes; the worker classes say how an overrunning or
cancelled attempt is ended (``_overran``, ``_cancel_seen``, ``_cancel_overran``).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from .. import transport
from ..transport import RedisConnectionError, RedisError, RedisTimeoutError
from .heart import Heart

logger = logging.getLogger("kumiko_jobs.worker")
_REDIS_DOWN = (RedisConnectionError, RedisTimeoutError)
_HEARTBEAT_AT_MOST_EVERY = 1.0  # seconds between RQ worker heartbeats sent on their own


class KeepsRunsAlive:
    """Liveness beats, maintenance, and a worker loop that survives Redis outages."""

    connection: Any
    name: str
    key: str
    _heart: Heart | None = None
    _redis_lost = False
    register_birth: Callable[[], None]  # RQ's, through cuts (transport/worker_cuts.py)
    maintains = True
    # RQ's "job <RQ id> result is kept for N seconds" after every message: the run's own line
    # (kumiko_jobs.runs) says what matters, and the result of a kumiko message is not read.
    log_result_lifespan = False

    def work(self, *args: Any, **kwargs: Any) -> bool:
        """Run RQ's loop with the worker's heart beating (and doing maintenance, except in burst
        mode); the heart stops when the loop ends.
        """
        burst = bool(kwargs.get("burst", args[0] if args else False))
        heart = self._heart = Heart(
            self.name, self._overran, self._cancel_seen, self._cancel_overran
        )
        # Burst workers (tests, one-off drains) beat but leave maintenance to long-running ones;
        # a worker process's sibling slots leave it to its main slot (slots.py).
        heart.start(maintenance=not burst and self.maintains)
        try:
            return bool(super().work(*args, **kwargs))  # type: ignore[misc]
        finally:
            heart.stop()

    def execute_job(self, job: Any, queue: Any) -> None:
        """Execute with the heart watching the job's timeout and cancellation; a Redis outage in
        RQ's bookkeeping is logged and survived (the run's history is in PostgreSQL, and the relay
        pushes a message that never started).
        """
        heart = self._heart
        if heart is not None:
            heart.current = job.id
            heart.watch(job.id, transport.timeout_of_job(job))
        try:
            super().execute_job(job, queue)  # type: ignore[misc]
        except _REDIS_DOWN as exc:
            # RQ's bookkeeping failed; kumiko's history is in PostgreSQL. A message that never
            # started is still a queued run, which the relay pushes again.
            logger.error(
                "worker %s: lost Redis while handling %s (%s); going on", self.name, job.id, exc
            )
            self._redis_down(exc)
            self._after_redis_loss()
        finally:
            if heart is not None:
                heart.watch("", None)
                heart.current = ""

    def _after_redis_loss(self) -> None:
        """Hook for the forking worker, whose work horse may still be running."""

    def _cancel_seen(self, job_id: str, who: str) -> None:
        """The beat found a cancellation of ``job_id``'s run (called from the beat thread)."""
        raise NotImplementedError

    _cancel_overran: Callable[[str], None] | None = None

    def _overran(self, job_id: str) -> None:
        """End the attempt of ``job_id``, which outlived its timeout (called by the watchdog)."""
        raise NotImplementedError

    # RQ's worker loop quits on any Redis error outside its blocking dequeue. These calls
    # are bookkeeping that can wait for Redis to come back.

    def heartbeat(self, timeout: int | None = None, pipeline: Any = None) -> None:
        """RQ's heartbeat at most once a second, as one pipelined round trip; a Redis outage is
        noted instead of ending the loop, and the worker registers again when Redis is back.
        """
        if pipeline is not None:
            super().heartbeat(timeout, pipeline)  # type: ignore[misc]
            return
        last = getattr(self, "last_heartbeat", None)
        if (
            timeout is None
            and not self._redis_lost
            and last is not None
            and (transport.utcnow() - last).total_seconds() < _HEARTBEAT_AT_MOST_EVERY
        ):
            # RQ beats three times around every message; its TTLs are minutes long, so more
            # than one beat a second only costs round trips.
            return
        try:
            # RQ sends a heartbeat's three commands one by one, three times per message; one
            # pipeline makes each heartbeat a single round trip, with the same commands.
            with transport.one_round_trip(self.connection) as pipe:
                super().heartbeat(timeout, pipe)  # type: ignore[misc]
        except _REDIS_DOWN as exc:
            self._redis_down(exc)
            return
        if self._redis_lost:
            self._redis_back()

    def set_state(self, state: str, pipeline: Any = None) -> None:
        """RQ's state write; a Redis outage is noted instead of ending the loop."""
        try:
            super().set_state(state, pipeline)  # type: ignore[misc]
        except _REDIS_DOWN as exc:
            self._redis_down(exc)

    def check_for_suspension(self, burst: bool) -> None:
        """RQ's suspension check; during a Redis outage it notes the loss and waits a second, so the
        loop does not spin.
        """
        try:
            super().check_for_suspension(burst)  # type: ignore[misc]
        except _REDIS_DOWN as exc:
            self._redis_down(exc)
            time.sleep(1)  # no busy loop while Redis is away

    def run_maintenance_tasks(self) -> None:
        """RQ's maintenance; it can wait for Redis, so an outage is noted instead of ending the
        loop.
        """
        try:
            super().run_maintenance_tasks()  # type: ignore[misc]
        except _REDIS_DOWN as exc:
            self._redis_down(exc)

    def teardown(self) -> None:
        """RQ's teardown; if Redis is away the death is not registered, a warning says so, and the
        worker still exits cleanly.
        """
        try:
            super().teardown()  # type: ignore[misc]
        except _REDIS_DOWN as exc:
            logger.warning("worker %s: could not register its death (%s)", self.name, exc)

    def _redis_down(self, exc: Exception) -> None:
        forget_state = getattr(self, "forget_state", None)
        if forget_state is not None:
            # Writes of the worker's state may be lost with the connection: send the next one.
            forget_state()
        if not self._redis_lost:
            logger.warning("worker %s: Redis unreachable (%s); waiting for it", self.name, exc)
        self._redis_lost = True

    def _redis_back(self) -> None:
        self._redis_lost = False
        logger.warning("worker %s: Redis reachable again", self.name)
        # A restart without persistence forgot this worker: register it again.
        with contextlib.suppress(RedisError, ValueError):
            if not transport.is_registered(self.connection, self.key):
                self.register_birth()
