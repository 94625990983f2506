"""The load as Redis sees it, for the dashboard and the metrics endpoint: queue depths and workers.

Read with RQ's own accessors (``Queue.count``, the started registry, ``Worker.all``), so they
hold whatever decides the order of a queue's messages. A few round trips per queue and per
worker; nothing here writes.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from rq import Worker
from rq.registry import StartedJobRegistry
from rq.utils import utcparse

from ..core import project_settings
from ..core.envelope import run_id_of
from .keys import WORKER_KEY
from .queues import decoded, get_queue, redis_identity
from .rq_job import JsonJob

# A dashboard lists this many workers at most: a bigger fleet is counted, not listed.
MAX_WORKERS_LISTED = 200


@dataclass(frozen=True, slots=True)
class QueueDepth:
    """One queue: messages waiting on it, and messages its workers hold (started)."""

    queue: str
    waiting: int
    started: int


def queue_depths() -> list[QueueDepth]:
    """Every ``RQ_QUEUES`` queue's depth, in the setting's order: ``Queue.count`` (whatever the
    queue class counts as waiting) and the started registry's size, a round trip each."""
    depths = []
    for name in project_settings.rq_queue_names():
        queue = get_queue(name)
        started = StartedJobRegistry(queue=queue).count
        depths.append(QueueDepth(name, int(queue.count), int(started)))
    return depths


@dataclass(frozen=True, slots=True)
class WorkerState:
    """One RQ worker as it registered itself, and what it executes now."""

    name: str
    queues: tuple[str, ...]
    state: str
    last_heartbeat: datetime | None
    birth: datetime | None
    rq_job_id: str  # "" when idle
    run_id: str  # the kumiko run (hex) of that message, "" for none or another kind of job
    busy_since: datetime | None
    kumiko: bool  # it beats kumiko's liveness key (a kumiko worker, alive by that key)


def workers() -> tuple[list[WorkerState], int]:
    """The registered RQ workers of every Redis the queues use (at most
    ``MAX_WORKERS_LISTED``), and how many there are in all."""
    listed: list[WorkerState] = []
    total = 0
    seen: set[tuple[Any, ...]] = set()
    for name in project_settings.rq_queue_names():
        redis = get_queue(name).connection
        if redis_identity(redis) in seen:
            continue
        seen.add(redis_identity(redis))
        found = Worker.all(connection=redis)
        total += len(found)
        for worker in found[: max(MAX_WORKERS_LISTED - len(listed), 0)]:
            listed.append(_state(redis, worker))
    return sorted(listed, key=lambda w: w.name), total


def _state(redis: Any, worker: Any) -> WorkerState:
    job_id = worker.get_current_job_id() or ""
    with redis.pipeline(transaction=False) as pipe:
        pipe.get(WORKER_KEY + worker.name)
        pipe.hget(JsonJob.key_for(job_id), "started_at") if job_id else pipe.echo("")
        beat, started = pipe.execute()
    started_text = decoded(started) or ""
    return WorkerState(
        name=worker.name,
        queues=tuple(worker.queue_names()),
        state=str(worker.get_state()),
        last_heartbeat=_aware(worker.last_heartbeat),
        birth=_aware(worker.birth_date),
        rq_job_id=job_id,
        run_id=(run_id_of(job_id) or "") if job_id else "",
        busy_since=_aware(utcparse(started_text)) if started_text else None,
        kumiko=beat is not None,
    )


def _aware(moment: datetime | None) -> datetime | None:
    # RQ stores UTC without a zone; the dashboard compares with aware times.
    if moment is None or moment.tzinfo is not None:
        return moment
    return moment.replace(tzinfo=UTC)
