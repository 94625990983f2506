"""Handles on kumiko's Redis: the RQ queues, their connections, and rq-scheduler's delayed set.

One queue instance (and one Redis connection pool) per queue name and process, dropped when
the RQ settings change; ``redis_identity`` tells the queues' Redis datasets apart for the
callers that visit each dataset once (the scheduler's lag, the relay's lost slots). Everything
that writes or reads messages starts from a handle taken here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import django_rq
from django.core.signals import setting_changed
from django.dispatch import receiver
from django_rq.queues import DjangoScheduler
from redis import Redis
from redis.sentinel import SentinelConnectionPool
from rq import Queue, get_current_job
from rq.serializers import JSONSerializer

from ..core import conf
from . import fair
from .cuts import through_cuts
from .fair_policy import valid_priority
from .keys import BOOT_DATASET_KEY
from .rq_job import JsonJob


@dataclass(frozen=True, slots=True)
class Message:
    """One push: a signed envelope string bound for a queue under a deterministic job id."""

    body: str
    queue: str
    job_id: str
    timeout: int
    delay: float = 0.0
    # RQ RateLimit: at most ``rate_limit`` messages with this key queued-or-running at once.
    rate_limit_key: str = ""
    rate_limit: int = 0
    # Put it at the front of its queue (RQ's at_front; kumiko's own messages use ``priority``
    # instead); a delayed one joins the back when rq-scheduler moves it to the queue.
    at_front: bool = False
    # Where the fair dequeue files it (transport/fair.py): its tenant's bucket ("" : no fair
    # field, the bucket of foreign messages), the tenant's weight, the priority level, the job.
    bucket: str = ""
    weight: float = 1.0
    priority: int = 0
    job: str = ""
    # Rate-limit windows its start counts in (key, starts, seconds; fair.py enforces them).
    rates: tuple[tuple[str, int, int], ...] = ()
    # Concurrency caps its run takes a slot of (key, limit, scope "t" or "j"; fair_caps.py).
    caps: tuple[tuple[str, int, str], ...] = ()

    @property
    def meta(self) -> dict[str, Any] | None:
        """The RQ job's ``meta``: the fair field the dequeue script reads from the job hash."""
        if not self.bucket:
            return None
        fair: list[Any] = [self.bucket, self.weight, self.priority, self.job]
        if self.rates or self.caps:
            fair.append([list(rate) for rate in self.rates])
        if self.caps:
            fair.append([list(cap) for cap in self.caps])
        return {"kumiko_fair": fair}


_queues: dict[tuple[str, int], Queue] = {}


def get_queue(name: str) -> Queue:
    """The queue, one instance (and one Redis connection pool) per name and process.

    django-rq builds a new Redis client on every call, which costs a TCP connection per
    enqueue; a forked process must not share the parent's sockets, hence the pid in the key.
    """
    key = (name, os.getpid())
    queue = _queues.get(key)
    if queue is None:
        # commit_mode="auto": kumiko decides when to push (on_commit in enqueueing/outbox.py);
        # django-rq's own deferral would hold the push until the *request* commits.
        queue = django_rq.get_queue(name, serializer=JSONSerializer, commit_mode="auto")
        _queues[key] = queue
    return queue


def redis_identity(redis: Redis) -> tuple[Any, ...]:
    """Which Redis dataset a client talks to, for telling the queues' Redis apart.

    A client from django-rq's ``SENTINELS`` configuration has no host of its own (its pool asks
    the Sentinels for the current primary on every new connection): the service name, the
    Sentinels and the database identify it, wherever the primary is now.
    """
    pool = redis.connection_pool
    kwargs = pool.connection_kwargs
    if isinstance(pool, SentinelConnectionPool):
        service = pool.service_name
        sentinels = tuple(
            sorted(
                (
                    s.connection_pool.connection_kwargs.get("host"),
                    s.connection_pool.connection_kwargs.get("port"),
                )
                for s in pool.sentinel_manager.sentinels
            )
        )
        return ("sentinel", service, sentinels, kwargs.get("db"))
    return (kwargs.get("host"), kwargs.get("port"), kwargs.get("path"), kwargs.get("db"))


def forget_queues() -> None:
    """Drop cached queues (settings changed, e.g. RQ_QUEUES in a test)."""
    _queues.clear()


@receiver(setting_changed)
def _forget_queues_on_change(*, setting: str, **_: object) -> None:
    # Connected here, not in conf: the settings reader stays below the transport.
    if setting in {"RQ_QUEUES", "RQ"}:
        forget_queues()


def connection_for(queue: str) -> Redis:
    """The Redis client of ``queue`` (the queue's own pool: no new connection per call)."""
    return get_queue(queue).connection


def boot_dataset_token(candidate: str) -> str:
    """The token of this Redis dataset for the boot jobs (worker/boot.py), set to ``candidate``
    first if it has none (one round trip): it identifies the dataset until it is flushed.

    Read when a worker starts, outside RQ's loop: a cut connection is tried again
    (``cuts.through_cuts``) rather than ending the worker. Repeating it is safe: a try whose
    reply was lost set the token, and the next one reads it (``SET NX`` leaves it as it is).
    """
    redis = get_queue(conf.get().DEFAULT_QUEUE).connection

    def set_and_read() -> Any:
        with redis.pipeline(transaction=True) as pipe:
            pipe.set(BOOT_DATASET_KEY, candidate, nx=True)
            pipe.get(BOOT_DATASET_KEY)
            return pipe.execute()[1]

    value = through_cuts(set_and_read, "reading the boot jobs' dataset token", f"pid {os.getpid()}")
    return value.decode() if isinstance(value, bytes) else str(value)


def decoded(value: bytes | str | None) -> str | None:
    """A Redis reply as text (replies arrive as bytes unless the client decodes them)."""
    return value.decode() if isinstance(value, bytes) else value


def current_job_id() -> str:
    """The RQ job id of the message this worker executes now (``""`` outside a worker)."""
    job = get_current_job()
    return job.id if job is not None else ""


def current_priority(run_id: str) -> int | None:
    """The priority level of the message executing now when it belongs to run ``run_id``
    (hex), read from the job RQ already loaded (no round trip); None otherwise."""
    job = get_current_job()
    if job is None or not job.id.startswith(f"kj-{run_id}-"):
        return None
    fair = (job.meta or {}).get("kumiko_fair")
    if isinstance(fair, list) and len(fair) > 2:
        # (checked: the fair field is not signed, and the run's next messages keep it)
        return valid_priority(fair[2])
    return None


def current_job_origin() -> str:
    """The queue the message executing now came from (``""`` outside a worker)."""
    job = get_current_job()
    return job.origin if job is not None else ""


def waiting_job_ids(queue: str) -> list[str]:
    """The RQ job ids waiting on ``queue``, wherever the fair dequeue keeps them (RQ's own
    list holds tokens for sorted ones)."""
    rq_queue = get_queue(queue)
    return fair.waiting_job_ids(rq_queue.connection, queue, rq_queue.key)


def queue_length(queue: str) -> int:
    """Messages waiting on ``queue`` now (RQ's count; delayed ones are not on it yet)."""
    return int(get_queue(queue).count)


def utcnow() -> datetime:
    """The time as the transport stamps it (aware, UTC)."""
    return datetime.now(UTC)


# --- django-rq's web pages and queue configuration (kumiko_jobs.urls, checks.py) --------------


def django_rq_urlpatterns() -> tuple[list[Any], list[Any]]:
    """Fresh copies of django-rq's (token API patterns, page patterns), unguarded."""
    # Inside: django_rq.urls imports its views, which import django.contrib.admin (app loading).
    from django_rq.urls import get_admin_urlpatterns, get_api_urlpatterns

    return list(get_api_urlpatterns()), list(get_admin_urlpatterns())


class DelayedSet(DjangoScheduler):
    """rq-scheduler's sorted set of delayed messages, read and written as JSON jobs.

    What pushing a delayed message needs of rq-scheduler, without the scheduler's loop:
    ``scheduler.Scheduler`` (the ``rqscheduler`` process, which moves due messages and rings
    cron alarms) extends it, and pushing never needs that loop.
    """

    job_class = JsonJob

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["job_class"] = JsonJob
        super().__init__(*args, **kwargs)


def delayed_set(queue: str) -> DelayedSet:
    """rq-scheduler's delayed set on ``queue``'s Redis, for messages bound for ``queue``."""
    q = get_queue(queue)
    return DelayedSet(queue_name=queue, queue=q, connection=q.connection)
