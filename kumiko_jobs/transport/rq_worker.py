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
from typing import Any

from redis import Redis
from redis.exceptions import RedisError
from rq import Queue
from rq.executions import Execution
from rq.job import Job, JobStatus, Retry
from rq.rate_limit import release_slot
from rq.suspension import WORKERS_SUSPENDED
from rq.timeouts import JobTimeoutException, UnixSignalDeathPenalty
from rq.utils import now as rq_now
from rq.worker import SimpleWorker as RQSimpleWorker
from rq.worker import Worker as RQForkingWorker
from rq.worker import WorkerStatus

from . import done, fair, rq_start
from .one_trip_dequeue import one_trip_dequeue
from .rate_limits import release_caps
from .worker_cuts import RidesOutCuts

# Re-exported for the worker package, which adds per-run hygiene to RQ's worker classes.
SimpleWorkerBase = RQSimpleWorker
# For the worker's death penalty, which notes on the run that its timeout fired (a job that
# catches Exception swallows RQ's JobTimeoutException; the note makes the timeout final).
DeathPenaltyBase = UnixSignalDeathPenalty
JobTimeout = JobTimeoutException


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


class BookkeepingSimpleWorker(RidesOutCuts, _StopsPubSubFirst, RQSimpleWorker):
    """RQ's ``SimpleWorker`` with its per-message bookkeeping in fewer Redis round trips.

    RQ 3's ``SimpleWorker`` sends, per message, besides the dequeue (``LMOVE``, then
    ``HGETALL`` of the job hash): the start as two pipelines (the execution and its registries,
    then the job's and the worker's heartbeats), the job's last heartbeat on its own, the
    outcome as ``WATCH`` and a ``MULTI``/``EXEC``, the worker's state ``idle`` twice, and a
    suspension check. This class writes the same keys and fields, so ``rq info``, django-rq's
    pages and RQ's registries show exactly what they show for RQ's own worker, in:

    * one round trip for the dequeue and the start (a script doing the pick, the ``HGETALL``
      of the job hash, and RQ's start: the execution, ``StartedJobRegistry``, the worker's
      execution set, its state ``busy``, its heartbeat, the job's ``started`` fields and
      ``PERSIST``; ``one_trip_dequeue.py``, ``rq_start.py``). One atomic step, so no reader
      ever sees the job in neither its queue nor the started registry. (A subclass with its
      own ``get_heartbeat_ttl``, or a Redis before 6.2: RQ's start follows in one pipeline,
      ``MULTI``/``EXEC``, with the removal from the intermediate queue);
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
        self.queue_class = one_trip_dequeue(self.queue_class)

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

    def dequeue_job_and_maintain_ttl(self, timeout: Any, max_idle_time: Any = None) -> Any:
        """RQ's dequeue; its script also writes the picked job's start (``rq_start.py``), unless
        this worker class computes RQ's heartbeat TTL its own way."""
        if type(self).get_heartbeat_ttl is not RQSimpleWorker.get_heartbeat_ttl:
            return super().dequeue_job_and_maintain_ttl(timeout, max_idle_time)
        token = rq_start.starter.set(self._start_arguments)
        try:
            return super().dequeue_job_and_maintain_ttl(timeout, max_idle_time)
        finally:
            rq_start.starter.reset(token)

    def _start_arguments(self, queue: Queue) -> rq_start.StartArguments:
        busy_sent = self._state_sent == WorkerStatus.BUSY
        return rq_start.start_arguments(self, queue, busy_sent=busy_sent)

    def prepare_execution(self, job: Job) -> Execution:
        """RQ's execution record, written later in the start pipeline (or already, by the
        dequeue script: ``rq_start.py``)."""
        started: Execution | None = getattr(job, "kumiko_execution", None)
        if started is not None:
            self.executions[started.id] = started
            self._state = self._state_sent = WorkerStatus.BUSY
            return started
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
            started: Execution | None = getattr(job, "kumiko_execution", None)
            if started is None:
                super().prepare_job_execution(job, remove_from_intermediate_queue)
                return
            # Written by the dequeue script; what RQ's heartbeat and prepare_for_execution
            # set on the worker and the job besides.
            self.last_heartbeat = started.created_at
            job.worker_name = self.name
            job.last_heartbeat = job.started_at = started.created_at
            job._status = JobStatus.STARTED
            self.procline(f"Processing {job.func_name} from {job.origin} since {time.time()}")
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


class ForkingWorkerBase(RidesOutCuts, _StopsPubSubFirst, RQForkingWorker):
    """RQ's forking worker with the fair dequeue. Its start and finish stay RQ's own, in the
    work horse; the parent charges the run's worker time (the horse's life) once the horse
    is gone, one round trip more per message (RQ's own finish sends many)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.queue_class = one_trip_dequeue(self.queue_class)

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
