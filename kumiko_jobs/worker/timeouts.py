"""A timeout is final (docs/reliability.md, Timeouts).

RQ raises its timeout inside the job, and a job that catches ``Exception`` swallows it and
would "succeed" late. ``FinalTimeout``, the workers' death penalty, therefore first notes on
the run that its timeout fired (``run.entry.call_job`` reads the note), and cancels a statement the
body waits in rather than abandoning it in PostgreSQL. An attempt that still runs
``TIMEOUT_KILL_AFTER`` seconds later (it caught the timeout, or sits in a call no signal
interrupts) is ended by the worker's watchdog (heart.py); ``record_overrun`` records it.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from typing import Any

from django.db import connections
from psycopg.pq import TransactionStatus

from .. import transport
from ..core import conf
from ..core.current import job_alarm
from ..run import async_body
from ..run.state import current_run
from .sweep import record_timed_out

logger = logging.getLogger("kumiko_jobs.worker")
# A statement is in progress on the connection.
_PQ_ACTIVE = TransactionStatus.ACTIVE


class FinalTimeout(transport.DeathPenaltyBase):
    """RQ's SIGALRM death penalty, which first notes on the run that its timeout fired.

    RQ raises its timeout inside the job; a job that catches ``Exception`` swallows it and would
    "succeed" late. The note, owned by the run, makes the timeout final (``run.entry.call_job``).
    RQ also uses this class for callbacks and for the forking worker's monitor; only the job's
    own timeout is noted. The runner cancels the alarm when the job body is done
    (``core.current.job_alarm``), so the timeout never interrupts the writes of the run's outcome.
    """

    def __init__(self, timeout: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(timeout, *args, **kwargs)
        exception = args[0] if args else kwargs.get("exception")
        self._job_timeout = isinstance(exception, type) and issubclass(
            exception, transport.JobTimeout
        )

    def setup_death_penalty(self) -> None:
        """RQ's alarm; for a job's own timeout also publish how to cancel it, so the runner can stop
        the alarm once the body is done and the outcome's writes are never interrupted.
        """
        super().setup_death_penalty()
        if self._job_timeout:
            job_alarm.set(self.cancel_death_penalty)

    def cancel_death_penalty(self) -> None:
        """RQ's cancellation of the alarm, and for a job's own timeout the published canceller
        withdrawn.
        """
        super().cancel_death_penalty()
        if self._job_timeout:
            job_alarm.set(None)

    def handle_death_penalty(self, signum: int, frame: Any) -> None:
        """Note the timeout on the run (making it final even if the job catches the exception); if
        the body waits in a statement, have PostgreSQL cancel it instead of raising mid-query, else
        raise RQ's timeout.
        """
        state = current_run.get() if self._job_timeout else None
        if state is not None:
            state.note_timeout(int(self._timeout))
            if _cancel_running_statements():
                # The body waits in a statement. Raising the timeout here would abandon
                # psycopg's wait: the statement would run on in PostgreSQL (holding its locks)
                # and the session would be left mid-query. Instead PostgreSQL cancels it, its
                # error ends the body, and run.entry.call_job records the attempt as timed out
                # (timeout_fired); the session is clean for the next run.
                return
        super().handle_death_penalty(signum, frame)


def _cancel_running_statements() -> bool:
    """Ask PostgreSQL to cancel the statement each of this thread's connections is executing;
    True if there was one. Runs in a signal handler: libpq's cancel request is made for that
    (its own short connection to the server; the busy one is not touched)."""
    cancelled = False
    for conn in connections.all(initialized_only=True):
        raw = getattr(conn, "connection", None)
        pgconn = getattr(raw, "pgconn", None)
        if pgconn is None or raw is None or raw.closed:
            continue
        if pgconn.transaction_status == _PQ_ACTIVE:
            try:
                raw.cancel()
            except Exception:
                logger.exception("could not cancel the statement of a timed-out attempt")
                continue
            cancelled = True
    return cancelled


def record_overrun(job_id: str, how: str, *, push: bool) -> bool:
    """Record the attempt of ``job_id`` as timed out. False: its outcome was already recorded
    (the attempt ended just now, and only RQ's bookkeeping is left)."""
    kill_after = conf.get().TIMEOUT_KILL_AFTER
    reason = (
        f"the attempt was still running {kill_after} s after its timeout (the job caught the "
        f"timeout, or sat in a call no signal interrupts): {how}"
    )
    try:
        return record_timed_out(job_id, reason, push=push) is not None
    except Exception:
        # PostgreSQL is unreachable: the run stays running, and the sweep hands it back once
        # it sees that no live worker executes it.
        logger.exception("could not record the timed-out attempt of %s", job_id)
        return True


class SlotTimeout:
    """The death penalty of a slot (worker/slots.py): a timer, because SIGALRM is one per
    process and only the main thread can take a signal.

    When the timer fires it raises the timeout in the slot's thread (``PyThreadState_
    SetAsyncExc``, as RQ's ``TimerDeathPenalty``). The exception is made in that thread, in
    the run's own context, and its constructor notes the timeout on the run first, as
    ``FinalTimeout`` does from its signal handler: a job that catches it still ends timed out
    (``run.entry.call_job``). Python delivers it at the thread's next bytecode: a slot waiting in
    a SQL statement or a C call (``time.sleep``) sees it when that call returns, and the
    worker's watchdog (``TIMEOUT_KILL_AFTER``) bounds what never returns. The alarm is
    withdrawn under a lock, so a timeout that has not been delivered when the body ends is
    taken back and never interrupts the writes of the outcome.
    """

    def __init__(self, timeout: Any, exception: Any = None, **kwargs: Any) -> None:
        self._timeout = float(timeout or 0)
        base: type[BaseException] = (
            exception if isinstance(exception, type) else transport.JobTimeout
        )
        self._job_timeout = issubclass(base, transport.JobTimeout)
        self._thread = threading.get_ident()
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self._pending = False  # raised in the slot's thread but not delivered yet
        seconds, penalty = int(self._timeout), self

        def noted(exc: BaseException, *args: Any) -> None:
            BaseException.__init__(exc, f"Task exceeded maximum timeout value ({seconds} seconds)")
            penalty._delivered()
            state = current_run.get() if penalty._job_timeout else None
            if state is not None:
                state.note_timeout(seconds)

        self._exception = type(base.__name__, (base,), {"__init__": noted})

    def __enter__(self) -> SlotTimeout:
        self.setup_death_penalty()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.cancel_death_penalty()

    def setup_death_penalty(self) -> None:
        """Start the timer, and publish how to withdraw it (``core.current.job_alarm``)."""
        if self._timeout <= 0:
            return
        self._timer = threading.Timer(self._timeout, self._fire)
        self._timer.daemon = True
        self._timer.start()
        if self._job_timeout:
            job_alarm.set(self.cancel_death_penalty)

    def cancel_death_penalty(self) -> None:
        """Stop the timer; a timeout raised but not yet delivered is taken back."""
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            if self._pending:
                _raise_in(self._thread, None)
                self._pending = False
        if self._job_timeout:
            job_alarm.set(None)

    def _fire(self) -> None:
        with self._lock:
            if self._timer is None:
                return  # withdrawn meanwhile
            self._timer = None
            self._pending = True
            _raise_in(self._thread, self._exception)
            # An async job's thread waits for its coroutine without running bytecode: hand
            # it something to run, so the timeout is delivered now (run/async_body.py).
            async_body.wake(self._thread)

    def _delivered(self) -> None:
        # In the slot's thread, as the exception is made: nothing is pending any more.
        self._pending = False


def _raise_in(thread: int, exception: type[BaseException] | None) -> None:
    """Raise ``exception`` in ``thread`` at its next bytecode (None: take a pending one back)."""
    target = ctypes.py_object(exception) if exception is not None else None
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread), target)
