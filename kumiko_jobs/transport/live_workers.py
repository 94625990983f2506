"""Worker liveness: which kumiko worker executes which RQ job, read from the keys it beats.

Each kumiko worker ``beat``s: it writes the RQ job it executes under ``keys.WORKER_KEY`` + its
name, with a TTL, and its name into ``keys.LIVE_WORKERS`` (and says ``goodbye`` when it stops);
the sweep and the relay read a ``Liveness`` snapshot to tell a run whose worker died from one
still running. When liveness cannot be known
(Redis down, or emptied since the workers last beat) ``liveness()`` says so, and callers fall
back to the timeout rule.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

from redis.exceptions import RedisError
from rq.worker import SimpleWorker as RQSimpleWorker

from ..core import conf
from ..core.envelope import run_id_of
from .keys import CANCEL_KEY, LIVE_WORKERS, RQ_WORKER_MARK, WORKER_KEY, WORKERS_SINCE_KEY
from .queues import connection_for, decoded
from .rq_job import JsonJob

# The worker's logger (named as when the worker was one module): users' LOGGING may route it.
_liveness_logger = logging.getLogger("kumiko_jobs.worker")


def beat(redis: Any, worker: str, rq_job_id: str, dead_after: int) -> str | None:
    """One liveness beat of ``worker``, executing ``rq_job_id`` ("" when idle), in one round trip.

    The key lives ``dead_after`` seconds unless the next beat renews it. Returns who asked to
    cancel the run being executed ("" if unknown; None: nobody, or no run): the request rides on
    the beat, one more command and no database read while the job body runs (run/cancellation).
    Raises ``RedisError`` like any command; the worker's beat thread reports it and goes on.
    """
    run_id = run_id_of(rq_job_id)
    with redis.pipeline(transaction=False) as pipe:
        pipe.set(WORKER_KEY + worker, rq_job_id, ex=dead_after)
        pipe.sadd(LIVE_WORKERS, worker)
        pipe.set(WORKERS_SINCE_KEY, time.time(), nx=True)
        if run_id is not None:
            pipe.get(CANCEL_KEY + run_id)
        replies = pipe.execute()
    if run_id is None or replies[-1] is None:
        return None
    return decoded(replies[-1]) or ""


def request_cancel(redis: Any, run_id: str, who: str, ttl: int) -> None:
    """Ask the worker executing ``run_id`` (hex) to cancel it: the key its ``beat`` reads, saying
    who asked ("-" when nobody is named); it expires after ``ttl`` seconds."""
    redis.set(CANCEL_KEY + run_id, who or "-", ex=max(ttl, 1))


def goodbye(redis: Any, worker: str) -> None:
    """``worker`` stopped: its keys go now, so nobody waits for them to expire (a failure to say
    so is ignored: the key's TTL ends it anyway)."""
    with contextlib.suppress(RedisError), redis.pipeline(transaction=False) as pipe:
        pipe.delete(WORKER_KEY + worker)
        pipe.srem(LIVE_WORKERS, worker)
        pipe.execute()


def vanished_workers(redis: Any) -> list[str]:
    """Workers in ``keys.LIVE_WORKERS`` whose beat key expired: they stopped beating without a
    goodbye (killed, OOM, machine lost). Two round trips and no database read, so every worker
    can look every beat; the sweep then hands their runs back (and drops them from the set).

    Redis expires the key itself, ``dead_after`` seconds after the last beat: the clock that
    decides is Redis's, never a worker's. Raises ``RedisError`` like any command.
    """
    names = sorted(name for n in redis.smembers(LIVE_WORKERS) if (name := decoded(n)))
    if not names:
        return []
    present = redis.mget([WORKER_KEY + n for n in names])
    return [n for n, v in zip(names, present, strict=True) if v is None]


class Liveness:
    """A snapshot of the live kumiko workers and the RQ job each executes."""

    def __init__(self, workers: dict[str, str], redis: Any):
        self.workers = workers
        self._redis = redis
        self._jobs = {job for job in workers.values() if job}
        # RQ job ids of runs start with kj-<run id>; the run also counts as executed when a
        # later message of it is (the records step lets a newer attempt take a run over).
        self._runs = {run for job in self._jobs if (run := run_id_of(job))}

    def executes(self, rq_job_id: str, run_hex: str) -> bool:
        """Does a live worker execute this RQ job, or a later message of the same run?"""
        return rq_job_id in self._jobs or run_hex in self._runs

    def worker_of(self, rq_job_id: str) -> str | None:
        """The RQ worker that took this RQ job, as RQ recorded it (None when unknown)."""
        if not rq_job_id:
            return None
        return decoded(self._redis.hget(JsonJob.key_for(rq_job_id), "worker_name"))

    def is_gone(self, worker: str) -> bool:
        """True unless ``worker`` is a live kumiko worker or a live RQ worker of another kind."""
        if worker in self.workers:
            return False
        key = RQSimpleWorker.redis_worker_namespace_prefix + worker
        birth, mark = self._redis.hmget(key, "birth", RQ_WORKER_MARK)
        return birth is None or mark is not None


def liveness() -> Liveness | None:
    """Which workers are alive now, or None when that cannot be known (Redis down or just
    emptied): callers then fall back to the timeout rule."""
    settings = conf.get()
    redis = connection_for(settings.DEFAULT_QUEUE)
    try:
        since = redis.get(WORKERS_SINCE_KEY)
        if since is None or time.time() - float(since) < settings.WORKER_DEAD_AFTER:
            return None
        names = sorted(name for n in redis.smembers(LIVE_WORKERS) if (name := decoded(n)))
        values = redis.mget([WORKER_KEY + n for n in names]) if names else []
    except RedisError as exc:
        _liveness_logger.warning("worker liveness unknown: %s", exc)
        return None
    workers = {n: decoded(v) or "" for n, v in zip(names, values, strict=True) if v is not None}
    gone = [n for n in names if n not in workers]
    if gone:
        with contextlib.suppress(RedisError):
            redis.srem(LIVE_WORKERS, *gone)
    return Liveness(workers, redis)
