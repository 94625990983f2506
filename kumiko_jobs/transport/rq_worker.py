"""RQ's worker classes as kumiko's workers start from, and the per-message bookkeeping that
makes them cheaper in Redis round trips.

``worker/`` adds per-run hygiene on top of these bases; everything here is RQ's own protocol
(the same keys and fields as RQ's worker writes, so ``rq info`` and django-rq's pages read
them), only batched. Kept apart from the job and queue modules because it is the one piece
that re-implements RQ internals and must be re-read on every RQ upgrade.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any, cast

from redis import Redis
from redis.exceptions import RedisError
from rq import Queue
from rq.exceptions import DequeueTimeout
from rq.executions import Execution
from rq.job import Job, JobStatus, Retry, parse_job_id
from rq.rate_limit import release_slot
from rq.suspension import WORKERS_SUSPENDED
from rq.timeouts import JobTimeoutException, UnixSignalDeathPenalty
from rq.utils import as_text, backend_class, get_version
from rq.utils import now as rq_now
from rq.worker import SimpleWorker as RQSimpleWorker
from rq.worker import Worker as RQForkingWorker
from rq.worker import WorkerStatus

from ..core import conf
from . import done, doorbell, fair
from .rate_limits import release_caps

# Re-exported for the worker package, which adds per-run hygiene to RQ's worker classes.
SimpleWorkerBase = RQSimpleWorker
# For the worker's death penalty, which notes on the run that its timeout fired (a job that
# catches Exception swallows RQ's JobTimeoutException; the note makes the timeout final).
DeathPenaltyBase = UnixSignalDeathPenalty
JobTimeout = JobTimeoutException


class _OneTripDequeue:
    """Mixed into the worker's queue class: ``dequeue_any`` as the fair dequeue (``fair.py``),
    one round trip per message: the script sorts new arrivals into their lanes, picks the next
    message by ``FAIRNESS``, moves it to the queue's intermediate list as RQ's ``LMOVE`` does,
    and returns its job hash as ``Job.fetch`` reads it.

    A worker with nothing to take waits on the queue's list without consuming it (``BLMOVE``
    of the list onto itself: it wakes on the next arrival, which the script then sorts); when
    everything waiting is paused, or it serves several queues, it looks again after at most a
    second.
    """

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
        if get_version(connection) < (6, 2, 0):  # no RPOP count, no LPOS: RQ's own dequeue
            return cast(
                "tuple[Job, Queue] | None",
                super().dequeue_any(  # type: ignore[misc]
                    queues,
                    timeout,
                    connection=connection,
                    job_class=job_class,
                    serializer=serializer,
                    death_penalty_class=death_penalty_class,
                ),
            )
        job_cls: type[Job] = backend_class(cls, "job_class", override=job_class)
        mode = conf.get().FAIRNESS
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            why, reopens = "", None
            for queue in queues:
                popped = fair.dequeue(
                    connection,
                    queue.name,
                    queue.key,
                    queue.intermediate_queue_key,
                    job_cls.redis_job_namespace_prefix,
                    mode,
                )
                job_id = as_text(popped[0])
                if not job_id:
                    if as_text(popped[1]) == "rate":  # seconds until a rate window reopens
                        wait = float(as_text(popped[2]))
                        reopens = wait if reopens is None else min(reopens, wait)
                    why = why if why == "busy" else as_text(popped[1])
                    continue
                found = cls._restore_popped(
                    queue, job_id, popped, connection, job_cls, serializer, death_penalty_class
                )
                if found is not None:
                    return found
                why = "busy"
            if why == "busy":
                continue  # a hash vanished or many paused heads were met: look again now
            if reopens is not None:
                if _wait_for_window(connection, [q.name for q in queues], reopens, deadline):
                    continue  # a rate window reopened (or a second passed): look again
                raise DequeueTimeout(timeout, queues[0].key)
            if timeout is None:
                return None
            cls._wait_for_arrival(connection, queues, timeout, why)

    @classmethod
    def _restore_popped(
        cls,
        queue: Queue,
        job_id: str,
        popped: list[Any],
        connection: Redis,
        job_cls: type[Job],
        serializer: Any,
        death_penalty_class: Any,
    ) -> tuple[Job, Queue] | None:
        """The dequeued job from the script's reply, read as RQ reads it (None: look again)."""
        flat = popped[1]
        if flat == 0:  # not a hash: RQ's own read raises, tagged for the worker
            return cast(
                "tuple[Job, Queue] | None",
                cls._fetch_dequeued_job(  # type: ignore[attr-defined]
                    connection,
                    queue.key,
                    job_id,
                    job_class=job_cls,
                    serializer=serializer,
                    death_penalty_class=death_penalty_class,
                ),
            )
        found = cls.from_queue_key(  # type: ignore[attr-defined]
            queue.key,
            connection=connection,
            job_class=job_cls,
            serializer=serializer,
            death_penalty_class=death_penalty_class,
        )
        job = job_cls(parse_job_id(job_id), connection=connection, serializer=serializer)
        try:
            job.restore(dict(zip(flat[::2], flat[1::2], strict=True)))
        except Exception as exc:
            # As RQ's _fetch_dequeued_job: the worker handles an unreadable hash.
            exc.job_id = job_id  # type: ignore[attr-defined]
            exc.queue = found  # type: ignore[attr-defined]
            raise
        job.kumiko_charge = fair.Charge(  # type: ignore[attr-defined]
            lane=as_text(popped[2]),
            bucket=as_text(popped[3]),
            estimate=float(popped[4]),
            weight=float(popped[5]),
            mode=conf.get().FAIRNESS,
            job_id=job_id,
            caps=as_text(popped[6]) if len(popped) > 6 else "",
        )
        return job, found

    @classmethod
    def _wait_for_arrival(
        cls, connection: Redis, queues: list[Queue], timeout: int, why: str
    ) -> None:
        """Block until a message may have arrived, at most ``timeout`` seconds; raise RQ's
        ``DequeueTimeout`` when none did (the worker then beats and asks again)."""
        if len(queues) == 1 and why == "empty":
            key = queues[0].key
            if connection.blmove(key, key, timeout, "RIGHT", "RIGHT") is None:
                raise DequeueTimeout(timeout, key)
            return
        # Paused work keeps the list from blocking (its tokens), or several queues are served:
        # wait for a push's ring (or a resume's), looking again within a second regardless.
        if not doorbell.wait_for_ring(connection, [q.name for q in queues], timeout):
            raise DequeueTimeout(timeout, queues[0].key)


def _wait_for_window(
    connection: Redis, queues: list[str], reopens: float, deadline: float | None
) -> bool:
    """Wait until the soonest rate window reopens or a push rings the bell of one of
    ``queues`` (another tenant's message needs no window: doorbell.py), bounded by the
    doorbell's ``RING_WAIT_MAX`` and the dequeue's timeout; False when the timeout has passed
    (the worker beats, then asks again). A burst worker has no timeout and waits through the
    windows: rate-limited work is work it still has to do, unlike paused work."""
    wait = reopens
    if deadline is not None:
        wait = min(wait, deadline - time.monotonic())
    doorbell.wait_for_ring(connection, queues, wait)
    return deadline is None or time.monotonic() < deadline


class _StopsPubSubFirst:
    """Mixed into both worker bases: the command channel's thread told to stop *before* the
    ``UNSUBSCRIBE`` whose reply wakes it.

    RQ's ``unsubscribe`` sends ``UNSUBSCRIBE`` and then stops the thread. When the thread reads
    the reply before the stop flag is cleared, it loops into another ``get_message`` with RQ's
    ``sleep_time`` of 60 s; since redis-py 8.2 ``PubSubWorkerThread.stop()`` joins the thread,
    so every such teardown (each burst worker's end, each shutdown) waited a full minute.
    Cleared first, the flag is seen as soon as the reply arrives.
    """

    pubsub_thread: Any

    def unsubscribe(self) -> None:
        thread = getattr(self, "pubsub_thread", None)
        # redis-py's thread has kept its loop flag in ``_running`` (an Event) since 3.x; if a
        # release drops it, RQ's own order below still works, only slower.
        running = getattr(thread, "_running", None)
        if isinstance(running, threading.Event):
            running.clear()
        super().unsubscribe()  # type: ignore[misc]


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


class BookkeepingSimpleWorker(_StopsPubSubFirst, RQSimpleWorker):
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
        """RQ's registration, forgetting the state last written (a new hash has none)."""
        super().register_birth()
        # A new registration (at start, or after Redis lost the worker) has no state field.
        self._state_sent = None

    def set_state(self, state: str, pipeline: Any = None) -> None:
        """RQ's state write, skipped when the worker's hash already holds ``state``."""
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
        """RQ's check, skipped once when the finish pipeline just read the answer."""
        if self._suspension_checked:
            self._suspension_checked = False
            return
        super().check_for_suspension(burst)

    def prepare_execution(self, job: Job) -> Execution:
        """RQ's execution record, written later in the start pipeline."""
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
        """RQ's start of the job, sent with the execution record in one pipeline."""
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
            done.done_on(pipeline, job)  # handle.wait()'s signal, for a final run (done.py)
            charge = getattr(job, "kumiko_charge", None)
            if charge is not None:  # the fair dequeue's estimate, corrected (fair.py)
                fair.charge_on(pipeline, charge, (job.ended_at - job.started_at).total_seconds())  # type: ignore[operator]
            dependents, suspended = pipeline.execute()[:2]
        job.kumiko_caps_released = True  # type: ignore[attr-defined]  # (by charge_on)
        self._suspension_checked = not suspended
        if dependents:
            queue.enqueue_ready_jobs_by_queue(queue.move_dependents_to_ready(job))
        release_slot(job)
        job.send_webhooks(JobStatus.FINISHED)  # none on a kumiko message (refused), as RQ does

    def execute_job(self, job: Job, queue: Queue) -> None:
        """RQ's execution; then the release of the run's caps when the finish did not send it
        (RQ's own finish or failure path: a ``Retry``, a timeout, an unreadable job)."""
        try:
            super().execute_job(job, queue)
        finally:
            if not getattr(job, "kumiko_caps_released", False):
                _release_caps(self.connection, job)


def _release_caps(connection: Redis, job: Job) -> None:
    """Free the caps' slots this worker's pick took for ``job``, in a round trip of its own."""
    charge = getattr(job, "kumiko_charge", None)
    if charge is None or not charge.caps:
        return
    # Redis away: the sweep's or the relay's repair frees the slot (rate_limits.py).
    with contextlib.suppress(RedisError):
        release_caps(connection, charge.job_id, charge.caps)


class ForkingWorkerBase(_StopsPubSubFirst, RQForkingWorker):
    """RQ's forking worker with the fair dequeue. Its start and finish stay RQ's own, in the
    work horse; the parent charges the run's worker time (the horse's life) once the horse
    is gone, one round trip more per message (RQ's own finish sends many)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.queue_class = _one_trip_dequeue(self.queue_class)

    def execute_job(self, job: Job, queue: Queue) -> None:
        """RQ's fork, wait and reap; then the fair dequeue's charge for the time it took."""
        started = time.monotonic()
        try:
            super().execute_job(job, queue)
        finally:
            charge = getattr(job, "kumiko_charge", None)
            if charge is not None:
                try:
                    with self.connection.pipeline() as pipeline:
                        fair.charge_on(pipeline, charge, time.monotonic() - started)
                        pipeline.execute()
                except RedisError:
                    # Redis away: the pick's estimate stands (the next finish corrects the
                    # mean); the run itself is the worker's to recover, as ever.
                    pass
