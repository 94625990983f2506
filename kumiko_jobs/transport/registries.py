"""Where RQ holds a message now, for the relay's search for lost and stranded messages.

The relay decides from the run rows which messages should exist; whether RQ still holds them
is a question about RQ's job hashes and the queue's intermediate list (messages a worker took
off the queue and has not started yet), answered here so that the relay reads no RQ internals.
The policy (which states count as dead, how long "taken" may last) stays the relay's.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from rq.utils import utcparse

from .keys import RELAY_TAKEN
from .queues import decoded, get_queue
from .rq_job import JsonJob

# How long the first sighting of a taken, unstarted message is remembered (seconds).
_TAKEN_MEMORY = 3600


@dataclass(frozen=True, slots=True)
class HeldMessage:
    """What RQ records of one RQ job id: its status, its worker, and whether it is taken."""

    job_id: str
    status: str | None  # RQ's job status; None: no job hash (RQ holds no such message)
    worker: str | None  # the RQ worker that started it, as RQ recorded it
    taken: bool  # in the queue's intermediate list: dequeued by a worker, maybe not started
    started_at: float | None = None  # epoch seconds its worker marked it started (RQ's field)


def held_messages(queue: str, job_ids: Sequence[str]) -> list[HeldMessage]:
    """What RQ holds of each of ``job_ids`` (bound for ``queue``), in their order; one round
    trip for the whole batch."""
    rq_queue = get_queue(queue)
    with rq_queue.connection.pipeline(transaction=False) as pipe:
        pipe.lrange(rq_queue.intermediate_queue_key, 0, -1)
        for job_id in job_ids:
            pipe.hmget(JsonJob.key_for(job_id), "status", "worker_name", "started_at")
        replies = iter(pipe.execute())
    taken = {decoded(job_id) for job_id in next(replies)}
    held = []
    for job_id in job_ids:
        status, worker, started = (decoded(v) for v in next(replies))
        held.append(HeldMessage(job_id, status, worker, job_id in taken, _epoch(started)))
    return held


def _epoch(started: str | None) -> float | None:
    """RQ's ``started_at`` (UTC text) as epoch seconds; None when absent or unreadable."""
    if not started:
        return None
    try:
        return utcparse(started).timestamp()
    except ValueError:
        return None


def taken_for(queue: str, job_id: str) -> float:
    """Seconds since the relay first saw ``job_id`` taken off ``queue`` and not started
    (0 at the first sighting, which this call records)."""
    redis = get_queue(queue).connection
    key = RELAY_TAKEN + job_id
    now = time.time()
    if redis.set(key, now, nx=True, ex=_TAKEN_MEMORY):
        return 0.0
    seen = float(decoded(redis.get(key)) or now)
    return now - seen


def forget_messages(entries: Iterable[tuple[str, str]]) -> None:
    """Drop RQ's records of the given (queue, RQ job id) messages: the failed and started
    registry entries, the intermediate list entry, the job hash and the relay's sighting, so
    that a new push of the same id starts from a clean job hash (and RQ's cleanup of the
    started registry never fails the new push for the old start)."""
    by_queue: dict[str, list[str]] = {}
    for queue, job_id in entries:
        by_queue.setdefault(queue, []).append(job_id)
    for queue_name, ids in by_queue.items():
        rq_queue = get_queue(queue_name)
        started_key = rq_queue.started_job_registry.key
        # Started entries are "<job id>:<execution id>": found by their prefix.
        started = [
            entry
            for job_id in ids
            for entry, _ in rq_queue.connection.zscan_iter(started_key, match=f"{job_id}:*")
        ]
        with rq_queue.connection.pipeline() as pipe:
            if started:
                pipe.zrem(started_key, *started)
            for job_id in ids:
                pipe.zrem(rq_queue.failed_job_registry.key, job_id)
                pipe.lrem(rq_queue.intermediate_queue_key, 0, job_id)
                pipe.delete(JsonJob.key_for(job_id), RELAY_TAKEN + job_id)
            pipe.execute()
