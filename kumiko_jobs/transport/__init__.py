"""The only module that imports RQ, django-rq and rq-scheduler.

Every kumiko message is an RQ job whose function is ``kumiko_jobs.runner.execute`` and whose
single argument is the signed envelope string, stored with RQ's JSON serializer: no pickle
ever crosses Redis, so a forged message cannot execute code while being decoded.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

import django_rq
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver
from django_rq.queues import DjangoScheduler
from redis import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.sentinel import SentinelConnectionPool
from rq import Queue, RateLimit, get_current_job
from rq.executions import Execution
from rq.job import Job, JobStatus, Retry, parse_job_id
from rq.rate_limit import RateLimitRegistry, release_slot
from rq.serializers import JSONSerializer
from rq.suspension import WORKERS_SUSPENDED
from rq.timeouts import JobTimeoutException, UnixSignalDeathPenalty
from rq.utils import as_text, backend_class, get_version
from rq.utils import now as rq_now
from rq.worker import SimpleWorker as RQSimpleWorker
from rq.worker import Worker as RQForkingWorker
from rq.worker import WorkerStatus

from ..core import conf, project_settings
from ..core.envelope import run_id_of

RUNNER = "kumiko_jobs.runner.execute"
# The id prefix of kumiko's cron entries with rq-scheduler (``kj-cron-<job name>``).
CRON_PREFIX = "kj-cron-"

# Re-exported for worker.py, which adds per-run hygiene to RQ's worker classes.
SimpleWorkerBase = RQSimpleWorker
ForkingWorkerBase = RQForkingWorker
Serializer = JSONSerializer
# For worker.py's death penalty, which notes on the run that its timeout fired (a job that
# catches Exception swallows RQ's JobTimeoutException; the note makes the timeout final).
DeathPenaltyBase = UnixSignalDeathPenalty
JobTimeout = JobTimeoutException


# RQ's dequeue of one queue in one round trip: LMOVE the next job id to the queue's intermediate
# list, exactly as RQ's Queue.lmove does, and read the job's hash, as Job.fetch does. A key that
# is not a hash answers 0 instead of failing the script after the LMOVE: the caller then reads
# it the way RQ does, so the worker handles the error as it would RQ's.
_DEQUEUE_ONE = """
local id = redis.call('LMOVE', KEYS[1], KEYS[2], 'LEFT', 'RIGHT')
if not id then return false end
local fields = redis.pcall('HGETALL', ARGV[1] .. id)
if fields.err then return {id, 0} end
return {id, fields}
"""


class _OneTripDequeue:
    """Mixed into the worker's queue class: ``dequeue_any`` of a single queue in one round
    trip instead of two (``LMOVE``, then ``HGETALL``). RQ takes the same path (``LMOVE`` to the
    intermediate queue) for one queue on Redis >= 6.2; a blocking wait on an empty queue, and
    every other case, is RQ's own code."""

    @classmethod
    def dequeue_any(
        cls,
        queues: Any,
        timeout: int | None,
        connection: Redis,
        job_class: Any = None,
        serializer: Any = None,
        death_penalty_class: Any = None,
    ) -> tuple[Job, Queue] | None:
        queues = list(queues)
        if len(queues) == 1 and get_version(connection) >= (6, 2, 0):
            queue = queues[0]
            job_cls: type[Job] = backend_class(cls, "job_class", override=job_class)
            script = connection.register_script(_DEQUEUE_ONE)
            while True:
                popped = script(
                    keys=[queue.key, queue.intermediate_queue_key],
                    args=[job_cls.redis_job_namespace_prefix],
                )
                if popped is None:
                    break  # empty: RQ's own dequeue waits (BLMOVE) or says so
                job_id, flat = parse_job_id(as_text(popped[0])), popped[1]
                if flat == 0:  # not a hash: RQ's own read raises, tagged for the worker
                    fetched = cls._fetch_dequeued_job(  # type: ignore[attr-defined]
                        connection,
                        queue.key,
                        job_id,
                        job_class=job_cls,
                        serializer=serializer,
                        death_penalty_class=death_penalty_class,
                    )
                    if fetched is None:
                        continue
                    return fetched
                if not flat:
                    continue  # no hash any more: RQ skips such an id silently
                found = cls.from_queue_key(  # type: ignore[attr-defined]
                    queue.key,
                    connection=connection,
                    job_class=job_cls,
                    serializer=serializer,
                    death_penalty_class=death_penalty_class,
                )
                job = job_cls(job_id, connection=connection, serializer=serializer)
                try:
                    job.restore(dict(zip(flat[::2], flat[1::2], strict=True)))
                except Exception as exc:
                    # As RQ's _fetch_dequeued_job: the worker handles an unreadable hash.
                    exc.job_id = job_id  # type: ignore[attr-defined]
                    exc.queue = found  # type: ignore[attr-defined]
                    raise
                return job, found
        return super().dequeue_any(  # type: ignore[misc]
            queues,
            timeout,
            connection=connection,
            job_class=job_class,
            serializer=serializer,
            death_penalty_class=death_penalty_class,
        )


_one_trip_queue_classes: dict[type, type] = {}


def _one_trip_dequeue(queue_class: Any) -> Any:
    """``queue_class`` (RQ's, django-rq's or the project's) with the one-trip dequeue."""
    if issubclass(queue_class, _OneTripDequeue):
        return queue_class
    cls = _one_trip_queue_classes.get(queue_class)
    if cls is None:
        cls = type(queue_class.__name__, (_OneTripDequeue, queue_class), {})
        _one_trip_queue_classes[queue_class] = cls
    return cls


class BookkeepingSimpleWorker(RQSimpleWorker):
    """RQ's ``SimpleWorker`` with its per-message bookkeeping in fewer Redis round trips.

    RQ 3's ``SimpleWorker`` sends, per message, besides the dequeue (``LMOVE``, then
    ``HGETALL`` of the job hash): the start as two pipelines (the execution and its registries,
    then the job's and the worker's heartbeats), the job's last heartbeat on its own, the
    outcome as ``WATCH`` and a ``MULTI``/``EXEC``, the worker's state ``idle`` twice, and a
    suspension check. This class writes the same keys and fields, so ``rq info``, django-rq's
    pages and RQ's registries show exactly what they show for RQ's own worker, in:

    * one round trip for the dequeue of a single queue (a script doing RQ's ``LMOVE`` and the
      ``HGETALL`` of the job hash; ``_OneTripDequeue``);
    * one start pipeline (``MULTI``/``EXEC``): the execution, ``StartedJobRegistry``, the
      worker's execution set, its state ``busy``, its heartbeat, the job's ``started`` fields,
      ``PERSIST``, and the removal from the intermediate queue. One transaction, so no reader
      ever sees the job in neither the intermediate queue nor the started registry;
    * one finish pipeline (``MULTI``/``EXEC``) for a successful attempt: RQ's own writes
      (counters, job status and fields, its last heartbeat and end time, the result stream,
      ``FinishedJobRegistry``, the execution's removal), the worker's state ``idle``, and two
      reads in the same transaction: the job's dependents and whether workers are suspended;
    * the worker's state only when it changes (RQ writes ``idle`` after every message and
      again before every dequeue).

    The finish needs no ``WATCH``: RQ watches the dependents set so that a dependent added
    while it reads them is not stranded. Here the count of dependents is read inside the
    transaction that marks the job finished: one added before it is counted and moved to
    ready by RQ's own ``move_dependents_to_ready`` afterwards; one added after it finds the
    job finished (RQ's enqueue watches the parent's hash, which the transaction writes).
    The suspension answer read there is the one the loop's next check uses, instead of its
    own round trip a moment later (RQ's check has the same window: it runs before the
    dequeue, not with it).

    Anything unusual takes RQ's own path unchanged: a ``Retry`` returned by the job, a repeat,
    a success callback, a ``result_ttl`` of 0 (RQ deletes the job hash, which it does after
    moving dependents), and every failure (kumiko records failures itself and returns
    normally, so RQ's failure path is rare).
    """

    _start_pipeline: Any = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.queue_class = _one_trip_dequeue(self.queue_class)

    # The state last written to the worker's hash (None: unknown, write the next one).
    _state_sent: str | None = None
    # The finish pipeline's answer to "are workers suspended?", for the loop's next check.
    _suspension_checked = False

    def register_birth(self) -> None:
        super().register_birth()
        # A new registration (at start, or after Redis lost the worker) has no state field.
        self._state_sent = None

    def set_state(self, state: str, pipeline: Any = None) -> None:
        if pipeline is None and state == self._state_sent:
            self._state = state
            return
        try:
            super().set_state(state, pipeline)
        except Exception:
            self._state_sent = None
            raise
        # In a pipeline the write is sent with it; a failed pipeline raises to the worker,
        # which then forgets the state (forget_state).
        self._state_sent = state

    def forget_state(self) -> None:
        """The worker's Redis writes may have been lost: write everything anew."""
        self._state_sent = None
        self._suspension_checked = False

    def check_for_suspension(self, burst: bool) -> None:
        if self._suspension_checked:
            self._suspension_checked = False
            return
        super().check_for_suspension(burst)

    def prepare_execution(self, job: Job) -> Execution:
        # RQ's rq.executions.prepare_execution, minus its execute(): the commands wait for
        # prepare_job_execution, which runs next (SimpleWorker.execute_job -> perform_job).
        pipeline = self.connection.pipeline()
        try:
            execution = Execution.create(
                job, self.get_heartbeat_ttl(job), pipeline=pipeline, worker_name=self.name
            )
            self.executions[execution.id] = execution
            self.set_state(WorkerStatus.BUSY, pipeline=pipeline)
        except BaseException:
            pipeline.reset()
            raise
        self._start_pipeline = pipeline
        return execution

    def prepare_job_execution(self, job: Job, remove_from_intermediate_queue: bool = False) -> None:
        pipeline, self._start_pipeline = self._start_pipeline, None
        if pipeline is None:
            super().prepare_job_execution(job, remove_from_intermediate_queue)
            return
        # RQ's prepare_job_execution on the start pipeline. Its job.heartbeat() is left out:
        # prepare_for_execution writes the same last_heartbeat field in the same HSET.
        with pipeline:
            heartbeat_ttl = self.get_heartbeat_ttl(job)
            self.heartbeat(heartbeat_ttl, pipeline=pipeline)
            job.prepare_for_execution(self.name, pipeline=pipeline)
            pipeline.persist(job.key)
            if remove_from_intermediate_queue:
                intermediate = Queue(job.origin, connection=self.connection).intermediate_queue_key
                pipeline.lrem(intermediate, 1, job.id)
            pipeline.execute()
        self.procline(f"Processing {job.func_name} from {job.origin} since {time.time()}")

    def _finalize_success(
        self, job: Job, queue: Queue, execution: Execution, return_value: Any
    ) -> None:
        result_ttl = job.get_result_ttl(self.default_result_ttl)
        if (
            isinstance(return_value, Retry)
            or result_ttl == 0
            or job.repeats_left is not None
            or job.success_callback is not None
        ):
            super()._finalize_success(job, queue, execution, return_value)
            return
        # RQ's handle_execution_ended sends the job's last heartbeat on its own; job.save() in
        # the finish pipeline writes the same field (and ended_at) from these attributes.
        job.ended_at = job.last_heartbeat = rq_now()
        job._result = return_value
        job._status = JobStatus.FINISHED
        with self.connection.pipeline() as pipeline:
            pipeline.scard(job.dependents_key)
            pipeline.exists(WORKERS_SUSPENDED)
            # What RQ's handle_job_success writes, in its order.
            self.increment_successful_job_count(pipeline=pipeline)
            self.increment_total_working_time(job.ended_at - job.started_at, pipeline)  # type: ignore[operator]
            job._handle_success(
                result_ttl,
                pipeline=pipeline,
                worker_name=self.name,
                execution_id=execution.id,
                execution_started_at=execution.created_at,
                execution_ended_at=job.ended_at,
            )
            job.cleanup(result_ttl, pipeline=pipeline, remove_from_queue=False)
            self.cleanup_execution(job, pipeline=pipeline, execution=execution)
            # SimpleWorker.execute_job sets it right after; here it costs no round trip.
            self.set_state(WorkerStatus.IDLE, pipeline=pipeline)
            dependents, suspended = pipeline.execute()[:2]
        self._suspension_checked = not suspended
        if dependents:
            queue.enqueue_ready_jobs_by_queue(queue.move_dependents_to_ready(job))
        release_slot(job)
        job.send_webhooks(JobStatus.FINISHED)  # none on a kumiko message (refused), as RQ does


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


class CronFiring(Protocol):
    """A cron alarm rung: push ``message`` (if any), ring the alarm again at ``next_at``."""

    @property
    def message(self) -> Message | None: ...

    @property
    def next_at(self) -> float | None:
        """Epoch seconds; None: the alarm belongs to no registered cron job (remove it)."""


class CronHooks(Protocol):
    """What ``Scheduler`` asks of the cron domain (``schedules.CRON_HOOKS``).

    The transport sits below the job definitions and the registry, so it cannot import the
    module that knows which cron jobs exist; ``KumikoJobsConfig.ready`` installs the hooks.
    """

    def sync_schedules(self) -> object:
        """Make rq-scheduler's cron entries match the registered cron jobs."""

    def restore_missing_cron(self) -> Sequence[str]:
        """Re-register deleted cron entries; return their schedule ids."""

    def fire(self, alarm_id: str) -> CronFiring:
        """Write the run row of the tick the alarm ``alarm_id`` rings for; build its message."""


_cron_hooks: CronHooks | None = None


def install_cron_hooks(hooks: CronHooks) -> None:
    """Give ``Scheduler`` the cron domain (called by ``KumikoJobsConfig.ready``)."""
    global _cron_hooks
    _cron_hooks = hooks


def cron_hooks() -> CronHooks:
    if _cron_hooks is None:
        raise ImproperlyConfigured(
            "kumiko_jobs.transport.Scheduler has no cron hooks: add 'kumiko_jobs' to "
            "INSTALLED_APPS and run the scheduler through Django (manage.py rqscheduler), whose "
            "start-up (KumikoJobsConfig.ready) installs them."
        )
    return _cron_hooks


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
        hooks = cron_hooks()
        while True:
            try:
                hooks.sync_schedules()
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
        restored = cron_hooks().restore_missing_cron()
        if restored:
            self.log.warning("restored deleted cron entries: %s", ", ".join(restored))
        return super().enqueue_jobs()

    def enqueue_job(self, job: Job) -> None:
        if job.id.startswith(CRON_PREFIX):
            self._fire_cron(job)
            return
        super().enqueue_job(job)

    def _fire_cron(self, job: Job) -> None:
        """A kumiko cron alarm rang: push the tick's own message, never the alarm itself.

        The tick is identified by signed data (``CronHooks.fire``, i.e. schedules.fire): the job
        the alarm's id names in the registry and the time its crontab fired. The alarm's score,
        meta and body are not trusted, so a copied or re-scored alarm can at most ring the
        current tick again, which finds its run row and pushes nothing.
        """
        from django.db import DatabaseError

        try:
            firing = cron_hooks().fire(job.id)
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


@receiver(setting_changed)
def _forget_queues_on_change(*, setting: str, **_: object) -> None:
    # Connected here, not in conf: the settings reader stays below the transport.
    if setting in {"RQ_QUEUES", "RQ"}:
        forget_queues()


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


# --- worker liveness: which kumiko worker executes which RQ job (worker.py beats, the sweep and
# the relay read) -----------------------------------------------------------------------------

LIVE_WORKERS = "kumiko:workers"  # set of worker names that beat
WORKER_KEY = "kumiko:worker:"  # + name -> the RQ job id it executes ("" when idle), with a TTL
# When liveness data started to be collected in this Redis dataset. Right after a flush, or a
# restart that lost the data, no worker has beaten yet and a missing key proves nothing.
WORKERS_SINCE_KEY = "kumiko:workers:since"
# Set in a kumiko worker's RQ worker hash: a live RQ worker without it is some other worker
# class, whose runs only the timeout rule may end.
RQ_WORKER_MARK = "kumiko"
# The worker's logger, as when this lived in worker.py: users' LOGGING may route it.
_liveness_logger = logging.getLogger("kumiko_jobs.worker")


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
        return rq_job_id in self._jobs or run_hex in self._runs

    def worker_of(self, rq_job_id: str) -> str | None:
        """The RQ worker that took this RQ job, as RQ recorded it (None when unknown)."""
        if not rq_job_id:
            return None
        return _text(self._redis.hget(JsonJob.key_for(rq_job_id), "worker_name"))

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
        names = sorted(name for n in redis.smembers(LIVE_WORKERS) if (name := _text(n)))
        values = redis.mget([WORKER_KEY + n for n in names]) if names else []
    except RedisError as exc:
        _liveness_logger.warning("worker liveness unknown: %s", exc)
        return None
    workers = {n: _text(v) or "" for n, v in zip(names, values, strict=True) if v is not None}
    gone = [n for n in names if n not in workers]
    if gone:
        with contextlib.suppress(RedisError):
            redis.srem(LIVE_WORKERS, *gone)
    return Liveness(workers, redis)


def _text(value: bytes | str | None) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


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
