"""The isolation suites at several slots: ``KUMIKO_TEST_SLOTS=4 scripts/test <suites>``.

With ``KUMIKO_TEST_SLOTS`` at N > 1, the suites' in-process worker (``tests.conftest.work``)
is an N-slot kumiko worker (``worker/slots.py``: the same ``SlotGroup``, sibling threads,
connections, tenant logins, timers and hearts as ``WORKER_CONCURRENCY=N``), arranged so that
a suite's calibrations can still fail:

* the suite's runs all go, one after another, to **one sibling slot** (``.s1``, a thread that
  is not the test's, kept for the session as a one-slot worker keeps its main thread, its
  connections closed after each test): a suite that plants state in one run and looks for it
  in the next, or after the worker's burst, finds the next run on the same slot and its
  connections, as it does with one worker.
  Without this, a later run lands on any slot, usually another one, and a leak goes unseen
  (issue 25: 31 calibrations could not fail at four slots);
* every **other slot** (the main thread's included) runs one mixed-tenant neighbour
  (``tests/guardapp/slot_neighbours.py``) for as long as the suite's runs last: it checks that
  it sees only its own tenant, login and defaults, and plants the state the suites look for, so
  that anything crossing between slots fails either side.

The neighbours' runs are checked (every one succeeded) and their rows deleted before ``work``
returns, so a suite counts only its own runs. Pinning is the harness's; the slots are the
product's.
"""

from __future__ import annotations

import logging
import os
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

SLOTS_ENV = "KUMIKO_TEST_SLOTS"
# Routes that do not exist in a sibling slot: ``dbshell`` installs a signal handler, which
# Python refuses outside the main thread (ValueError). A calibration that needs them to work
# expects that refusal there instead.
MAIN_THREAD_ONLY = frozenset({"dbshell"})
NEIGHBOURS_QUEUE = "low"
_READY_WITHIN = 60  # seconds the pinned slot waits for the neighbours before it starts anyway

logger = logging.getLogger("tests.slot_harness")


def slots_wanted() -> int:
    raw = os.environ.get(SLOTS_ENV, "").strip()
    return int(raw) if raw else 1


def _neighbours(count: int) -> list[Any]:
    from example_project.customers.models import Client
    from kumiko_jobs.core import conf
    from kumiko_jobs.guard.roles import names as role_names
    from tests.guardapp import slot_neighbours

    roles = conf.get().DB_ROLES
    tenants = [
        c
        for c in sorted(
            Client.objects.filter(schema_name__in=("t1", "t2", "t3")),
            key=lambda c: ("t3", "t1", "t2").index(c.schema_name),
        )
        # A tenant whose role a test dropped gets no neighbour (its login would fail).
        if not roles or _role_exists(role_names.role_name(c.pk))
    ]
    handles = []
    for n in range(count if tenants else 0):
        tenant = tenants[n % len(tenants)]
        role = role_names.role_name(tenant.pk) if roles else None
        handles.append(slot_neighbours.neighbour.enqueue(tenant=tenant, role=role))
    return handles


def _role_exists(role: str) -> bool:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [role])
        return cursor.fetchone() is not None


def _pinned_work(work: Any, neighbours: int, **kwargs: Any) -> Any:
    from tests.guardapp import slot_neighbours

    try:
        if not slot_neighbours.wait_for(neighbours, _READY_WITHIN):
            logger.warning("%d neighbours not running; the suite's runs start anyway", neighbours)
        return work(**kwargs)
    finally:
        slot_neighbours.STOP.set()


# The pinned slot's thread, kept for the whole session as a one-slot worker keeps its main
# thread: within a test, a run leaves its connections (Django's and the tenant logins, both
# per thread) to the next run on the slot, in the next ``work()`` call too, as in a live slot.
_slot_thread: ThreadPoolExecutor | None = None


def _slot_executor() -> ThreadPoolExecutor:
    global _slot_thread
    if _slot_thread is None:
        _slot_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kumiko-pinned-slot")
    return _slot_thread


def _close_all() -> None:
    """In the pinned thread: its connections closed and forgotten (a wrapper closed inside an
    atomic block a calibration left open stays closed; a new one is made on next use)."""
    import contextlib

    from django.db import connections

    from kumiko_jobs.guard.roles import connections as tenant_connections

    for alias in list(connections):
        with contextlib.suppress(Exception):
            connections[alias].close()
        del connections[alias]
    tenant_connections.close_all()


def end_test() -> None:
    """After a test, before its fixtures' teardown: the pinned slot's connections close (a
    calibration that switches the run's clean-up off leaves a transaction open there, whose
    locks would hold the fixtures' TRUNCATE; with one slot it is the test's own connection)."""
    if _slot_thread is not None:
        _slot_thread.submit(_close_all).result()


def close() -> None:
    """At the session's end: the pinned slot's connections go, then its thread."""
    global _slot_thread
    if _slot_thread is None:
        return

    _slot_thread.submit(_close_all).result()
    _slot_thread.shutdown()
    _slot_thread = None


def _pinned_class() -> type:
    from kumiko_jobs import transport
    from kumiko_jobs.worker import Worker, slots

    class PinnedWorker(Worker):
        """The main slot: makes the process's slots, points the first sibling at the suite's
        queue and runs it on the session's pinned thread; every other slot serves the
        neighbours' queue in a thread of its own, as ``SlotGroup`` starts them."""

        pinned_queue = "default"
        slot_count = 2
        neighbours = 1
        _pinned: Future[Any] | None = None

        def _after_boot(self, work_kwargs: dict[str, Any]) -> None:
            group = self._slot_group = slots.SlotGroup(self, self.slot_count)
            for sibling in group.workers:
                sibling._slot_group = group
            pinned, *others = group.workers
            pinned.queues = [transport.get_queue(self.pinned_queue)]
            pinned._ordered_queues = pinned.queues[:]
            group.workers = others
            group.start(work_kwargs)
            group.workers = [pinned, *others]
            kwargs = {**work_kwargs, "with_scheduler": False}
            self._pinned = _slot_executor().submit(
                _pinned_work, pinned.work, self.neighbours, **kwargs
            )

        def _after_work(self) -> None:
            super()._after_work()
            if self._pinned is not None:
                self._pinned.result()  # the pinned slot's own error, if it ended with one

    return PinnedWorker


def work_in_slots(queue: str, count: int) -> None:
    """One burst of a ``count``-slot worker: the suite's queue through one sibling, the
    neighbours beside it (module docstring); raises if a neighbour saw another slot."""
    from django.db import connection

    from kumiko_jobs import transport
    from kumiko_jobs.models import JobAttempt, JobRun, RunStatus
    from tests.guardapp import slot_neighbours

    handles = _neighbours(count - 1)
    slot_neighbours.begin()
    cls = _pinned_class()
    neighbours_queue = transport.get_queue(NEIGHBOURS_QUEUE)
    worker = cls([neighbours_queue], connection=transport.connection_for(queue))
    worker.pinned_queue = queue
    worker.slot_count = count
    worker.neighbours = len(handles)
    worker.work(burst=True)
    connection.set_schema_to_public()
    ids = [h.run_id for h in handles]
    runs = list(JobRun.objects.filter(pk__in=ids))
    bad = [
        (r.status, r.error_type, r.error_message) for r in runs if r.status != RunStatus.SUCCEEDED
    ]
    JobAttempt.objects.filter(run_id__in=ids).delete()
    JobRun.objects.filter(pk__in=ids).delete()
    assert len(runs) == len(ids) and not bad, f"the neighbour slots saw another slot: {bad}"
