"""rq-scheduler for kumiko: the ``rqscheduler`` process, its cron entries, and its lag.

``Scheduler`` is the class users name in ``RQ["SCHEDULER_CLASS"]`` (as
``kumiko_jobs.transport.Scheduler``): rq-scheduler's loop, kept alive through Redis outages,
that rings kumiko's cron alarms by asking the cron domain for the tick's message instead of
pushing the alarm itself. The cron domain sits above the transport, so it reaches the scheduler
only through the ``CronHooks`` that ``KumikoJobsConfig.ready`` installs. The functions below
are the rest of what kumiko asks of rq-scheduler's Redis keys: cron entries, its lock, due
moves, and how far behind delayed work is.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from rq.job import Job

from ..core import conf, project_settings
from . import doorbell, pushing
from .keys import CRON_PREFIX, TZ_META
from .queues import Message, get_queue, redis_identity
from .rq_job import RUNNER
from .scheduler_loop import SchedulerLoop


class CronFiring(Protocol):
    """A cron alarm rung: push ``missed`` and ``message`` (if any), ring the alarm again at
    ``next_at``."""

    @property
    def message(self) -> Message | None:
        """The tick's run message to push; None when the tick was refused or had already fired."""
        ...

    @property
    def next_at(self) -> float | None:
        """Epoch seconds; None: the alarm belongs to no registered cron job (remove it)."""

    @property
    def missed(self) -> Sequence[Message]:
        """Messages of earlier ticks the alarm passed while it rang late (pushed first)."""


class CronHooks(Protocol):
    """What ``Scheduler`` asks of the cron domain (``schedules.CRON_HOOKS``).

    The transport sits below the job definitions and the registry, so it cannot import the
    module that knows which cron jobs exist; ``KumikoJobsConfig.ready`` installs the hooks.
    """

    def sync_schedules(self) -> object:
        """Make rq-scheduler's cron entries match the registered cron jobs."""

    def restore_missing_cron(self) -> Sequence[str]:
        """Re-register deleted cron entries; return their schedule ids."""

    def fire(self, alarm_id: str, due_at: float | None = None) -> CronFiring:
        """Write the run row of the tick the alarm ``alarm_id`` rings for; build its message.

        ``due_at``: when the alarm was set to ring (its score); the ticks it passed since are
        caught up when it rings at most ``CRON_CATCH_UP`` seconds late."""


_cron_hooks: CronHooks | None = None


def install_cron_hooks(hooks: CronHooks) -> None:
    """Give ``Scheduler`` the cron domain (called by ``KumikoJobsConfig.ready``)."""
    global _cron_hooks
    _cron_hooks = hooks


def cron_hooks() -> CronHooks:
    """The installed cron domain; names the fix when the app's start-up never installed it."""
    if _cron_hooks is None:
        raise ImproperlyConfigured(
            "kumiko_jobs.transport.Scheduler has no cron hooks: add 'kumiko_jobs' to "
            "INSTALLED_APPS and run the scheduler through Django (manage.py rqscheduler), whose "
            "start-up (KumikoJobsConfig.ready) installs them."
        )
    return _cron_hooks


class Scheduler(SchedulerLoop):
    """rq-scheduler that reads kumiko's JSON jobs. Set ``RQ["SCHEDULER_CLASS"]`` to this.

    It also syncs kumiko's cron schedules when it starts, and computes the next tick of a cron
    job in the job's own time zone (rq-scheduler itself knows only UTC or the machine's zone).
    Its loop (``SchedulerLoop``) moves a message once its due time has passed, to the
    millisecond, never before.
    """

    def run(self, burst: bool = False) -> None:
        """rq-scheduler's loop, restarted when Redis goes away instead of ending the process.

        rq-scheduler's own loop ends on the first Redis error (its heartbeat, then the
        ``register_death`` in its ``finally``), even for a one-second restart; so does
        ``serve``, and this loop starts it again.
        """
        hooks = cron_hooks()
        while True:
            try:
                hooks.sync_schedules()
                self.serve(burst=burst)
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
        restored = cron_hooks().restore_missing_cron()
        if restored:
            self.log.warning("restored deleted cron entries: %s", ", ".join(restored))
        return super().enqueue_jobs()

    def enqueue_job(self, job: Job) -> None:
        """rq-scheduler's move of a due job to its queue; a kumiko cron alarm is fired instead.

        Nothing once this round's lock was lost (scheduler_lock.py): another scheduler holds
        it now and moves what is left."""
        if self.lock_lost():
            return
        if job.id.startswith(CRON_PREFIX):
            self._fire_cron(job)
            return
        super().enqueue_job(job)
        # RQ's push did not ring: wake a worker waiting behind paused work (doorbell.py).
        with self.connection.pipeline(transaction=False) as pipe:
            doorbell.ring(pipe, job.origin)
            pipe.execute()

    def _fire_cron(self, job: Job) -> None:
        """A kumiko cron alarm rang: push the tick's own message, never the alarm itself.

        The tick is identified by signed data (``CronHooks.fire``, i.e. schedules.fire): the job
        the alarm's id names in the registry and the time its crontab fired. The alarm's score,
        meta and body are not trusted, so a copied or re-scored alarm can at most ring the
        current tick again, which finds its run row and pushes nothing.
        """
        # The score says since when it was due: the ticks it passed are caught up (bounded by
        # CRON_CATCH_UP, each once: a forged score can at most fire those few seconds' ticks).
        due_at = self.connection.zscore(self.scheduled_jobs_key, job.id)
        try:
            firing = cron_hooks().fire(job.id, None if due_at is None else float(due_at))
        except DatabaseError as exc:
            # Left due: the next round rings it again, for the same tick.
            self.log.warning("cron %s not fired, PostgreSQL unavailable (%s)", job.id, exc)
            return
        if firing.next_at is None:
            self.log.warning("cron entry %s belongs to no registered cron job; removed", job.id)
            self.cancel(job.id)
            return
        # Through the module, so that testing.captured_pushes keeps them out of Redis.
        for missed in firing.missed:
            pushing.push(missed)
        if firing.message is not None:
            pushing.push(firing.message)
        # Scored to the microsecond: rung at the tick, never before it (int() rounded down).
        self.connection.zadd(self.scheduled_jobs_key, {job.id: float(firing.next_at)})


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


def scheduler_for(queue: str) -> Scheduler:
    """A scheduler client for ``queue`` (its Redis; no loop runs until ``run``)."""
    q = get_queue(queue)
    return Scheduler(queue_name=queue, queue=q, connection=q.connection)


def cron_entry_id(job_name: str) -> str:
    """The id of a cron job's entry (its alarm) with rq-scheduler: ``kj-cron-<name>``, the
    name's dots and colons made underscores."""
    return CRON_PREFIX + job_name.replace(".", "_").replace(":", "_")


def cron_entries() -> dict[str, CronSpec]:
    """kumiko's cron entries currently registered with rq-scheduler, by schedule id."""
    scheduler = scheduler_for(conf.get().DEFAULT_QUEUE)
    entries = {}
    for job in scheduler.get_jobs():
        if not job.id.startswith(CRON_PREFIX):
            continue
        entries[job.id] = CronSpec(
            schedule_id=job.id,
            cron=job.meta.get("cron_string", ""),
            timezone=job.meta.get(TZ_META, "UTC"),
            body=str(job.args[0]) if job.args else "",
            queue=job.origin,
            timeout=int(job.timeout or 0),
        )
    return entries


def register_cron(spec: CronSpec, first_delay: float) -> None:
    """Register (or replace) a cron entry with rq-scheduler, first due in ``first_delay`` s."""
    scheduler = scheduler_for(spec.queue)
    with warnings.catch_warnings():
        # rq-scheduler's cron() asks the crontab package for a first time without its
        # default_utc, which warns (a FutureWarning, eight lines, at every scheduler start).
        # That time is replaced below, and each later tick is kumiko's (definition/cron.py,
        # read in the job's zone), so nothing of the warning applies.
        warnings.filterwarnings("ignore", category=FutureWarning, module=r"rq_scheduler\.")
        scheduler.cron(
            spec.cron,
            RUNNER,
            args=[spec.body],
            queue_name=spec.queue,
            id=spec.schedule_id,
            timeout=spec.timeout,
            # The entry's job hash *is* the schedule: each tick runs this same RQ job, and a
            # finite result TTL let the hash expire after the first tick, so rq-scheduler
            # dropped the entry at the next one (cron jobs less frequent than RESULT_TTL ran
            # once per scheduler start). -1 keeps it, as rq-scheduler's own cron() default does.
            result_ttl=-1,
            meta={TZ_META: spec.timezone},
        )
    # Ticks fall on whole seconds: rounded, the first ring is the tick itself (truncated, it
    # could be a second early when the clock's reading fell just short of it).
    scheduler.connection.zadd(
        scheduler.scheduled_jobs_key, {spec.schedule_id: float(round(time.time() + first_delay))}
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
    """Remove a delayed message or cron entry from rq-scheduler, and its job hash."""
    scheduler = scheduler_for(conf.get().DEFAULT_QUEUE)
    scheduler.cancel(job_id)
    scheduler.connection.delete(Job.key_for(job_id))


def acquire_scheduler_lock(queue: str) -> bool:
    """rq-scheduler's own lock, which keeps two schedulers from enqueuing the same tick."""
    return bool(scheduler_for(queue).acquire_lock())


def scheduled_job_ids(queue: str) -> Sequence[str]:
    """The ids of every job waiting in rq-scheduler's set on ``queue``'s Redis."""
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
    """What rq-scheduler's Redis keys say about delayed work (``scheduler_liveness``)."""

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
    for name in project_settings.rq_queue_names():
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
