"""Several runs at once in one worker process: ``WORKER_CONCURRENCY`` slots.

A slot is a whole kumiko worker in a thread of its own: the process's ``Worker`` is the first
slot (the main thread, with RQ's signals and its SIGALRM timeout), and ``count - 1`` sibling
workers, named ``<worker>.s<n>``, run RQ's loop in threads beside it. Each slot registers in
Redis as an RQ worker of its own, so ``rq info``, django-rq's pages and the
``StartedJobRegistry`` show every run in flight under the slot that executes it, and each
slot's job is its worker's ``current_job``. Each takes its messages through the worker's own
dequeue (``dequeue_job_and_maintain_ttl``, whatever queue class and dequeue script the worker
uses), so a fair dequeue or a rate limit applies to every slot.

What a slot never shares (docs/design.md, "Slots"): its Django connections (Django keeps
them per thread) and so its tenant logins (``guard.roles.connections``' pool is per thread), its
context (each attempt runs in ``attempt_context()`` in the slot's thread), its kept search
path and session reset (the tenancy step, on the slot's connections), its timeout (its own
deadline on the process's one alarm thread, ``timeouts.SlotTimeout``, which cancels the
slot's SQL statement: ``statements``), its content types (Django's cache, keyed per thread and
schema: ``schema_caches``), its liveness beat, watchdog and cancellation (each slot's own
``Heart``), its RQ execution and span. What slots
share: the process (its memory, imported code, job registry, the alarm thread), the Redis
client's connection pool, and the worker's settings.

A sibling waits for messages in one-second polls (a blocking pop of one second), so that a warm
shutdown (SIGTERM to the process) reaches it within a second; the main slot's handler asks
every sibling to stop after its run and waits for all of them. A worker killed with runs in
flight leaves them to the sweep, as one killed with one run: every slot's liveness key expires.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from django.db import connections

from ..guard.roles import connections as tenant_connections
from . import schema_caches, statements
from .timeouts import SlotTimeout

logger = logging.getLogger("kumiko_jobs.worker")
_POLL = 1  # seconds a sibling's blocking pop waits before it looks for a stop request


class SiblingSlot:
    """Mixed in front of the worker's own class for the slots beside the main thread."""

    death_penalty_class: Any = SlotTimeout
    boots = False  # boot gates and boot jobs ran once, in the main slot, before any slot
    maintains = False  # the main slot's heart does the process's maintenance rounds
    _stop_requested: bool
    _heart: Any

    def _install_signal_handlers(self) -> None:
        """Signals reach the main thread only: the main slot stops its siblings (SlotGroup)."""

    def dequeue_job_and_maintain_ttl(
        self, timeout: int | None, max_idle_time: int | None = None
    ) -> Any:
        """The worker's dequeue, in polls of ``_POLL`` seconds when it would block, so that a
        stop request is seen between two of them."""
        if timeout is None:  # burst: the dequeue does not block
            return super().dequeue_job_and_maintain_ttl(timeout, max_idle_time)  # type: ignore[misc]
        idle_since = time.monotonic()
        while not self._stop_requested:
            found = super().dequeue_job_and_maintain_ttl(_POLL, _POLL)  # type: ignore[misc]
            if found is not None:
                return found
            if max_idle_time is not None and time.monotonic() - idle_since >= max_idle_time:
                return None
        return None


_sibling_classes: dict[type, type] = {}


def sibling_class(worker_class: type) -> type:
    """``worker_class`` (kumiko's Worker, or a project's subclass) as a sibling slot."""
    cls = _sibling_classes.get(worker_class)
    if cls is None:
        cls = type(f"{worker_class.__name__}Slot", (SiblingSlot, worker_class), {})
        _sibling_classes[worker_class] = cls
    return cls


class SlotGroup:
    """The sibling slots of one worker process: started after boot, stopped and joined with it."""

    def __init__(self, main: Any, count: int) -> None:
        self.main = main
        cls = sibling_class(type(main))
        self.workers = [
            cls(
                main.queues,
                name=f"{main.name}.s{n}",
                connection=main.connection,
                job_class=main.job_class,
                # The class the main slot's queues were made with (the worker wraps it with its
                # dequeue, as it wrapped the main slot's).
                queue_class=type(main.queues[0]),
                serializer=main.serializer,
                default_result_ttl=main.default_result_ttl,
                worker_ttl=main.worker_ttl,
                log_job_description=main.log_job_description,
            )
            for n in range(1, count)
        ]
        self._threads: list[threading.Thread] = []
        self.burst = False

    def start(self, work_kwargs: dict[str, Any]) -> None:
        """Each sibling runs RQ's loop with the main slot's ``work()`` options in its thread."""
        kwargs = {**work_kwargs, "with_scheduler": False}
        self.burst = bool(kwargs.get("burst"))
        # Before any sibling connects: its timeout cancels its statements from the alarm thread.
        statements.watch_connections()
        # Before two runs overlap: no slot reads another's tenant's content types.
        schema_caches.key_by_schema()
        for worker in self.workers:
            thread = threading.Thread(
                target=_run_slot, args=(worker, kwargs), name=f"kumiko-{worker.name}", daemon=True
            )
            self._threads.append(thread)
            thread.start()

    def stop(self) -> None:
        """Warm shutdown: every sibling ends after its current run (or its next poll)."""
        for worker in self.workers:
            worker._stop_requested = True

    def join(self) -> None:
        """Wait for every sibling to end (the warm shutdown waits for every slot)."""
        for thread in self._threads:
            thread.join()

    def busy(self) -> list[str]:
        """The RQ job ids the siblings execute now."""
        return [w._heart.current for w in self.workers if w._heart is not None and w._heart.current]

    def say_goodbye(self) -> None:
        """Before the process leaves mid-run: every sibling's liveness key goes at once, so the
        sweep hands their runs back without waiting for the keys to expire."""
        for worker in self.workers:
            if worker._heart is not None:
                worker._heart.stop(timeout=1.0)


def _run_slot(worker: Any, kwargs: dict[str, Any]) -> None:
    try:
        worker.work(**kwargs)
    except BaseException:
        logger.exception("worker slot %s ended with an error", worker.name)
    finally:
        # The slot's thread ends: its own connections go too (Django keeps them per thread,
        # and so does the pool of tenant-role logins).
        connections.close_all()
        tenant_connections.close_all()
