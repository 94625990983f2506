"""The only module that imports RQ, django-rq and rq-scheduler.

Every kumiko message is an RQ job whose function is ``kumiko_jobs.runner.execute`` and whose
single argument is the signed envelope string, stored with RQ's JSON serializer: no pickle
ever crosses Redis, so a forged message cannot execute code while being decoded.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import django_rq
from django_rq.queues import DjangoScheduler
from redis import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.sentinel import SentinelConnectionPool
from rq import Queue, RateLimit, get_current_job
from rq.job import Job
from rq.rate_limit import RateLimitRegistry
from rq.serializers import JSONSerializer
from rq.timeouts import JobTimeoutException, UnixSignalDeathPenalty
from rq.worker import SimpleWorker as RQSimpleWorker
from rq.worker import Worker as RQForkingWorker

from . import conf

RUNNER = "kumiko_jobs.runner.execute"

# Re-exported for worker.py, which adds per-run hygiene to RQ's worker classes.
SimpleWorkerBase = RQSimpleWorker
ForkingWorkerBase = RQForkingWorker
Serializer = JSONSerializer
# For worker.py's death penalty, which notes on the run that its timeout fired (a job that
# catches Exception swallows RQ's JobTimeoutException; the note makes the timeout final).
DeathPenaltyBase = UnixSignalDeathPenalty
JobTimeout = JobTimeoutException


class JsonJob(Job):
    """An RQ job that reads and writes JSON unless told otherwise (used by the scheduler)."""

    def __init__(
        self, id: str | None = None, connection: Redis | None = None, serializer: Any = None
    ):
        super().__init__(id=id, connection=connection, serializer=serializer or JSONSerializer)


# RQ calls these by import path (callbacks) or URL (webhooks), from the job hash; kumiko never
# sets them, so a message that carries one was written by someone else.
HOOK_FIELDS = (
    "success_callback_name",
    "failure_callback_name",
    "stopped_callback_name",
    "webhooks",
)


class MalformedJobHash(ValueError):
    """A job hash RQ would silently skip (see ``WorkerJob.restore``)."""


class WorkerJob(JsonJob):
    """The job class of kumiko's workers: notes which hook fields the job hash carried.

    RQ reads the whole hash once when it dequeues a job and keeps what it read; noting the hook
    fields from that same read lets the worker refuse a hooked message without a second read,
    and leaves no window between the check and RQ's use. A field is noted even when RQ could
    not parse it (RQ drops an unreadable webhook list silently): it is still a forgery.
    """

    hook_fields: tuple[str, ...] = ()

    def restore(self, raw_data: Any) -> Any:
        if b"data" not in raw_data and "data" not in raw_data:
            # RQ takes such a hash for a job that no longer exists and skips it silently,
            # leaving it in Redis and its id in the intermediate queue. Any other error here
            # reaches the worker, which records the hash and removes it.
            raise MalformedJobHash("the job hash has no data field")
        present = {
            key.decode() if isinstance(key, bytes) else key
            for key, value in raw_data.items()
            if value
        }
        self.hook_fields = tuple(field for field in HOOK_FIELDS if field in present)
        return super().restore(raw_data)


class Scheduler(DjangoScheduler):
    """rq-scheduler that reads kumiko's JSON jobs. Set ``RQ["SCHEDULER_CLASS"]`` to this.

    It also syncs kumiko's cron schedules when it starts, and computes the next tick of a cron
    job in the job's own time zone (rq-scheduler itself knows only UTC or the machine's zone).
    """

    job_class = JsonJob

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["job_class"] = JsonJob
        super().__init__(*args, **kwargs)

    def run(self, burst: bool = False) -> None:
        """rq-scheduler's loop, restarted when Redis goes away instead of ending the process.

        rq-scheduler's own loop ends on the first Redis error (its heartbeat, then the
        ``register_death`` in its ``finally``), even for a one-second restart.
        """
        from .schedules import sync_schedules

        while True:
            try:
                sync_schedules()
                super().run(burst=burst)
                return
            except (RedisConnectionError, RedisTimeoutError) as exc:
                self.log.warning("Redis is unavailable (%s); retrying in %s s", exc, _PAUSE)
                time.sleep(_PAUSE)
                self._restarting = True

    def heartbeat(self) -> None:
        """rq-scheduler's heartbeat, which writes the registration again when it is gone.

        rq-scheduler only extends the expiry of the registration it wrote at start. A
        registration lost with a failed-over primary (replication is asynchronous: the promoted
        replica may miss the last writes), or expired during a round that outlasted it, stayed
        gone while the scheduler ran on, and ``scheduler_liveness`` reported no scheduler.
        """
        ttl = int(self._interval) + 10
        if self.connection.expire(self.key, ttl):
            return
        with self.connection.pipeline() as pipe:
            pipe.hset(self.key, "birth", time.time())
            pipe.expire(self.key, ttl)
            pipe.execute()
        self.log.warning("this scheduler's registration was gone from Redis; registered again")

    _restarting = False

    def register_birth(self) -> None:
        """rq-scheduler's, without refusing this process's own registration after an outage.

        rq-scheduler refuses a name whose registration looks alive. The name is this process's
        (django-rq's ``rqscheduler`` never passes one: a fresh uuid), so after an outage such a
        registration is the one this process left: its death mark never reached Redis, or
        reached a primary that then failed over. Dropping it once the outage is over, in the
        same call, leaves no window in which a failed delete is taken for another scheduler
        (the freeze-and-failover test ended the scheduler that way).
        """
        if self._restarting:
            self.connection.delete(self.key)
            self._restarting = False
        super().register_birth()

    def enqueue_jobs(self) -> Any:
        """One round of the loop (under rq-scheduler's lock): first put back any kumiko cron
        entry someone deleted, e.g. from django-rq's pages, so it ticks without a restart."""
        from .schedules import restore_missing_cron

        restored = restore_missing_cron()
        if restored:
            self.log.warning("restored deleted cron entries: %s", ", ".join(restored))
        return super().enqueue_jobs()

    def enqueue_job(self, job: Job) -> None:
        from .schedules import CRON_PREFIX

        if job.id.startswith(CRON_PREFIX):
            self._fire_cron(job)
            return
        super().enqueue_job(job)

    def _fire_cron(self, job: Job) -> None:
        """A kumiko cron alarm rang: push the tick's own message, never the alarm itself.

        The tick is identified by signed data (schedules.fire): the job the alarm's id names
        in the registry and the time its crontab fired. The alarm's score, meta and body are
        not trusted, so a copied or re-scored alarm can at most ring the current tick again,
        which finds its run row and pushes nothing.
        """
        from django.db import DatabaseError

        from .schedules import fire

        try:
            firing = fire(job.id)
        except DatabaseError as exc:
            # Left due: the next round rings it again, for the same tick.
            self.log.warning("cron %s not fired, PostgreSQL unavailable (%s)", job.id, exc)
            return
        if firing.next_at is None:
            self.log.warning("cron entry %s belongs to no registered cron job; removed", job.id)
            self.cancel(job.id)
            return
        if firing.message is not None:
            push(firing.message)
        self.connection.zadd(self.scheduled_jobs_key, {job.id: int(firing.next_at)})


_TZ_META = "kumiko_timezone"
_PAUSE = 1.0  # seconds between attempts to reach Redis again


@dataclass(frozen=True, slots=True)
class CronSpec:
    """What a registered cron entry holds; equal specs mean nothing to update."""

    schedule_id: str
    cron: str
    timezone: str
    body: str
    queue: str
    timeout: int


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
    # Put it at the front of its queue (a Django task with a priority above 0); a delayed one
    # joins the back when rq-scheduler moves it to the queue.
    at_front: bool = False


_queues: dict[tuple[str, int], Queue] = {}


def get_queue(name: str) -> Queue:
    """The queue, one instance (and one Redis connection pool) per name and process.

    django-rq builds a new Redis client on every call, which costs a TCP connection per
    enqueue; a forked process must not share the parent's sockets, hence the pid in the key.
    """
    key = (name, os.getpid())
    queue = _queues.get(key)
    if queue is None:
        # commit_mode="auto": kumiko decides when to push (on_commit in enqueueing.py);
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


def connection_for(queue: str) -> Redis:
    return get_queue(queue).connection


def scheduler_for(queue: str) -> Scheduler:
    q = get_queue(queue)
    return Scheduler(queue_name=queue, queue=q, connection=q.connection)


def push(message: Message) -> None:
    """Put one message on its queue now, or in the scheduler when it has a delay."""
    push_many([message])


def push_many(messages: Iterable[Message]) -> None:
    """Push messages with one Redis pipeline per queue (fan-out pushes thousands at once).

    Rate-limited messages go one by one: RQ admits them through a Lua script that cannot run
    inside a pipeline.
    """
    settings = conf.get()
    batches: dict[str, list[Message]] = {}
    for msg in messages:
        if msg.delay > 0:
            job = scheduler_for(msg.queue).enqueue_in(
                timedelta(seconds=msg.delay),
                RUNNER,
                msg.body,
                job_id=msg.job_id,
                timeout=msg.timeout,
                job_result_ttl=settings.RESULT_TTL,
                queue_name=msg.queue,
            )
            if msg.rate_limit:
                # Admitted by RQ when rq-scheduler moves it to the queue (Queue.enqueue_job).
                job.rate_limit_key, job.rate_limit_concurrency = msg.rate_limit_key, msg.rate_limit
                job.save()
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
            )
        else:
            batches.setdefault(msg.queue, []).append(msg)
    for queue_name, batch in batches.items():
        queue = get_queue(queue_name)
        for start in range(0, len(batch), 500):
            queue.enqueue_many(
                [
                    Queue.prepare_data(
                        RUNNER,
                        args=(m.body,),
                        job_id=m.job_id,
                        timeout=m.timeout,
                        result_ttl=settings.RESULT_TTL,
                        failure_ttl=settings.FAILURE_TTL,
                        at_front=m.at_front,
                    )
                    for m in batch[start : start + 500]
                ]
            )


def cron_entries() -> dict[str, CronSpec]:
    """kumiko's cron entries currently registered with rq-scheduler, by schedule id."""
    from .schedules import CRON_PREFIX

    scheduler = scheduler_for(conf.get().DEFAULT_QUEUE)
    entries = {}
    for job in scheduler.get_jobs():
        if not job.id.startswith(CRON_PREFIX):
            continue
        entries[job.id] = CronSpec(
            schedule_id=job.id,
            cron=job.meta.get("cron_string", ""),
            timezone=job.meta.get(_TZ_META, "UTC"),
            body=str(job.args[0]) if job.args else "",
            queue=job.origin,
            timeout=int(job.timeout or 0),
        )
    return entries


def register_cron(spec: CronSpec, first_delay: float) -> None:
    scheduler = scheduler_for(spec.queue)
    scheduler.cron(
        spec.cron,
        RUNNER,
        args=[spec.body],
        queue_name=spec.queue,
        id=spec.schedule_id,
        timeout=spec.timeout,
        # The entry's job hash *is* the schedule: each tick runs this same RQ job, and a
        # finite result TTL let the hash expire after the first tick, so rq-scheduler dropped
        # the entry at the next one (cron jobs less frequent than RESULT_TTL ran once per
        # scheduler start). -1 keeps it, as rq-scheduler's own cron() default does.
        result_ttl=-1,
        meta={_TZ_META: spec.timezone},
    )
    scheduler.connection.zadd(
        scheduler.scheduled_jobs_key, {spec.schedule_id: int(time.time() + first_delay)}
    )


def missing_cron_entries(schedule_ids: Sequence[str]) -> list[str]:
    """The ids among ``schedule_ids`` that rq-scheduler would not tick: no slot in its
    schedule, or no job hash (rq-scheduler drops such a slot when it comes due)."""
    if not schedule_ids:
        return []
    scheduler = scheduler_for(conf.get().DEFAULT_QUEUE)
    with scheduler.connection.pipeline(transaction=False) as pipe:
        for sid in schedule_ids:
            pipe.zscore(scheduler.scheduled_jobs_key, sid)
            pipe.exists(Job.key_for(sid))
        replies = pipe.execute()
    return [
        sid
        for i, sid in enumerate(schedule_ids)
        if replies[2 * i] is None or not replies[2 * i + 1]
    ]


def cancel_scheduled(job_id: str) -> None:
    scheduler = scheduler_for(conf.get().DEFAULT_QUEUE)
    scheduler.cancel(job_id)
    scheduler.connection.delete(Job.key_for(job_id))


def acquire_scheduler_lock(queue: str) -> bool:
    """rq-scheduler's own lock, which keeps two schedulers from enqueuing the same tick."""
    return bool(scheduler_for(queue).acquire_lock())


def dataset_token(key: str, candidate: str) -> str:
    """The value of ``key``, set to ``candidate`` first if it has none (one round trip): a
    token that identifies this Redis dataset until it is flushed."""
    redis = get_queue(conf.get().DEFAULT_QUEUE).connection
    with redis.pipeline(transaction=True) as pipe:
        pipe.set(key, candidate, nx=True)
        pipe.get(key)
        _, value = pipe.execute()
    return value.decode() if isinstance(value, bytes) else str(value)


def current_job_id() -> str:
    job = get_current_job()
    return job.id if job is not None else ""


def timeout_of_job(job: Job) -> int | None:
    """Seconds RQ's death penalty gives this job (None: no limit), as RQ computes it."""
    timeout = job.timeout or Queue.DEFAULT_TIMEOUT
    return None if timeout == -1 else int(timeout)


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


@dataclass(frozen=True, slots=True)
class SchedulerLag:
    """What rq-scheduler's Redis keys say about delayed work (scheduler_liveness.py)."""

    overdue: int  # scheduled messages due more than `after` seconds ago
    oldest_due: float | None  # unix time the oldest of them was due
    scheduler_registered: bool  # a live rqscheduler registration (expires interval + 10 s)


def scheduler_lag(after: float) -> SchedulerLag:
    """Scheduled messages overdue by more than ``after`` seconds, over every Redis that one of
    ``RQ_QUEUES`` uses (rq-scheduler keeps one sorted set per Redis, scored by due time).

    A running rqscheduler empties the due part of that set every ``--interval`` seconds, so
    entries older than that mean no scheduler is running against this Redis (or it is stuck).
    Raises redis' errors when Redis is unreachable; callers decide how loud to be.
    """
    cutoff = time.time() - after
    seen: set[tuple[Any, ...]] = set()
    overdue, oldest, registered = 0, None, False
    for name in conf.rq_queue_names():
        redis = get_queue(name).connection
        where = redis_identity(redis)
        if where in seen:
            continue
        seen.add(where)
        key = Scheduler.scheduled_jobs_key
        with redis.pipeline(transaction=False) as pipe:
            pipe.zcount(key, 0, cutoff)
            pipe.zrangebyscore(key, 0, cutoff, start=0, num=1, withscores=True)
            count, first = pipe.execute()
        overdue += int(count)
        if first:
            due = float(first[0][1])
            oldest = due if oldest is None else min(oldest, due)
        if count and not registered:
            # A handful of keys at most: one per running rqscheduler process.
            prefix = Scheduler.redis_scheduler_namespace_prefix
            for instance in redis.scan_iter(match=prefix + "*", count=100):
                if not redis.hexists(instance, "death"):
                    registered = True
                    break
    return SchedulerLag(overdue=overdue, oldest_due=oldest, scheduler_registered=registered)


@dataclass(frozen=True, slots=True)
class SlotHolder:
    """An RQ job holding a slot of an RQ ``RateLimit`` key that has messages waiting."""

    key: str
    job_id: str


def rate_limit_slot_holders(queue: str) -> list[SlotHolder]:
    """The slot holders of every rate-limit key with waiting messages, on ``queue``'s Redis
    (RQ keeps one set of rate-limit keys per Redis, whichever queue a message is bound for)."""
    redis = get_queue(queue).connection
    # One key per (job, tenant) for sequential jobs: thousands with many tenants, so two
    # pipelined round trips rather than one per key.
    registries = RateLimitRegistry.all(redis)
    with redis.pipeline(transaction=False) as pipe:
        for registry in registries:
            pipe.zcard(registry.rate_limited_key)
        waiting = [r for r, n in zip(registries, pipe.execute(), strict=True) if n]
    if not waiting:
        return []
    with redis.pipeline(transaction=False) as pipe:
        for registry in waiting:
            pipe.zrange(registry.allowed_key, 0, -1)
        allowed = pipe.execute()
    return [
        SlotHolder(registry.key, job_id.decode() if isinstance(job_id, bytes) else str(job_id))
        for registry, job_ids in zip(waiting, allowed, strict=True)
        for job_id in job_ids
    ]


def release_rate_limit_slot(queue: str, holder: SlotHolder) -> list[str]:
    """Free ``holder``'s slot and admit the oldest waiting messages (RQ's own Lua script);
    returns the admitted job ids."""
    registry = RateLimitRegistry(holder.key, get_queue(queue).connection)
    return registry.release_and_enqueue(holder.job_id)


def queue_length(queue: str) -> int:
    return int(get_queue(queue).count)


def utcnow() -> datetime:
    return datetime.now(UTC)


# --- django-rq's web pages and queue configuration (kumiko_jobs.urls, checks.py) --------------


def django_rq_urlpatterns() -> tuple[list[Any], list[Any]]:
    """Fresh copies of django-rq's (token API patterns, page patterns), unguarded."""
    from django_rq.urls import get_admin_urlpatterns, get_api_urlpatterns

    return list(get_api_urlpatterns()), list(get_admin_urlpatterns())


def is_json_serializer(value: Any) -> bool:
    """Is an ``RQ_QUEUES[...]["SERIALIZER"]`` value RQ's JSON serializer (or a subclass)?"""
    from django.utils.module_loading import import_string

    try:
        cls = import_string(value) if isinstance(value, str) else value
    except ImportError:
        return False
    return isinstance(cls, type) and issubclass(cls, JSONSerializer)


JSON_SERIALIZER_PATH = "rq.serializers.JSONSerializer"
