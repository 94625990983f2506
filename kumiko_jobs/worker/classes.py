"""The two worker classes users name in ``RQ["WORKER_CLASS"]``, composed from the mixins here.

``Worker`` runs jobs in the worker process, like RQ's ``SimpleWorker``; ``ForkingWorker`` keeps
RQ's fork per job (the package docstring says when to pick which). What differs between them
is where the job body runs, and so how a run is ended from outside it: a cancellation is a mark
in this process or a signal to the work horse; an attempt that outlives its timeout ends the
whole in-process worker (its supervisor starts a new one) or has its work horse killed. The
rest is shared, in mixins whose order is the order of their ``work()``/``execute_job()``:
``KeepsRunsAlive`` (keeps_alive.py), ``BootsFirst``, ``RefusesForeignMessages`` (foreign.py).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import signal
from datetime import timedelta
from typing import Any

from django.db import connections

from .. import transport
from ..core import conf
from ..core.envelope import run_id_of
from ..run import cancellation
from ..run.steps.tenancy import reset_connections
from ..telemetry import flush as telemetry_flush
from ..transport import BookkeepingSimpleWorker, ForkingWorkerBase
from . import boot, slots, stale_roles
from .foreign import RefusesForeignMessages, hide_rq_outcome_lines, json_only
from .keeps_alive import KeepsRunsAlive
from .sweep import record_cancelled
from .timeouts import FinalTimeout, record_overrun

logger = logging.getLogger("kumiko_jobs.worker")


class BootsFirst:
    """Worker mixin: boot gates and boot jobs run before the first message (boot.py).

    They run once the worker is configured (its queues known, its heart beating); a failing
    boot gate raises and the worker never starts.
    """

    def work(self, *args: Any, **kwargs: Any) -> bool:
        """Run the boot gates and boot jobs for this worker's queues, then RQ's loop; a failing gate
        raises here, so the worker never takes a message.
        """
        if kwargs.get("with_scheduler"):
            # RQ's own scheduler moves RQ's scheduled jobs; kumiko's wait in rq-scheduler's.
            logger.warning(
                "rqworker --with-scheduler starts RQ's own scheduler, which does not serve "
                "kumiko: retries with a delay, deferrals, enqueue_in/enqueue_at and cron ticks "
                "wait for `python manage.py rqscheduler --interval 1`; run that beside the "
                "workers and drop --with-scheduler"
            )
        if self.boots:
            work_kwargs = {"burst": args[0], **kwargs} if args else dict(kwargs)
            if not work_kwargs.get("burst"):
                # A long-running worker's: a burst worker drains and ends (tests, a cron's
                # drain), and the first run's own error names the fix there.
                stale_roles.warn_stale_roles()
            boot.on_worker_start(
                set(self.queue_names()),  # type: ignore[attr-defined]
                self._boot_gate_bound,
            )
            if not work_kwargs.get("burst"):
                freeze_start_up_heap()  # a long-running worker's (a burst worker soon ends)
            self._after_boot(work_kwargs)
        try:
            return bool(super().work(*args, **kwargs))  # type: ignore[misc]
        finally:
            self._after_work()

    # False for the sibling slots of a worker process (slots.py): the main slot booted.
    boots = True

    def _after_boot(self, work_kwargs: dict[str, Any]) -> None:
        """Hook: the boot is done and the first message is next (``Worker`` starts its slots)."""

    def _after_work(self) -> None:
        """Hook: RQ's loop has ended (``Worker`` waits for its slots)."""

    def _boot_gate_bound(self, seconds: int) -> Any:
        # The worker's own death penalty: a boot gate's timeout is final like a run's.
        return self.death_penalty_class(  # type: ignore[attr-defined]
            seconds, transport.JobTimeout, job_id="boot"
        )


def freeze_start_up_heap() -> None:
    """Leave what the process holds at start-up out of every later garbage collection.

    A worker holds some 100,000 objects once Django, the project and RQ are loaded (modules,
    classes, functions, settings), which live as long as the process. Python's full
    collection walks all of them with the GIL held (115-150 ms on the 2-CPU bench machine at
    load 8-10), so every slot of the process stands still meanwhile, and the runs waiting
    behind them start that much later (bench/README.md, "Pickup's tail"). ``gc.freeze()``
    moves them to the permanent generation after one last collection: later collections walk
    only what the runs made, and a forking worker's work horses share those pages instead of
    copying them when a collection would have touched them.
    """
    gc.collect()
    gc.freeze()


class Worker(KeepsRunsAlive, BootsFirst, RefusesForeignMessages, BookkeepingSimpleWorker):
    """The default worker: runs each job in this process, reusing its database connection.

    About five times the throughput of forking for short database jobs. Its cost is that a run
    could leak state into the next one, so after every run it goes back to the public schema and
    drops connections the run left unusable; a cold shutdown mid-run is handled like a crash.
    """

    death_penalty_class: Any = FinalTimeout
    # The sibling slots of this process (WORKER_CONCURRENCY > 1; slots.py), shared with them.
    _slot_group: slots.SlotGroup | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **json_only(kwargs))
        hide_rq_outcome_lines(self.log)

    def _after_boot(self, work_kwargs: dict[str, Any]) -> None:
        count = conf.worker_concurrency()
        if count > 1:
            group = self._slot_group = slots.SlotGroup(self, count)
            for sibling in group.workers:
                sibling._slot_group = group
            group.start(work_kwargs)

    def _after_work(self) -> None:
        group = self._slot_group
        if group is not None and group.main is self:
            if not group.burst:
                # In burst mode each slot ends when it finds the queues empty: a sibling
                # whose run released a held-back message (sequential) still takes it.
                group.stop()
            group.join()

    def handle_warm_shutdown_request(self) -> None:
        """RQ's warm shutdown, for every slot of the process: each ends after its run."""
        super().handle_warm_shutdown_request()
        if self._slot_group is not None:
            self._slot_group.stop()

    def _overran(self, job_id: str) -> None:
        # The job runs in this process, and a thread cannot stop it: the process leaves, as
        # after a crash, once the attempt is recorded as timed out. The retry is left to the
        # relay (no push here), so it cannot start before this process is gone. With slots,
        # the other slots' runs go back through the sweep too (their liveness keys go).
        if not record_overrun(job_id, f"its worker {self.name} exited to end it", push=False):
            return
        if self._slot_group is not None:
            self._slot_group.say_goodbye()
        logger.error(
            "worker %s: %s would not stop %s s after its timeout; recorded it as timed out, "
            "exiting (the supervisor starts a new worker)",
            self.name,
            job_id,
            conf.get().TIMEOUT_KILL_AFTER,
        )
        if self._heart is not None:
            self._heart.stop(timeout=1.0)
        os._exit(1)

    def _cancel_seen(self, job_id: str, who: str) -> None:
        # The body runs in this process: the mark is what ctx.cancel_requested reads. A job
        # that never checks runs on to its end or its timeout (no thread can stop it).
        run_id = run_id_of(job_id)
        if run_id is not None:
            cancellation.mark(run_id, who)
            logger.warning("worker %s: cancellation of %s requested by %s", self.name, job_id, who)

    def execute_job(self, job: Any, queue: Any) -> None:
        """RQ's execution, then a clean slate for the next run in this process: forget the run's
        cancellation mark and drop connections the run left unusable.
        """
        try:
            super().execute_job(job, queue)
        finally:
            run_id = run_id_of(job.id)
            if run_id is not None:
                cancellation.forget(run_id)
            reset_connections()

    def request_force_stop(self, signum: int, frame: Any) -> None:
        """On a cold shutdown during a run, exit at once as a crash would, so the sweep retries the
        run instead of RQ's ``SystemExit`` failing it for good. Without a run, or within a second
        of the warm stop request, RQ's own cold shutdown.
        """
        # RQ's cold shutdown raises SystemExit inside the job, and the records step would then
        # fail the run for good. Leave instead, as a crash would: the transaction dies with the
        # connection, and the sweep retries the run (or fails it on its last attempt) as soon
        # as it sees this worker gone, which the goodbye below makes immediate.
        heart, requested = self._heart, getattr(self, "_shutdown_requested_date", None)
        repeated = requested is not None and transport.utcnow() - requested < timedelta(seconds=1)
        group = self._slot_group
        running = [heart.current] if heart is not None and heart.current else []
        running += group.busy() if group is not None else []
        if running and not repeated:
            logger.warning(
                "worker %s: cold shutdown during %s; leaving it to the sweep, as after a crash",
                self.name,
                ", ".join(running),
            )
            if group is not None:
                group.say_goodbye()
            if heart is not None:
                heart.stop(timeout=1.0)
            os._exit(1)
        super().request_force_stop(signum, frame)


class ForkingWorker(KeepsRunsAlive, BootsFirst, RefusesForeignMessages, ForkingWorkerBase):
    """RQ's fork-per-job isolation, with kumiko's refusal, liveness and final timeouts.

    The parent closes its database connections before forking (a socket shared by two processes
    corrupts both), and the work horse flushes telemetry before it exits. A cancelled or
    overrunning attempt has its work horse killed (with the horse's children).
    """

    death_penalty_class = FinalTimeout
    # (RQ job id, pid) of the current work horse, and the RQ job whose horse the watchdog
    # killed for outliving its timeout.
    _horse_of: tuple[str, int] = ("", 0)
    _killed_for_timeout = ""
    _killed_for_cancel = ""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **json_only(kwargs))
        hide_rq_outcome_lines(self.log)

    def _overran(self, job_id: str) -> None:
        # RQ's own monitor would kill the horse 60 to 90 s after the timeout (it checks every
        # job_monitoring_interval, 30 s, for timeout + 60 s); the watchdog does it sooner. The
        # horse called setpgrp, so its group is its pid: the kill takes its children too.
        horse_job, pid = self._horse_of
        if horse_job != job_id or not pid:
            return
        logger.error(
            "worker %s: %s would not stop %s s after its timeout; killing its work horse %s",
            self.name,
            job_id,
            conf.get().TIMEOUT_KILL_AFTER,
            pid,
        )
        self._killed_for_timeout = job_id
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)

    def work(self, *args: Any, **kwargs: Any) -> bool:
        """Install the cancellation signal handler before the first fork, so every work horse
        inherits it, then RQ's loop.
        """
        cancellation.listen_for_signal()
        return bool(super().work(*args, **kwargs))

    def _cancel_seen(self, job_id: str, who: str) -> None:
        # The body runs in the work horse: signal it (its handler marks the run there). Its
        # grace period starts now; see _cancel_overran.
        horse_job, pid = self._horse_of
        if horse_job != job_id or not pid:
            return
        logger.warning(
            "worker %s: cancellation of %s requested by %s; told its work horse %s",
            self.name,
            job_id,
            who,
            pid,
        )
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, cancellation.SIGNAL)

    def _cancel_overran(self, job_id: str) -> None:
        horse_job, pid = self._horse_of
        if horse_job != job_id or not pid:
            return
        logger.error(
            "worker %s: cancelled %s still running %s s after the request; killing its work "
            "horse %s",
            self.name,
            job_id,
            conf.get().CANCEL_GRACE,
            pid,
        )
        self._killed_for_cancel = job_id
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)

    def handle_work_horse_killed(self, job: Any, retpid: Any, ret_val: Any, rusage: Any) -> None:
        """After RQ reaps a killed work horse, record why when this worker killed it: a cancellation
        past ``CANCEL_GRACE`` ends the run cancelled, a timeout overrun records the attempt as timed
        out and pushes its retry.
        """
        super().handle_work_horse_killed(job, retpid, ret_val, rusage)
        if self._killed_for_cancel == job.id:
            self._killed_for_cancel = ""
            try:
                record_cancelled(
                    job.id, f"its worker {self.name} killed the work horse after CANCEL_GRACE"
                )
            except Exception:
                # PostgreSQL unreachable: the sweep ends the run (cancelled) once it sees no
                # live worker executes it.
                logger.exception("could not record the cancelled attempt of %s", job.id)
            return
        if self._killed_for_timeout == job.id:
            self._killed_for_timeout = ""
            # The horse is dead and reaped: the retry may be pushed at once.
            record_overrun(job.id, f"its worker {self.name} killed the work horse", push=True)

    def _after_redis_loss(self) -> None:
        # Do not take the next message while the horse of this one may still be running.
        with contextlib.suppress(OSError):
            if self.horse_pid:
                self.wait_for_horse()

    def execute_job(self, job: Any, queue: Any) -> None:
        """RQ's execution; afterwards no work horse is current, so the watchdog and cancellations
        stop targeting its pid.
        """
        try:
            super().execute_job(job, queue)
        finally:
            self._horse_of = ("", 0)

    def fork_work_horse(self, job: Any, queue: Any) -> None:
        """Close the database connections before forking (a socket shared by two processes corrupts
        both), then remember which job the new horse runs, for cancellations and the watchdog.
        """
        connections.close_all()
        super().fork_work_horse(job, queue)
        self._horse_of = (job.id, self.horse_pid)

    def perform_job(self, job: Any, queue: Any, execution: Any) -> bool:
        """In the work horse: tell the cancellation signal which run it means, and before the horse
        exits flush telemetry and close its connections (its buffers die with it).
        """
        try:
            if self.is_horse:
                run_id = run_id_of(job.id)
                if run_id is not None:
                    cancellation.horse_executes(run_id)
            return bool(super().perform_job(job, queue, execution))
        finally:
            if self.is_horse:
                telemetry_flush.flush()
                connections.close_all()
