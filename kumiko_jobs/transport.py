"""The only module that imports RQ, django-rq and rq-scheduler.

Every kumiko message is an RQ job whose function is ``kumiko_jobs.runner.execute`` and whose
single argument is the signed envelope string, stored with RQ's JSON serializer: no pickle
ever crosses Redis, so a forged message cannot execute code while being decoded.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import django_rq
from django_rq.queues import DjangoScheduler
from redis import Redis
from rq import Queue, get_current_job
from rq.job import Job
from rq.serializers import JSONSerializer
from rq.worker import SimpleWorker as RQSimpleWorker
from rq.worker import Worker as RQForkingWorker

from . import conf

RUNNER = "kumiko_jobs.runner.execute"

# Re-exported for worker.py, which adds per-run hygiene to RQ's worker classes.
SimpleWorkerBase = RQSimpleWorker
ForkingWorkerBase = RQForkingWorker
Serializer = JSONSerializer


class JsonJob(Job):
    """An RQ job that reads and writes JSON unless told otherwise (used by the scheduler)."""

    def __init__(
        self, id: str | None = None, connection: Redis | None = None, serializer: Any = None
    ):
        super().__init__(id=id, connection=connection, serializer=serializer or JSONSerializer)


class Scheduler(DjangoScheduler):
    """rq-scheduler that reads kumiko's JSON jobs. Set ``RQ["SCHEDULER_CLASS"]`` to this."""

    job_class = JsonJob

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["job_class"] = JsonJob
        super().__init__(*args, **kwargs)


@dataclass(frozen=True, slots=True)
class Message:
    """One push: a signed envelope string bound for a queue under a deterministic job id."""

    body: str
    queue: str
    job_id: str
    timeout: int
    delay: float = 0.0


def get_queue(name: str) -> Queue:
    # commit_mode="auto": kumiko decides when to push (on_commit in enqueue.py); django-rq's
    # own deferral would hold the push until the *request* commits, which is not ours to know.
    return django_rq.get_queue(name, serializer=JSONSerializer, commit_mode="auto")


def connection_for(queue: str) -> Redis:
    return get_queue(queue).connection


def scheduler_for(queue: str) -> Scheduler:
    q = get_queue(queue)
    return Scheduler(queue_name=queue, queue=q, connection=q.connection)


def push(message: Message) -> None:
    """Put one message on its queue now, or in the scheduler when it has a delay."""
    push_many([message])


def push_many(messages: Iterable[Message]) -> None:
    """Push messages with one Redis pipeline per queue (fan-out pushes thousands at once)."""
    settings = conf.get()
    now_messages: dict[str, list[Message]] = {}
    for msg in messages:
        if msg.delay > 0:
            scheduler_for(msg.queue).enqueue_in(
                timedelta(seconds=msg.delay),
                RUNNER,
                msg.body,
                job_id=msg.job_id,
                timeout=msg.timeout,
                job_result_ttl=settings.RESULT_TTL,
                queue_name=msg.queue,
            )
        else:
            now_messages.setdefault(msg.queue, []).append(msg)
    for queue_name, batch in now_messages.items():
        queue = get_queue(queue_name)
        datas = [
            Queue.prepare_data(
                RUNNER,
                args=(m.body,),
                job_id=m.job_id,
                timeout=m.timeout,
                result_ttl=settings.RESULT_TTL,
                failure_ttl=settings.FAILURE_TTL,
            )
            for m in batch
        ]
        queue.enqueue_many(datas)


def current_job_id() -> str:
    job = get_current_job()
    return job.id if job is not None else ""


def current_job_origin() -> str:
    job = get_current_job()
    return job.origin if job is not None else ""


def scheduled_job_ids(queue: str) -> Sequence[str]:
    return [j.id for j in scheduler_for(queue).get_jobs()]


def move_due_scheduled_jobs(queue: str) -> int:
    """What ``rqscheduler`` does on every tick: move due jobs to their queues."""
    scheduler = scheduler_for(queue)
    due = list(scheduler.get_jobs_to_queue())
    for job in due:
        scheduler.enqueue_job(job)
    return len(due)


def queue_length(queue: str) -> int:
    return int(get_queue(queue).count)


def utcnow() -> datetime:
    return datetime.now(UTC)
