"""Housekeeping: no run stays ``running`` for ever, and old history goes away.

A run is *abandoned* when

* no live worker executes it any more: kumiko workers beat a liveness key naming the RQ job they
  execute (worker/heart.py), so a run is abandoned ``WORKER_DEAD_AFTER`` seconds after its worker
  died (killed, OOM, machine lost), or at once when its live worker has moved on without
  recording an outcome (PostgreSQL was unreachable at the end of the attempt); or
* it has been ``running`` for longer than its job's timeout plus a grace period, and no kumiko
  worker may still execute it (none beats for it, and liveness is known). A kumiko worker
  ends an attempt that outlives its timeout itself (worker/heart.py's watchdog), so the next
  attempt never starts while the previous one may still run; this rule is for runs of other
  RQ worker classes, which do not beat, and for runs executed outside RQ.

An abandoned run is retried when it has attempts left, otherwise it fails with a reason that
says so. Workers run the sweep every ``MAINTENANCE_INTERVAL`` seconds (one at a time), and at once
when a worker's beat key expired (maintenance.sweep_if_dead). A worker
that ends an overrunning attempt records it here too (``record_timed_out``), as timed out.
"""

from __future__ import annotations

import functools
import logging
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from .. import transport
from ..core import conf
from ..core.envelope import run_id_of
from ..core.exceptions import JobNotRegistered
from ..definition.registry import registry
from ..enqueueing.messages import envelope_of, pushable
from ..history import retention, transitions
from ..models import JobAttempt, JobRun, RunStatus

logger = logging.getLogger("kumiko_jobs.sweep")


@dataclass(frozen=True, slots=True)
class SweepResult:
    """What one sweep did: runs handed back for a retry, runs failed as abandoned, and the history
    rows retention deleted, per table.
    """

    retried: int = 0
    abandoned: int = 0
    deleted_runs: int = 0
    deleted_rejections: int = 0
    deleted_failures: int = 0
    deleted_audit: int = 0


def sweep() -> SweepResult:
    """One maintenance pass: hand back abandoned runs, then delete the history past
    its retention.
    """
    retried, abandoned = sweep_abandoned()
    deleted = retention.delete_expired()
    return SweepResult(
        retried, abandoned, deleted.runs, deleted.rejections, deleted.failures, deleted.audit
    )


def sweep_abandoned() -> tuple[int, int]:
    """Retry, or fail when out of attempts, every ``running`` run that no live worker executes any
    more or that outlived its timeout plus grace with no kumiko worker on it; returns (retried,
    failed).
    """
    grace = conf.get().RUNNING_TIMEOUT_GRACE
    # Before reading the runs: a run started later is too young to judge.
    alive = transport.liveness()
    now = timezone.now()
    retried = abandoned = 0
    for run in JobRun.objects.filter(status=RunStatus.RUNNING).order_by("started_at"):
        try:
            definition = registry.get(run.job_name)
        except JobNotRegistered:
            definition = None
        timeout = definition.timeout_seconds if definition else conf.get().DEFAULT_TIMEOUT
        if run.started_at is None:
            continue
        reason = _unattended(run, alive, now)
        if (
            reason is None
            and run.started_at + timedelta(seconds=timeout + grace) <= now
            and not _may_still_run(run, alive)
        ):
            reason = (
                f"abandoned: running for more than {timeout + grace} s (timeout {timeout} s + "
                f"grace {grace} s); its worker died"
            )
        if reason is None:
            continue
        outcome = _hand_back(run, definition, "Abandoned", reason, now, push=True)
        if outcome is None:
            continue
        retried += outcome == RunStatus.QUEUED
        abandoned += outcome == RunStatus.FAILED
        logger.warning("run %s of %s: %s", run.run_id, run.job_name, reason)
    return retried, abandoned


# The error type of an attempt a worker ended for outliving its timeout: RQ's, as when the
# timeout stops the job itself.
TIMED_OUT = "JobTimeoutException"


def record_timed_out(rq_job_id: str, reason: str, *, push: bool) -> str | None:
    """Record that a worker ended the attempt of this RQ job for outliving its timeout.

    A failed attempt, then a retry or the run's failure by its ``retries``, as for any timeout.
    ``push=False`` leaves the retry's message to the relay: the in-process worker records this
    just before it exits, and the next attempt must not start before it is gone. Returns the
    run's new status, or None when the run was not running that attempt any more.
    """
    runs = JobRun.objects.filter(rq_job_id=rq_job_id, status=RunStatus.RUNNING)
    if run_hex := run_id_of(rq_job_id):  # kj-<run id>-a<attempt>-...: look it up by primary key
        runs = runs.filter(pk=uuid.UUID(run_hex))
    run = runs.first()
    if run is None:
        return None
    try:
        definition = registry.get(run.job_name)
    except JobNotRegistered:
        definition = None
    # Outcome "retrying" when retried, as the runner records a timeout the job did not catch.
    outcome = _hand_back(
        run,
        definition,
        TIMED_OUT,
        reason,
        timezone.now(),
        push=push,
        retried_outcome=JobAttempt.Outcome.RETRYING,
    )
    logger.warning("run %s of %s: %s", run.run_id, run.job_name, reason)
    return outcome


def record_cancelled(rq_job_id: str, reason: str) -> str | None:
    """Record that a worker stopped the attempt of this RQ job because its run was cancelled.

    The run ends ``cancelled`` (no retry). Returns its new status, or None when the run was
    not running that attempt any more (it ended by itself meanwhile, and that outcome stands).
    """
    runs = JobRun.objects.filter(rq_job_id=rq_job_id, status=RunStatus.RUNNING)
    if run_hex := run_id_of(rq_job_id):
        runs = runs.filter(pk=uuid.UUID(run_hex))
    run = runs.first()
    if run is None:
        return None
    outcome = _hand_back(run, None, CANCELLED, reason, timezone.now(), push=False)
    logger.warning("run %s of %s cancelled: %s", run.run_id, run.job_name, reason)
    return outcome


# The error type of an attempt stopped because its run was cancelled.
CANCELLED = "JobCancelled"


def _hand_back(
    run: JobRun,
    definition: Any,
    error_type: str,
    reason: str,
    now: datetime,
    *,
    push: bool,
    retried_outcome: str = JobAttempt.Outcome.FAILED,
) -> str | None:
    """Fail the run's current attempt; retry the run or fail it. None: someone else won."""
    with transaction.atomic():
        # Claim the row: a worker that finishes meanwhile, or a second sweeper, wins.
        claimed = (
            JobRun.objects.filter(pk=run.pk, status=RunStatus.RUNNING, attempts=run.attempts)
            .select_for_update()
            .first()
        )
        if claimed is None:
            return None
        # The attempt's cap slots (transport/rate_limits.py), before the retry's push below.
        transaction.on_commit(
            functools.partial(transport.release_caps_of, claimed.queue, claimed.rq_job_id),
            robust=True,
        )
        if claimed.cancel_requested_at is not None:
            # An operator asked to cancel it: whatever ended the attempt, nothing retries it.
            return _end_cancelled(claimed, error_type, reason, now)
        retry = definition is not None and claimed.attempts < claimed.max_attempts
        delay = definition.backoff.seconds_after(claimed.attempts) if retry else 0
        transitions.hand_back(
            claimed,
            outcome=retried_outcome if retry else JobAttempt.Outcome.FAILED,
            error_type=error_type,
            reason=reason,
            now=now,
            retry_at=now + timedelta(seconds=delay) if retry else None,
        )
        if retry and push:
            message = pushable(
                definition,
                envelope_of(claimed, attempt=claimed.attempts + 1),
                delay,
                priority=claimed.priority,
            )
            # Redis down (or its tenant's weight or rate unknown now, message None): the run is
            # queued in PostgreSQL, and the relay pushes it later.
            if message is not None:
                transaction.on_commit(functools.partial(transport.push, message), robust=True)
        return str(claimed.status)


def _end_cancelled(claimed: JobRun, error_type: str, reason: str, now: datetime) -> str:
    transitions.cancel_abandoned(
        claimed, error_type=error_type, run_error_type=CANCELLED, reason=reason, now=now
    )
    return str(claimed.status)


def _may_still_run(run: JobRun, alive: transport.Liveness | None) -> bool:
    """Whether a kumiko worker may still be executing this run (so its timeout proves nothing).

    A kumiko worker that executes the run beats for it, and ends an attempt that outlives its
    timeout itself (worker/heart.py's watchdog), so the timeout rule waits for the beats to stop. It
    decides alone only for runs no kumiko worker beats for: executed outside RQ (a boot gate)
    or by a live RQ worker of another class.
    """
    if not run.rq_job_id:
        return False
    if alive is None:
        return True  # liveness unknown (Redis down or just emptied): no proof either way
    return bool(alive.executes(run.rq_job_id, uuid.UUID(str(run.run_id)).hex))


def _unattended(run: JobRun, alive: transport.Liveness | None, now: datetime) -> str | None:
    """Why no worker executes this run any more, or None if one may (or we cannot tell)."""
    dead_after = conf.get().WORKER_DEAD_AFTER
    if alive is None or not run.rq_job_id or run.started_at is None:
        return None  # liveness unknown, or a run executed outside RQ (a boot gate)
    if run.started_at + timedelta(seconds=dead_after) > now:
        return None  # its worker may not have beaten since it started
    if alive.executes(run.rq_job_id, uuid.UUID(str(run.run_id)).hex):
        return None
    worker = alive.worker_of(run.rq_job_id)
    if worker in alive.workers:
        return (
            f"abandoned: its worker {worker} is alive but no longer executes it (the attempt "
            "ended without an outcome, e.g. PostgreSQL was unreachable)"
        )
    if worker and not alive.is_gone(worker):
        return None  # a live worker of another class: only the timeout rule applies
    return f"abandoned: its worker {worker or '(unknown)'} stopped (no liveness for {dead_after} s)"


def delete_expired() -> tuple[int, int]:
    """Expired runs and rejected messages (and, with them, failures and audit rows past their
    own retention: retention.py). Returns (runs, rejected messages) deleted."""
    deleted = retention.delete_expired()
    return deleted.runs, deleted.rejections
