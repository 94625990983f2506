"""RQ workers with per-run hygiene and JSON-only messages.

``Worker`` (the default, set ``RQ["WORKER_CLASS"] = "kumiko_jobs.worker.Worker"``) runs jobs in
the worker process like RQ's ``SimpleWorker``: about five times the throughput of forking
for short database jobs, because the connection is reused. Its cost is that a run could leak
state into the next one, so after every run it goes back to the public schema and drops
connections the run left unusable.

``ForkingWorker`` keeps RQ's fork-per-job isolation. The parent closes its database
connections before forking (a socket shared by two processes corrupts both), and the work
horse flushes telemetry before it exits.

Both refuse any queue message that is not a call of the runner with one argument. Whoever can
write to Redis can name any importable function in an RQ message (``os.system`` with JSON
arguments), and RQ would call it; a kumiko worker records such a message as a
``RejectedMessage``, fails it in RQ without calling anything, and goes on. A job hash RQ cannot
even load is recorded and removed instead of stopping the worker.

Both also keep their runs accounted for (docs/reliability.md): a small thread beats a liveness
key in Redis naming the RQ job the worker executes, so the sweep can tell a run whose worker
died (SIGKILL, OOM, a lost machine) from one that is merely long, within ``WORKER_DEAD_AFTER``
seconds instead of the job's timeout; a second thread runs the sweep and the outbox relay every
``MAINTENANCE_INTERVAL`` seconds, one worker at a time. A Redis outage does not end a worker: it
waits and reconnects. A cold shutdown of the in-process worker is handled like a crash.

A timeout is final (docs/reliability.md, Timeouts): their death penalty notes on the run that
its timeout fired, so a job that swallows RQ's timeout exception is still recorded as timed out
(runner.call_job); and a watchdog thread ends an attempt still running ``TIMEOUT_KILL_AFTER``
seconds after its timeout: ``ForkingWorker`` kills the work horse, ``Worker`` records the attempt
and exits, as after a crash, for its supervisor to restart it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import signal
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.db import connections
from psycopg.pq import TransactionStatus
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .. import transport
from ..core import conf
from ..core.current import job_alarm
from ..core.envelope import run_id_of
from ..history.rejections import record_rejection
from ..run import cancellation
from ..run.context import current_run
from ..run.steps.tenancy import reset_connections
from ..telemetry import flush as telemetry_flush
from ..transport import (
    HOOK_FIELDS,
    LIVE_WORKERS,
    RQ_WORKER_MARK,
    RUNNER,
    WORKER_KEY,
    WORKERS_SINCE_KEY,
    BookkeepingSimpleWorker,
    ForkingWorkerBase,
    Serializer,
    WorkerJob,
)
from ..transport.scheduler_liveness import RateLimitedWarning
from . import boot
from .relay import relay_pending
from .sweep import record_cancelled, record_timed_out, sweep_abandoned

logger = logging.getLogger("kumiko_jobs.worker")
# A statement is in progress on the connection.
_PQ_ACTIVE = TransactionStatus.ACTIVE


def _json_only(kwargs: dict[str, Any]) -> dict[str, Any]:
    # django-rq's rqworker passes --serializer (pickle by default); kumiko reads JSON only.
    kwargs["serializer"] = Serializer
    # Its own job class, which notes the RQ hook fields a message carries (see refusal()).
    kwargs["job_class"] = WorkerJob
    # RQ's description of a message is the runner's call with the whole signed envelope,
    # truncated: noise in the log. RQ then logs the RQ job id; kumiko's own lines name the run.
    kwargs["log_job_description"] = False
    return kwargs


class _HideRQOutcomeLines(logging.Filter):
    """Drops RQ's per-message outcome lines from the ``rq.worker`` logger.

    Kumiko records a failed attempt and returns normally, so RQ would log "Job OK" and
    "Successfully completed job" after it. The runner logs one line per attempt instead
    (``kumiko_jobs.log_context``: ``run succeeded: job=... tenant=... run_id=...`` or
    ``attempt failed: ...``). Installed on the shared logger once; in a kumiko worker process
    every RQ message is a kumiko run, so nothing else is hidden.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if str(record.msg).startswith("Successfully completed"):
            return False
        args = record.args if isinstance(record.args, tuple) else ()
        return not any("Job OK" in str(arg) for arg in args)


def _hide_rq_outcome_lines(log: logging.Logger) -> None:
    if not any(isinstance(f, _HideRQOutcomeLines) for f in log.filters):
        log.addFilter(_HideRQOutcomeLines())


def refusal(job: Any, redis: Any) -> str | None:
    """Why a worker must not run this RQ job (None: it is a kumiko message)."""
    try:
        func_name, instance, args, kwargs = job.func_name, job.instance, job.args, job.kwargs
    except Exception as exc:
        cause = type(exc.__cause__ or exc).__name__
        return f"RQ cannot read the message data ({cause}): kumiko messages are JSON"
    if func_name != RUNNER:
        return f"the message names the function {func_name!r}; kumiko workers only call {RUNNER}"
    if instance is not None:
        return f"the message names an instance ({type(instance).__name__}) to call {RUNNER} on"
    if not isinstance(args, list | tuple) or len(args) != 1 or kwargs != {}:
        return "the message must carry exactly one argument, the signed envelope"
    if isinstance(job, WorkerJob):
        hooks: Any = job.hook_fields
    else:  # loaded by another job class: read the fields from Redis
        hooks = [
            f for f, v in zip(HOOK_FIELDS, redis.hmget(job.key, HOOK_FIELDS), strict=True) if v
        ]
    if hooks:
        return f"the message sets RQ {', '.join(hooks)}, which kumiko never uses"
    return None


class _FinalTimeout(transport.DeathPenaltyBase):
    """RQ's SIGALRM death penalty, which first notes on the run that its timeout fired.

    RQ raises its timeout inside the job; a job that catches ``Exception`` swallows it and would
    "succeed" late. The note, owned by the run, makes the timeout final (``runner.call_job``).
    RQ also uses this class for callbacks and for the forking worker's monitor; only the job's
    own timeout is noted. The runner cancels the alarm when the job body is done
    (``core.current.job_alarm``), so the timeout never interrupts the writes of the run's outcome.
    """

    def __init__(self, timeout: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(timeout, *args, **kwargs)
        exception = args[0] if args else kwargs.get("exception")
        self._job_timeout = isinstance(exception, type) and issubclass(
            exception, transport.JobTimeout
        )

    def setup_death_penalty(self) -> None:
        super().setup_death_penalty()
        if self._job_timeout:
            job_alarm.set(self.cancel_death_penalty)

    def cancel_death_penalty(self) -> None:
        super().cancel_death_penalty()
        if self._job_timeout:
            job_alarm.set(None)

    def handle_death_penalty(self, signum: int, frame: Any) -> None:
        state = current_run.get() if self._job_timeout else None
        if state is not None:
            state.note_timeout(int(self._timeout))
            if _cancel_running_statements():
                # The body waits in a statement. Raising the timeout here would abandon
                # psycopg's wait: the statement would run on in PostgreSQL (holding its locks)
                # and the session would be left mid-query. Instead PostgreSQL cancels it, its
                # error ends the body, and runner.call_job records the attempt as timed out
                # (timeout_fired); the session is clean for the next run.
                return
        super().handle_death_penalty(signum, frame)


def _cancel_running_statements() -> bool:
    """Ask PostgreSQL to cancel the statement each of this thread's connections is executing;
    True if there was one. Runs in a signal handler: libpq's cancel request is made for that
    (its own short connection to the server; the busy one is not touched)."""
    cancelled = False
    for conn in connections.all(initialized_only=True):
        raw = getattr(conn, "connection", None)
        pgconn = getattr(raw, "pgconn", None)
        if pgconn is None or raw is None or raw.closed:
            continue
        if pgconn.transaction_status == _PQ_ACTIVE:
            try:
                raw.cancel()
            except Exception:
                logger.exception("could not cancel the statement of a timed-out attempt")
                continue
            cancelled = True
    return cancelled


def _raw_text(raw: bytes | str) -> str:
    return raw.decode("utf-8", "backslashreplace") if isinstance(raw, bytes) else str(raw)


def _record(message: str, reason: str, job_id: str, queue: str) -> None:
    try:
        record_rejection(message, reason, job_id, queue)
    except Exception:
        # The history is down; the refusal still stands (and RQ's failed registry keeps it).
        logger.exception("could not record rejected message %s: %s", job_id, reason)


class _RefusesForeignMessages:
    """Checks every dequeued message before RQ prepares, forks or calls anything."""

    connection: Any

    def work(self, *args: Any, **kwargs: Any) -> bool:
        # Boot gates and boot jobs run once the worker is configured and before the first
        # message; a failing boot gate raises and the worker never starts.
        boot.on_worker_start(
            set(self.queue_names()),  # type: ignore[attr-defined]
            self._boot_gate_bound,
        )
        return bool(super().work(*args, **kwargs))  # type: ignore[misc]

    def _boot_gate_bound(self, seconds: int) -> Any:
        # The worker's own death penalty: a boot gate's timeout is final like a run's.
        return self.death_penalty_class(  # type: ignore[attr-defined]
            seconds, transport.JobTimeout, job_id="boot"
        )

    def execute_job(self, job: Any, queue: Any) -> None:
        reason = refusal(job, self.connection)
        if reason is None:
            super().execute_job(job, queue)  # type: ignore[misc]
            return
        _record(_raw_text(job.data), reason, job.id, queue.name)
        with self.connection.pipeline() as pipe:
            pipe.lrem(queue.intermediate_queue_key, 1, job.id)
            job.set_status("failed", pipeline=pipe)
            queue.failed_job_registry.add(
                job, ttl=job.failure_ttl, exc_string=reason, pipeline=pipe
            )
            pipe.execute()

    def dequeue_job_and_maintain_ttl(
        self, timeout: int | None, max_idle_time: int | None = None
    ) -> Any:
        while True:
            try:
                return super().dequeue_job_and_maintain_ttl(timeout, max_idle_time)  # type: ignore[misc]
            except Exception as exc:
                # RQ tags a job hash it cannot load with its id and queue; anything else is ours
                # to re-raise. Left alone, the hash would stop this worker and then every other.
                job_id, queue = getattr(exc, "job_id", None), getattr(exc, "queue", None)
                if job_id is None or queue is None:
                    raise
                self._remove_unreadable(str(job_id), queue, exc)

    def _remove_unreadable(self, job_id: str, queue: Any, exc: Exception) -> None:
        key = queue.job_class.key_for(job_id)
        try:
            raw = repr(self.connection.hgetall(key))
        except Exception:
            raw = f"<a Redis {_raw_text(self.connection.type(key))} where a job hash belongs>"
        reason = f"RQ cannot load the job ({type(exc).__name__}: {exc})"
        _record(raw, reason, job_id, queue.name)
        with self.connection.pipeline() as pipe:
            pipe.lrem(queue.intermediate_queue_key, 1, job_id)
            pipe.delete(key)
            pipe.execute()


# --- liveness: which worker executes which run --------------------------------------------

_MAINTENANCE_LOCK = "kumiko:maintenance"
_REDIS_DOWN = (RedisConnectionError, RedisTimeoutError)
_HEARTBEAT_AT_MOST_EVERY = 1.0  # seconds between RQ worker heartbeats sent on their own
_WATCH_EVERY = 0.5  # seconds between the watchdog's looks at the attempt being executed


def _text(value: bytes | str | None) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


def _redis() -> Any:
    return transport.connection_for(conf.get().DEFAULT_QUEUE)


def run_maintenance() -> None:
    """One round of what workers do in the background: sweep, then relay."""
    sweep_abandoned()
    relay_pending()


class _Heart:
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
        self._threads.append(threading.Thread(target=self._beat, name="kumiko-beat", daemon=True))
        if self._overran is not None:
            self._threads.append(
                threading.Thread(target=self._watch, name="kumiko-watchdog", daemon=True)
            )
        if maintenance and conf.get().MAINTENANCE_INTERVAL:
            self._threads.append(
                threading.Thread(target=self._maintain, name="kumiko-maintenance", daemon=True)
            )
        for thread in self._threads:
            thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """End the threads and say goodbye, so nobody waits for the key to expire."""
        self._stop.set()
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(timeout)
        with contextlib.suppress(RedisError), _redis().pipeline(transaction=False) as pipe:
            pipe.delete(WORKER_KEY + self.name)
            pipe.srem(LIVE_WORKERS, self.name)
            pipe.execute()

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
                run_id = run_id_of(current)
                with redis.pipeline(transaction=False) as pipe:
                    pipe.set(WORKER_KEY + self.name, current, ex=settings.WORKER_DEAD_AFTER)
                    pipe.sadd(LIVE_WORKERS, self.name)
                    pipe.set(WORKERS_SINCE_KEY, time.time(), nx=True)
                    if run_id is not None:
                        # A cancellation of the run being executed rides on the beat: one more
                        # command, no extra round trip, no database read inside the job body.
                        pipe.get(cancellation.key_for(run_id))
                    replies = pipe.execute()
                if run_id is not None and replies[-1] is not None:
                    self._cancel_requested(current, _text(replies[-1]) or "")
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

    def _maintain(self) -> None:
        interval = conf.get().MAINTENANCE_INTERVAL
        redis = _redis()
        try:
            # Workers started together spread their rounds over the interval.
            if self._stop.wait(random.uniform(0, interval)):
                return
            while True:
                try:
                    # The lock is left to expire: one round per interval among all workers.
                    if redis.set(_MAINTENANCE_LOCK, self.name, nx=True, ex=interval):
                        run_maintenance()
                except Exception as exc:
                    logger.warning("worker %s: maintenance round failed: %r", self.name, exc)
                    # A connection broken by an outage must not fail every later round.
                    connections.close_all()
                if self._stop.wait(interval):
                    return
        finally:
            connections.close_all()


class _KeepsRunsAlive:
    """Liveness beats, maintenance, and a worker loop that survives Redis outages."""

    connection: Any
    name: str
    key: str
    _heart: _Heart | None = None
    _redis_lost = False
    # RQ's "job <RQ id> result is kept for N seconds" after every message: the run's own line
    # (kumiko_jobs.runs) says what matters, and the result of a kumiko message is not read.
    log_result_lifespan = False

    def work(self, *args: Any, **kwargs: Any) -> bool:
        burst = bool(kwargs.get("burst", args[0] if args else False))
        heart = self._heart = _Heart(
            self.name, self._overran, self._cancel_seen, self._cancel_overran
        )
        # Burst workers (tests, one-off drains) beat but leave maintenance to long-running ones.
        heart.start(maintenance=not burst)
        try:
            return bool(super().work(*args, **kwargs))  # type: ignore[misc]
        finally:
            heart.stop()

    def register_birth(self) -> None:
        super().register_birth()  # type: ignore[misc]
        self.connection.hset(self.key, RQ_WORKER_MARK, "1")

    def execute_job(self, job: Any, queue: Any) -> None:
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
            with self.connection.pipeline(transaction=False) as pipe:
                super().heartbeat(timeout, pipe)  # type: ignore[misc]
                pipe.execute()
        except _REDIS_DOWN as exc:
            self._redis_down(exc)
            return
        if self._redis_lost:
            self._redis_back()

    def set_state(self, state: str, pipeline: Any = None) -> None:
        try:
            super().set_state(state, pipeline)  # type: ignore[misc]
        except _REDIS_DOWN as exc:
            self._redis_down(exc)

    def check_for_suspension(self, burst: bool) -> None:
        try:
            super().check_for_suspension(burst)  # type: ignore[misc]
        except _REDIS_DOWN as exc:
            self._redis_down(exc)
            time.sleep(1)  # no busy loop while Redis is away

    def run_maintenance_tasks(self) -> None:
        try:
            super().run_maintenance_tasks()  # type: ignore[misc]
        except _REDIS_DOWN as exc:
            self._redis_down(exc)

    def teardown(self) -> None:
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
            if not self.connection.exists(self.key):
                self.register_birth()


def _record_overrun(job_id: str, how: str, *, push: bool) -> bool:
    """Record the attempt of ``job_id`` as timed out. False: its outcome was already recorded
    (the attempt ended just now, and only RQ's bookkeeping is left)."""
    kill_after = conf.get().TIMEOUT_KILL_AFTER
    reason = (
        f"the attempt was still running {kill_after} s after its timeout (the job caught the "
        f"timeout, or sat in a call no signal interrupts): {how}"
    )
    try:
        return record_timed_out(job_id, reason, push=push) is not None
    except Exception:
        # PostgreSQL is unreachable: the run stays running, and the sweep hands it back once
        # it sees that no live worker executes it.
        logger.exception("could not record the timed-out attempt of %s", job_id)
        return True


class Worker(_KeepsRunsAlive, _RefusesForeignMessages, BookkeepingSimpleWorker):
    death_penalty_class = _FinalTimeout

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **_json_only(kwargs))
        _hide_rq_outcome_lines(self.log)

    def _overran(self, job_id: str) -> None:
        # The job runs in this process, and a thread cannot stop it: the process leaves, as
        # after a crash, once the attempt is recorded as timed out. The retry is left to the
        # relay (no push here), so it cannot start before this process is gone.
        if not _record_overrun(job_id, f"its worker {self.name} exited to end it", push=False):
            return
        logger.error(
            "worker %s: %s would not stop %s s after its timeout; recorded it as timed out, "
            "exiting (the supervisor starts a new worker)",
            self.name,
            job_id,
            conf.get().TIMEOUT_KILL_AFTER,
        )
        if self._heart is not None:
            self._heart.stop(timeout=1.0)
        os._exit(1)

    def _cancel_seen(self, job_id: str, who: str) -> None:
        # The body runs in this process: the mark is what ctx.cancel_requested reads. A job
        # that never checks runs on to its end or its timeout (no thread can stop it).
        run_id = run_id_of(job_id)
        if run_id is not None:
            cancellation.mark(run_id, who)
            logger.warning("worker %s: cancellation of %s requested by %s", self.name, job_id, who)

    def execute_job(self, job: Any, queue: Any) -> None:
        try:
            super().execute_job(job, queue)
        finally:
            run_id = run_id_of(job.id)
            if run_id is not None:
                cancellation.forget(run_id)
            reset_connections()

    def request_force_stop(self, signum: int, frame: Any) -> None:
        # RQ's cold shutdown raises SystemExit inside the job, and the records step would then
        # fail the run for good. Leave instead, as a crash would: the transaction dies with the
        # connection, and the sweep retries the run (or fails it on its last attempt) as soon
        # as it sees this worker gone, which the goodbye below makes immediate.
        heart, requested = self._heart, getattr(self, "_shutdown_requested_date", None)
        repeated = requested is not None and transport.utcnow() - requested < timedelta(seconds=1)
        if heart is not None and heart.current and not repeated:
            logger.warning(
                "worker %s: cold shutdown during %s; leaving it to the sweep, as after a crash",
                self.name,
                heart.current,
            )
            heart.stop(timeout=1.0)
            os._exit(1)
        super().request_force_stop(signum, frame)


class ForkingWorker(_KeepsRunsAlive, _RefusesForeignMessages, ForkingWorkerBase):
    death_penalty_class = _FinalTimeout
    # (RQ job id, pid) of the current work horse, and the RQ job whose horse the watchdog
    # killed for outliving its timeout.
    _horse_of: tuple[str, int] = ("", 0)
    _killed_for_timeout = ""
    _killed_for_cancel = ""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **_json_only(kwargs))
        _hide_rq_outcome_lines(self.log)

    def _overran(self, job_id: str) -> None:
        # RQ's own monitor would kill the horse 60 to 90 s after the timeout (it checks every
        # job_monitoring_interval, 30 s, for timeout + 60 s); the watchdog does it sooner. The
        # horse called setpgrp, so its group is its pid: the kill takes its children too.
        horse_job, pid = self._horse_of
        if horse_job != job_id or not pid:
            return
        logger.error(
            "worker %s: %s would not stop %s s after its timeout; killing its work horse %s",
            self.name,
            job_id,
            conf.get().TIMEOUT_KILL_AFTER,
            pid,
        )
        self._killed_for_timeout = job_id
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)

    def work(self, *args: Any, **kwargs: Any) -> bool:
        cancellation.listen_for_signal()
        return bool(super().work(*args, **kwargs))

    def _cancel_seen(self, job_id: str, who: str) -> None:
        # The body runs in the work horse: signal it (its handler marks the run there). Its
        # grace period starts now; see _cancel_overran.
        horse_job, pid = self._horse_of
        if horse_job != job_id or not pid:
            return
        logger.warning(
            "worker %s: cancellation of %s requested by %s; told its work horse %s",
            self.name,
            job_id,
            who,
            pid,
        )
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, cancellation.SIGNAL)

    def _cancel_overran(self, job_id: str) -> None:
        horse_job, pid = self._horse_of
        if horse_job != job_id or not pid:
            return
        logger.error(
            "worker %s: cancelled %s still running %s s after the request; killing its work "
            "horse %s",
            self.name,
            job_id,
            conf.get().CANCEL_GRACE,
            pid,
        )
        self._killed_for_cancel = job_id
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)

    def handle_work_horse_killed(self, job: Any, retpid: Any, ret_val: Any, rusage: Any) -> None:
        super().handle_work_horse_killed(job, retpid, ret_val, rusage)
        if self._killed_for_cancel == job.id:
            self._killed_for_cancel = ""
            try:
                record_cancelled(
                    job.id, f"its worker {self.name} killed the work horse after CANCEL_GRACE"
                )
            except Exception:
                # PostgreSQL unreachable: the sweep ends the run (cancelled) once it sees no
                # live worker executes it.
                logger.exception("could not record the cancelled attempt of %s", job.id)
            return
        if self._killed_for_timeout == job.id:
            self._killed_for_timeout = ""
            # The horse is dead and reaped: the retry may be pushed at once.
            _record_overrun(job.id, f"its worker {self.name} killed the work horse", push=True)

    def _after_redis_loss(self) -> None:
        # Do not take the next message while the horse of this one may still be running.
        with contextlib.suppress(OSError):
            if self.horse_pid:
                self.wait_for_horse()

    def execute_job(self, job: Any, queue: Any) -> None:
        try:
            super().execute_job(job, queue)
        finally:
            self._horse_of = ("", 0)

    def fork_work_horse(self, job: Any, queue: Any) -> None:
        connections.close_all()
        super().fork_work_horse(job, queue)
        self._horse_of = (job.id, self.horse_pid)

    def perform_job(self, job: Any, queue: Any, execution: Any) -> bool:
        try:
            if self.is_horse:
                run_id = run_id_of(job.id)
                if run_id is not None:
                    cancellation.horse_executes(run_id)
            return bool(super().perform_job(job, queue, execution))
        finally:
            if self.is_horse:
                telemetry_flush.flush()
                connections.close_all()
