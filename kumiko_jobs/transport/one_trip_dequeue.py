"""The fair dequeue as RQ's worker calls it: ``Queue.dequeue_any`` in one round trip.

Mixed into the worker's queue class by both worker bases (``rq_worker.py``); the script itself
and its policy are ``fair.py`` and ``fair_policy.py``. Kept apart from the worker bases because
it re-implements RQ's ``dequeue_any`` and ``_fetch_dequeued_job``, to be re-read on every RQ
upgrade.
"""

from __future__ import annotations

import time
from typing import Any, cast

from redis import Redis
from rq import Queue
from rq.exceptions import DequeueTimeout
from rq.job import Job, parse_job_id
from rq.utils import as_text, backend_class, get_version

from ..core import conf
from . import doorbell, fair, rq_start


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
            make_start = rq_start.starter.get()
            for queue in queues:
                start = make_start(queue) if make_start is not None else None
                popped = _pop(connection, queue, job_cls, mode, start)
                job_id = as_text(popped[0])
                if not job_id:
                    if as_text(popped[1]) == "rate":  # seconds until a rate window reopens
                        wait = float(as_text(popped[2]))
                        reopens = wait if reopens is None else min(reopens, wait)
                    why = why if why == "busy" else as_text(popped[1])
                    continue
                found = cls._restore_popped(
                    queue,
                    job_id,
                    popped,
                    connection,
                    job_cls,
                    serializer,
                    death_penalty_class,
                    start,
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
        start: rq_start.StartArguments | None = None,
    ) -> tuple[Job, Queue] | None:
        """The dequeued job from the script's reply, read as RQ reads it (None: look again);
        with ``start``, the execution the script wrote for it (``rq_start.py``) goes with it."""
        flat = popped[1]
        if parse_job_id(job_id) != job_id:
            raise _not_an_rq_id(job_id, queue, popped, connection, start)
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
            # ...which also removes RQ's start of it that the script wrote and frees the cap
            # slots its pick took (worker_commands.py)
            if start is not None:
                exc.kumiko_execution = start.execution(job)  # type: ignore[attr-defined]
            exc.kumiko_caps = as_text(popped[6]) if len(popped) > 6 else ""  # type: ignore[attr-defined]
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
        if start is not None:  # the script wrote RQ's start of it
            job.kumiko_execution = start.execution(job)  # type: ignore[attr-defined]
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


def _not_an_rq_id(
    job_id: str,
    queue: Queue,
    popped: list[Any],
    connection: Redis,
    start: rq_start.StartArguments | None,
) -> Exception:
    """The error for a message whose id has ":", tagged as RQ tags a hash it cannot load.

    RQ reads such an id as an execution's composite key (``rq.job.parse_job_id``): the job
    built from it would be another's, and every write of a refusal would miss the keys the
    script wrote. No RQ enqueue makes such an id (RQ's ``JOB_ID_PATTERN``); a message pushed
    by hand does: the worker removes it as one RQ cannot load (``worker/foreign.py``)."""
    exc = ValueError(
        f"{job_id!r} is not an RQ job id (RQ would read it as {parse_job_id(job_id)!r})"
    )
    exc.job_id = job_id  # type: ignore[attr-defined]
    exc.queue = queue  # type: ignore[attr-defined]
    if start is not None and popped[1] != 0:  # (the script starts only a hash it read)
        exc.kumiko_execution = start.execution_of(job_id, connection)  # type: ignore[attr-defined]
    exc.kumiko_caps = as_text(popped[6]) if len(popped) > 6 else ""  # type: ignore[attr-defined]
    return exc


def _pop(
    connection: Redis,
    queue: Queue,
    job_cls: type[Job],
    mode: str,
    start: rq_start.StartArguments | None,
) -> list[Any]:
    """One call of the dequeue script on ``queue`` (writing RQ's start too, with ``start``)."""
    return fair.dequeue(
        connection,
        queue.name,
        queue.key,
        queue.intermediate_queue_key,
        job_cls.redis_job_namespace_prefix,
        mode,
        start.args if start is not None else (),
    )


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


_one_trip_queue_classes: dict[type, type] = {}


def one_trip_dequeue(queue_class: Any) -> Any:
    """``queue_class`` (RQ's, django-rq's or the project's) with the one-trip dequeue."""
    if issubclass(queue_class, _OneTripDequeue):
        return queue_class
    cls = _one_trip_queue_classes.get(queue_class)
    if cls is None:
        cls = type(queue_class.__name__, (_OneTripDequeue, queue_class), {})
        _one_trip_queue_classes[queue_class] = cls
    return cls
