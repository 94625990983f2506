"""A timed-out attempt's SQL statement is cancelled, in whichever slot it runs.

Raising the timeout in a thread that waits in a statement would abandon psycopg's wait: the
statement would run on in PostgreSQL (holding its locks) and the session would be left
mid-query. So the timeout asks PostgreSQL to cancel the statement (``cancel_running``), whose
return ends the body; libpq's cancel request has its own short connection to the server (the
busy one is not touched), made to be sent from a signal handler or from another thread.

The main slot takes its timeout as SIGALRM in its own thread and cancels what its Django
connections execute (``timeouts.FinalTimeout``). A sibling slot's timeout fires on the process's
alarm thread (``timeouts.SlotTimeout``), which cannot reach the slot's connections through
Django: Django keeps them per thread, and so does the pool of tenant logins
(``guard.roles.connections``). Without the cancel, a sibling blocked in a statement
(``pg_sleep``, a lock wait, a heavy query) never saw its timeout, and the watchdog ended the
whole process ``TIMEOUT_KILL_AFTER`` seconds later, with every other slot's run in flight. So
once slots start (``watch_connections``), every thread's database connections are noted here
as they connect (Django's ``connection_created`` signal is sent in the thread that connects: a
slot's project connections, its tenant and escape-hatch logins, a connection its run opens),
weakly and per thread, and the alarm thread finds them by the slot's thread (``of_thread``).
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Iterable
from typing import Any

from django.db.backends.signals import connection_created
from psycopg.pq import TransactionStatus

logger = logging.getLogger("kumiko_jobs.worker")
# A statement is in progress on the connection.
_PQ_ACTIVE = TransactionStatus.ACTIVE
# Seconds a timeout waits for one cancel request to reach the server (on the alarm thread every
# sibling's timeout waits behind it); an unreachable server is the watchdog's case.
_CANCEL_WITHIN = 5.0


class _ThreadConnections:
    """One thread's connections, weakly: one the thread drops is forgotten with it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # the thread adds while the alarm thread reads
        self._wrappers: weakref.WeakSet[Any] = weakref.WeakSet()

    def add(self, wrapper: Any) -> None:
        with self._lock:
            self._wrappers.add(wrapper)

    def wrappers(self) -> list[Any]:
        with self._lock:
            return list(self._wrappers)


# Each thread holds its own record (it ends with the thread); the map finds it by thread id.
_own = threading.local()
_by_thread: weakref.WeakValueDictionary[int, _ThreadConnections] = weakref.WeakValueDictionary()
_watching = False
_install_lock = threading.Lock()


def watch_connections() -> None:
    """Note every connection made from now on (the worker calls it as it starts its slots;
    a sibling thread connects only after that)."""
    global _watching
    with _install_lock:
        if not _watching:
            connection_created.connect(_noted, dispatch_uid="kumiko_jobs.worker.statements")
            _watching = True


def _noted(sender: Any, connection: Any, **kwargs: Any) -> None:
    record: _ThreadConnections | None = getattr(_own, "record", None)
    if record is None:
        record = _own.record = _ThreadConnections()
        _by_thread[threading.get_ident()] = record
    record.add(connection)


def of_thread(thread: int) -> list[Any]:
    """The connections ``thread`` made since ``watch_connections`` (and still holds)."""
    record = _by_thread.get(thread)
    return record.wrappers() if record is not None else []


def cancel_running(wrappers: Iterable[Any]) -> bool:
    """Ask PostgreSQL to cancel the statement each of ``wrappers`` (Django connections)
    executes; True if there was one."""
    cancelled = False
    for wrapper in wrappers:
        raw = wrapper.connection
        pgconn = getattr(raw, "pgconn", None)
        if raw is None or pgconn is None or raw.closed:
            continue
        if pgconn.transaction_status != _PQ_ACTIVE:
            continue
        try:
            raw.cancel_safe(timeout=_CANCEL_WITHIN)
        except Exception:
            logger.exception("could not cancel the statement of a timed-out attempt")
            continue
        cancelled = True
    return cancelled
