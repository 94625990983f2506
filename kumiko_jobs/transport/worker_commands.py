"""The Redis commands of the worker mixins (worker/keeps_alive.py, worker/foreign.py).

RQ's own protocol, as the worker adds to it: the kumiko mark in RQ's worker hash, whether that
hash still exists, RQ's heartbeat sent as one round trip, and what becomes of a message the
worker refuses (failed in RQ, never called) or of a job hash RQ cannot load (removed), with
RQ's start of it that the dequeue script wrote (``forget_start``) and the worker's ``busy`` it
wrote (``idle_after_refusal``). Each is the same commands,
in the same round trips, as the mixins sent themselves.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rq.executions import Execution, ExecutionRegistry
from rq.worker import WorkerStatus

from .errors import RedisError
from .keys import RQ_WORKER_MARK
from .queues import decoded
from .rate_limits import release_caps
from .rq_job import HOOK_FIELDS


def mark_kumiko_worker(redis: Any, worker_key: str) -> None:
    """Set the kumiko mark in RQ's hash of a worker (``worker_key``), by which liveness tells a
    kumiko worker from another class (``Liveness.is_gone``)."""
    redis.hset(worker_key, RQ_WORKER_MARK, "1")


def is_registered(redis: Any, worker_key: str) -> bool:
    """Whether RQ's hash of a worker still exists (a restart without persistence forgets it)."""
    return bool(redis.exists(worker_key))


@contextmanager
def one_round_trip(redis: Any) -> Iterator[Any]:
    """A pipeline (no transaction) for RQ's commands, sent as one round trip when the block
    ends without an error (nothing is sent when it raises)."""
    with redis.pipeline(transaction=False) as pipe:
        yield pipe
        pipe.execute()


def hooks_in_hash(redis: Any, job: Any) -> list[str]:
    """The RQ hook fields (``HOOK_FIELDS``) set in ``job``'s hash, read from Redis: for a job
    loaded by another class than ``WorkerJob``, which notes them while loading."""
    return [f for f, v in zip(HOOK_FIELDS, redis.hmget(job.key, HOOK_FIELDS), strict=True) if v]


def forget_start(pipe: Any, queue: Any, started: Execution | None) -> None:
    """Remove RQ's start of a message the worker refuses, as the dequeue script wrote it
    (``rq_start.py``; None: it wrote none): the execution's hash, its entry in the job's
    execution registry, in ``StartedJobRegistry`` and in the worker's execution set. What RQ's
    ``Execution.delete`` removes, without the job it needs (an unreadable one has none): left,
    the message would count as started until RQ's TTL cleanup."""
    if started is None:
        return
    pipe.delete(started.key)
    # (the pipeline as the registry's connection, as RQ's Execution.create passes it)
    pipe.zrem(ExecutionRegistry(job_id=started.job_id, connection=pipe).key, started.id)
    pipe.zrem(queue.started_job_registry.key, started.composite_key)
    if started.worker_name:
        pipe.srem(started.worker_executions_key, started.composite_key)


def idle_after_refusal(pipe: Any, worker: Any, started: Execution | None) -> None:
    """The worker's state ``idle`` again, in the refusal's transaction, when the dequeue script
    wrote ``busy`` with the start (``rq_start.py``): no job of it runs, so no finish writes
    ``idle``, and the worker, which believes ``idle`` is still what its hash says (it writes a
    state only when it changes), would skip RQ's before the next dequeue: ``rq info`` would
    show it busy until its next job."""
    if started is not None and worker is not None:
        worker.set_state(WorkerStatus.IDLE, pipeline=pipe)


def fail_refused(redis: Any, job: Any, queue: Any, reason: str, worker: Any = None) -> None:
    """A refused message taken off ``queue``'s intermediate list and failed in RQ, with
    ``reason`` as its error, without being called, RQ's start of it that the dequeue script
    wrote removed and ``worker`` idle again (one transaction); then the cap slots its pick took
    are freed."""
    started = getattr(job, "kumiko_execution", None)
    with redis.pipeline() as pipe:
        forget_start(pipe, queue, started)
        idle_after_refusal(pipe, worker, started)
        pipe.lrem(queue.intermediate_queue_key, 1, job.id)
        job.set_status("failed", pipeline=pipe)
        queue.failed_job_registry.add(job, ttl=job.failure_ttl, exc_string=reason, pipeline=pipe)
        pipe.execute()
    charge = getattr(job, "kumiko_charge", None)
    if charge is not None:
        free_caps(redis, charge.job_id, charge.caps)


def unreadable_job_dump(redis: Any, queue: Any, job_id: str) -> str:
    """What Redis holds under the job hash RQ could not load, for the rejection record: the
    hash's fields, or what else is stored where a job hash belongs."""
    key = queue.job_class.key_for(job_id)
    try:
        return repr(redis.hgetall(key))
    except Exception:
        return f"<a Redis {decoded(redis.type(key))} where a job hash belongs>"


def remove_unreadable_job(
    redis: Any,
    queue: Any,
    job_id: str,
    started: Execution | None = None,
    caps: str = "",
    worker: Any = None,
) -> None:
    """The job hash RQ could not load removed, its id from ``queue``'s intermediate list, and
    ``started``, RQ's start of it that the dequeue script wrote (``forget_start``; ``worker``
    idle again), in one transaction, so that it stops no other worker and counts as started
    nowhere; then the slots its pick took of ``caps`` (the dequeue's JSON) are freed."""
    with redis.pipeline() as pipe:
        forget_start(pipe, queue, started)
        idle_after_refusal(pipe, worker, started)
        pipe.lrem(queue.intermediate_queue_key, 1, job_id)
        pipe.delete(queue.job_class.key_for(job_id))
        pipe.execute()
    free_caps(redis, job_id, caps)


def free_caps(redis: Any, job_id: str, caps: str) -> None:
    """Free the cap slots the dequeue's pick took for a message the worker refused (no finish
    frees them), so that its tenant is not held at its cap by a message that never runs."""
    if not caps:
        return
    # Redis away: the relay's repair frees the slot (rate_limits.py).
    with contextlib.suppress(RedisError):
        release_caps(redis, job_id, caps)
