"""The ``rqscheduler`` loop: delayed messages moved once due, to the millisecond, never before.

rq-scheduler scores its set in whole seconds (rounded down) and compares them with a clock
rounded down too, and its loop sleeps ``--interval`` seconds between rounds: a message was moved
up to a second early or up to an interval late. kumiko's pushes score the due time to the
microsecond (``pushing``); this loop compares it with the clock to the microsecond and, between
two ``--interval`` rounds, watches the earliest due time (``SCHEDULER_POLL``) to run a round
as soon as it has passed. ``scheduler.Scheduler`` builds on it.
"""

from __future__ import annotations

import time
from typing import Any

from ..core import conf
from .queues import DelayedSet
from .scheduler_lock import RenewedLock


class SchedulerLoop(DelayedSet):
    """rq-scheduler's process (registration, rounds under its lock, death mark), with kumiko's
    clock and wake-ups."""

    def serve(self, burst: bool = False) -> None:
        """The scheduler's life: registered, rounds under rq-scheduler's lock, its death mark.

        rq-scheduler's own loop sleeps ``--interval`` seconds (a whole number: django-rq's
        ``rqscheduler`` parses it as an integer) between rounds, so a message waited up to that
        long past its due time. Between two of those rounds this one watches the earliest due
        time (``SCHEDULER_POLL``) and runs a round when it has passed: a delay is honoured to a
        few milliseconds instead of to the next whole second.
        """
        self.register_birth()
        self._install_signal_handlers()
        self._renews_lock = True
        try:
            while True:
                full_round_at = time.monotonic() + self._interval
                if self._round(full=True) and burst:
                    return
                while self._wait_for_due(full_round_at):
                    if not self._round(full=False):
                        # Another scheduler's round holds the lock (it moves what is due), or
                        # a killed one's until it expires: look again after a poll, not only
                        # at the next full round, so a hand-over costs at most the lock's TTL.
                        time.sleep(conf.get().SCHEDULER_POLL)
        finally:
            self.remove_lock()
            self.register_death()

    _last_round_at = 0.0  # epoch seconds: every message due by then was looked at
    _lock: RenewedLock | None = None
    _renews_lock = False  # only the process's own loop keeps its lock alive (serve)

    def acquire_lock(self) -> bool:
        """rq-scheduler's lock, for ``SCHEDULER_LOCK_TTL`` seconds (scheduler_lock.py), renewed
        while this scheduler's loop holds it."""
        if self._lock is None:
            self._lock = RenewedLock(
                self.connection, self.scheduler_lock_key, conf.get().SCHEDULER_LOCK_TTL
            )
        self._lock_acquired = self._lock.acquire(renew=self._renews_lock)
        return self._lock_acquired

    def remove_lock(self) -> None:
        """Give the lock back, unless it has gone to another scheduler meanwhile."""
        if self._lock is not None:
            self._lock.release()
        self._lock_acquired = False

    def lock_lost(self) -> bool:
        """This round's lock expired or went to another scheduler: stop moving messages."""
        return self._lock is not None and self._lock.lost

    def _round(self, *, full: bool) -> bool:
        """One round under rq-scheduler's lock: move what is due, ring due cron alarms.
        False when another scheduler holds the lock (it moves them)."""
        started = time.time()
        if full:
            self.heartbeat()
        if not self.acquire_lock():
            # rq-scheduler's warning, once per --interval; the rounds in between keep quiet.
            log = self.log.warning if full else self.log.debug
            log("Lock already taken - skipping run")
            return False
        # Only now: a round that did not get the lock has looked at nothing, so what fell due
        # meanwhile must still wake this scheduler if the holder never moves it (killed).
        self._last_round_at = started
        try:
            self.enqueue_jobs()
            if full:
                self.heartbeat()
        finally:
            self.remove_lock()
        return True

    def _wait_for_due(self, until: float) -> bool:
        """Sleep until a message falls due (True) or until ``until`` (monotonic), the next full
        round (False). One Redis round trip every ``SCHEDULER_POLL`` seconds at most.

        Only messages due after the last round count: one that round left due on purpose (a
        cron alarm while PostgreSQL is down) waits for the next full round instead of making
        every wake-up a round.
        """
        poll = conf.get().SCHEDULER_POLL
        while True:
            left = until - time.monotonic()
            if left <= 0:
                return False
            if not poll:
                time.sleep(left)
                return False
            due = self._next_due_after(self._last_round_at)
            now = time.time()
            if due is not None and due <= now:
                return True
            nap = min(left, poll, (due - now) if due is not None else poll)
            time.sleep(max(nap, 0.0))

    def _next_due_after(self, after: float) -> float | None:
        """The earliest due time (epoch seconds) later than ``after``, or None."""
        first = self.connection.zrangebyscore(
            self.scheduled_jobs_key, f"({after!r}", "+inf", start=0, num=1, withscores=True
        )
        return float(first[0][1]) if first else None

    def get_jobs_to_queue(self, with_times: bool = False) -> Any:
        """The jobs due now, to the microsecond: rq-scheduler compares whole seconds (its
        ``to_unix`` truncates the clock), which moved a message due at 12.9 s at 12.0 s."""
        return self.get_jobs(time.time(), with_times=with_times)
