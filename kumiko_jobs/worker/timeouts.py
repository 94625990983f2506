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
import heapq
import itertools
import logging
import os
import threading
import time
from typing import Any

from django.db import connections

from .. import transport
from ..core import conf
from ..core.current import job_alarm
from ..run import async_body
from ..run.state import current_run
from . import statements
from .sweep import record_timed_out

logger = logging.getLogger("kumiko_jobs.worker")


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
            if statements.cancel_running(connections.all(initialized_only=True)):
                # The body waits in a statement. Raising the timeout here would abandon
                # psycopg's wait: the statement would run on in PostgreSQL (holding its locks)
                # and the session would be left mid-query. Instead PostgreSQL cancels it, its
                # error ends the body, and run.entry.call_job records the attempt as timed out
                # (timeout_fired); the session is clean for the next run.
                return
        super().handle_death_penalty(signum, frame)


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
    """The death penalty of a slot (worker/slots.py): a deadline on the process's one alarm
    thread (``_SlotAlarms``), because SIGALRM is one per process and only the main thread can
    take a signal.

    When the deadline passes, the alarm thread raises the timeout in the slot's thread
    (``PyThreadState_SetAsyncExc``, as RQ's ``TimerDeathPenalty``). The exception is made in
    that thread, in the run's own context, and its constructor notes the timeout on the run
    first, as ``FinalTimeout`` does from its signal handler: a job that catches it still ends
    timed out (``run.entry.call_job``). Python delivers it at the thread's next bytecode, so a
    slot waiting in a C call sees it when that call returns: for a SQL statement the alarm
    thread then asks PostgreSQL to cancel it (``statements.cancel_running``, as the main
    slot's handler does), and the statement returns at once, its session clean, with the
    timeout raised where it returns. The worker's watchdog (``TIMEOUT_KILL_AFTER``) bounds what
    never returns (``time.sleep``, a job that catches the timeout and goes on). The alarm is
    withdrawn under the same lock as it fires, so a timeout that has not been delivered when
    the body ends is taken back and never interrupts the writes of the outcome, nor is a
    statement of theirs cancelled.

    Per run this costs a heap push and, when the body ends, a flag: no thread and no class are
    made per run (one ``threading.Timer`` thread and one exception class each were, ~0.2 ms).
    The exception class is made once per base class; its constructor finds the penalty that
    raised it through the thread it is raised in (``_fired_in_thread``).
    """

    def __init__(self, timeout: Any, exception: Any = None, **kwargs: Any) -> None:
        self._timeout = float(timeout or 0)
        base: type[BaseException] = (
            exception if isinstance(exception, type) else transport.JobTimeout
        )
        self._job_timeout = issubclass(base, transport.JobTimeout)
        self._thread = threading.get_ident()
        self._lock = threading.Lock()
        self._armed = False  # on the alarm thread's heap, not fired and not withdrawn
        self._pending = False  # raised in the slot's thread but not delivered yet
        self._exception = _noting_class(base)

    def __enter__(self) -> SlotTimeout:
        self.setup_death_penalty()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.cancel_death_penalty()

    def setup_death_penalty(self) -> None:
        """Put the deadline on the alarm thread, and publish how to withdraw it
        (``core.current.job_alarm``)."""
        if self._timeout <= 0:
            return
        self._armed = True
        _alarms.arm(time.monotonic() + self._timeout, self)
        if self._job_timeout:
            job_alarm.set(self.cancel_death_penalty)

    def cancel_death_penalty(self) -> None:
        """Withdraw the deadline; a timeout raised but not yet delivered is taken back."""
        with self._lock:
            withdrawn, self._armed = self._armed, False
            if self._pending:
                _raise_in(self._thread, None)
                self._pending = False
                if _fired_in_thread.get(self._thread) is self:
                    del _fired_in_thread[self._thread]
        if withdrawn:
            _alarms.withdrawn()
        if self._job_timeout:
            job_alarm.set(None)

    def _fire(self) -> None:
        """On the alarm thread, once the deadline passed."""
        with self._lock:
            if not self._armed:
                return  # withdrawn meanwhile
            self._armed = False
            self._pending = True
            _fired_in_thread[self._thread] = self  # before the raise: its constructor reads it
            _raise_in(self._thread, self._exception)
            if self._job_timeout:
                # Raised first, so that the statement returns to a pending timeout; under the
                # lock, so that what is cancelled is the body's, never the outcome's writes.
                statements.cancel_running(statements.of_thread(self._thread))
            # An async job's thread waits for its coroutine without running bytecode: hand
            # it something to run, so the timeout is delivered now (run/async_body.py).
            async_body.wake(self._thread)

    def _delivered(self) -> None:
        # In the slot's thread, as the exception is made: nothing is pending any more.
        self._pending = False


# The penalty whose timeout was raised in a slot's thread (by thread id) and not delivered yet:
# the exception's constructor, which runs in that thread, takes it from here (a withdrawal that
# takes the exception back removes it).
_fired_in_thread: dict[int, SlotTimeout] = {}
_noting_classes: dict[type[BaseException], type[BaseException]] = {}


def _noting_class(base: type[BaseException]) -> type[BaseException]:
    """``base`` with a constructor that notes the timeout on the run first (made once per base;
    named like ``base``, so the history's error type is RQ's ``JobTimeoutException``)."""
    cls = _noting_classes.get(base)
    if cls is None:

        def noted(exc: BaseException, *args: Any) -> None:
            penalty = _fired_in_thread.pop(threading.get_ident(), None)
            seconds = int(penalty._timeout) if penalty is not None else 0
            BaseException.__init__(exc, f"Task exceeded maximum timeout value ({seconds} seconds)")
            if penalty is None:
                return
            penalty._delivered()
            state = current_run.get() if penalty._job_timeout else None
            if state is not None:
                state.note_timeout(seconds)

        cls = type(base.__name__, (base,), {"__init__": noted})
        _noting_classes[base] = cls
    return cls


class _SlotAlarms:
    """The process's one alarm thread for every sibling slot's timeout: a heap of deadlines.

    ``arm`` pushes a deadline and wakes the thread only when it is the new earliest; a
    withdrawn penalty stays on the heap (no wake-up, no search) until its time, when the thread
    finds it disarmed and drops it, or until withdrawn entries are the larger part of the heap,
    when it is rebuilt without them: the heap holds at most about twice the armed deadlines,
    however long the timeouts (memory stays flat over a long drain). Started on first use; a
    forked child starts with none (as no timer thread survived a fork before).
    """

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._heap: list[tuple[float, int, SlotTimeout]] = []
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None
        self._withdrawn = 0  # withdrawals since the last rebuild (some may have been dropped)

    def arm(self, deadline: float, penalty: SlotTimeout) -> None:
        with self._cond:
            if self._thread is None:
                self._start()
            heapq.heappush(self._heap, (deadline, next(self._seq), penalty))
            if self._heap[0][2] is penalty:
                self._cond.notify()

    def withdrawn(self) -> None:
        """A penalty on the heap was withdrawn; rebuild the heap once most entries are."""
        with self._cond:
            self._withdrawn += 1
            if self._withdrawn > max(_REBUILD_AFTER, len(self._heap) // 2):
                self._heap = [entry for entry in self._heap if entry[2]._armed]
                heapq.heapify(self._heap)
                self._withdrawn = 0

    def _start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="kumiko-slot-alarms", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            due: list[SlotTimeout] = []
            with self._cond:
                while not self._heap:
                    self._cond.wait()
                now = time.monotonic()
                while self._heap and self._heap[0][0] <= now:
                    due.append(heapq.heappop(self._heap)[2])
                if not due:
                    self._cond.wait(self._heap[0][0] - now)
                    continue
            for penalty in due:  # outside the heap's lock: arm() never waits for a firing
                try:
                    penalty._fire()
                except Exception:
                    logger.exception("could not raise a slot's timeout")

    def pending(self) -> int:
        """Deadlines on the heap, withdrawn ones included (tests)."""
        with self._cond:
            return len(self._heap)


# Withdrawals before the heap is rebuilt at the earliest (a rebuild is O(heap)).
_REBUILD_AFTER = 64
_alarms = _SlotAlarms()


def _forget_in_child() -> None:
    # The child has this thread only: no alarm thread, and a heap lock another thread may hold.
    global _alarms
    _alarms = _SlotAlarms()
    _fired_in_thread.clear()


os.register_at_fork(after_in_child=_forget_in_child)


def _raise_in(thread: int, exception: type[BaseException] | None) -> None:
    """Raise ``exception`` in ``thread`` at its next bytecode (None: take a pending one back)."""
    target = ctypes.py_object(exception) if exception is not None else None
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread), target)
