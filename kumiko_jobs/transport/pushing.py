"""Putting messages on their queues: now, at the front, delayed, or behind a rate limit.

Every message carries its fair field in the RQ job's ``meta`` (bucket, weight, priority, job),
so that the fair dequeue (``fair.py``) files it without asking anyone; it is written with the
job hash, in the same transaction, whichever way the message then reaches the queue.

The one way a message reaches Redis (the enqueue's on-commit push, fan-out's thousands, a
follow-up, the relay, a cron tick). Delayed messages go to rq-scheduler's set, which the
``rqscheduler`` process moves to the queue when due; rate-limited ones go through RQ's own
admission script; the rest in one script call per queue and slice (``job_hashes.py``), which
also rings the queue's doorbell (``doorbell.py``: a worker waiting behind paused or
rate-limited work wakes at once).
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from rq import RateLimit

from ..core import conf
from .job_hashes import push_slices
from .queues import Message, delayed_set, get_queue
from .rq_job import RUNNER

# Messages per MULTI/EXEC: Redis runs a transaction's commands without serving anyone else.
_PIPELINE_MESSAGES = 1000


def push(message: Message) -> None:
    """Put one message on its queue now, or in the scheduler when it has a delay."""
    push_many([message])


def push_many(messages: Iterable[Message]) -> None:
    """Push messages with one Redis pipeline per queue (fan-out pushes thousands at once).

    Rate-limited messages go one by one: RQ admits them through a Lua script that cannot run
    inside a pipeline. The rest are written as RQ's own job hashes, without an RQ ``Job`` per
    message (job_hashes.py).
    """
    settings = conf.get()
    batches: dict[str, list[Message]] = {}
    for msg in messages:
        if msg.delay > 0:
            _push_delayed(msg, settings.RESULT_TTL)
        elif msg.rate_limit:
            get_queue(msg.queue).enqueue_call(
                RUNNER,
                args=(msg.body,),
                job_id=msg.job_id,
                timeout=msg.timeout,
                result_ttl=settings.RESULT_TTL,
                failure_ttl=settings.FAILURE_TTL,
                rate_limit=RateLimit(msg.rate_limit_key, msg.rate_limit),
                at_front=msg.at_front,
                meta=msg.meta,
            )
        else:
            batches.setdefault(msg.queue, []).append(msg)
    for queue_name, batch in batches.items():
        push_slices(
            get_queue(queue_name),
            batch,
            settings.RESULT_TTL,
            settings.FAILURE_TTL,
            _PIPELINE_MESSAGES,
        )


def _push_delayed(msg: Message, result_ttl: int) -> None:
    """Into rq-scheduler's set, scored with its due time to the microsecond: one pipeline.

    rq-scheduler's own ``enqueue_in`` scores whole seconds, rounded down, so a message was
    moved up to a second before its due time (a 300 ms backoff ran after 10 ms). The due time
    is counted from now, after the message was signed: never before its signed ``due_at``.
    """
    delayed = delayed_set(msg.queue)
    # rq-scheduler's job factory (DjangoScheduler's defaults, JSON job class), unsaved.
    job = delayed._create_job(  # type: ignore[no-untyped-call]  # django-rq: untyped
        RUNNER,
        args=(msg.body,),
        id=msg.job_id,
        timeout=msg.timeout,
        result_ttl=result_ttl,
        queue_name=msg.queue,
        meta=msg.meta,
        commit=False,
    )
    if msg.rate_limit:
        # Admitted by RQ when the scheduler moves it to the queue (Queue.enqueue_job).
        job.rate_limit_key, job.rate_limit_concurrency = msg.rate_limit_key, msg.rate_limit
    with delayed.connection.pipeline() as pipe:
        job.save(pipeline=pipe)
        pipe.zadd(delayed.scheduled_jobs_key, {job.id: time.time() + msg.delay})
        pipe.execute()
