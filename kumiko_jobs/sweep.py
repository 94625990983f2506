"""Housekeeping: no run stays ``running`` for ever, and old history goes away.

A run is *abandoned* when it has been ``running`` for longer than its job's timeout plus a grace
period: the worker's own death penalty would have ended it by then, so its worker died (killed,
OOM, machine lost). An abandoned run is retried when it has attempts left, otherwise it fails
with a reason that says so.
"""

from __future__ import annotations

import functools
import logging
import uuid
from dataclasses import dataclass
from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from . import conf, transport
from .enqueueing import message_for, timeout_of
from .envelope import Envelope
from .exceptions import JobNotRegistered
from .models import FINISHED_STATUSES, JobAttempt, JobRun, RejectedMessage, RunStatus
from .registry import registry

logger = logging.getLogger("kumiko_jobs.sweep")


@dataclass(frozen=True, slots=True)
class SweepResult:
    retried: int = 0
    abandoned: int = 0
    deleted_runs: int = 0
    deleted_rejections: int = 0


def sweep() -> SweepResult:
    retried, abandoned = sweep_abandoned()
    runs, rejections = delete_expired()
    return SweepResult(retried, abandoned, runs, rejections)


def envelope_of(run: JobRun, *, attempt: int) -> Envelope:
    """Rebuild the message of a run from its history row (the row holds what the envelope held)."""
    return Envelope(
        job=run.job_name,
        schema=run.schema_name or None,
        kwargs=run.payload,
        run_id=uuid.UUID(str(run.run_id)).hex,
        attempt=attempt,
        defers=run.defer_count,
        gate_defers=run.gate_defer_count,
        correlation_id=run.correlation_id,
        triggered_by=run.triggered_by or None,
        trigger=run.trigger or None,
        origin=run.origin,
        parent_run_id=run.parent_run_id.hex if run.parent_run_id else None,
    )


def sweep_abandoned() -> tuple[int, int]:
    grace = conf.get().RUNNING_TIMEOUT_GRACE
    now = timezone.now()
    retried = abandoned = 0
    for run in JobRun.objects.filter(status=RunStatus.RUNNING).order_by("started_at"):
        try:
            definition = registry.get(run.job_name)
        except JobNotRegistered:
            definition = None
        timeout = timeout_of(definition) if definition else conf.get().DEFAULT_TIMEOUT
        if run.started_at is None or run.started_at + timedelta(seconds=timeout + grace) > now:
            continue
        reason = (
            f"abandoned: running for more than {timeout + grace} s (timeout {timeout} s + "
            f"grace {grace} s); its worker died"
        )
        with transaction.atomic():
            # Claim the row: a worker that finishes meanwhile, or a second sweeper, wins.
            claimed = (
                JobRun.objects.filter(pk=run.pk, status=RunStatus.RUNNING, attempts=run.attempts)
                .select_for_update()
                .first()
            )
            if claimed is None:
                continue
            JobAttempt.objects.create(
                run=claimed,
                number=claimed.attempts,
                started_at=claimed.started_at or now,
                finished_at=now,
                duration_ms=0,
                outcome=JobAttempt.Outcome.FAILED,
                error_type="Abandoned",
                error_message=reason,
            )
            if definition is not None and claimed.attempts < claimed.max_attempts:
                claimed.status = RunStatus.QUEUED
                claimed.error_type, claimed.error_message = "Abandoned", reason
                claimed.save(update_fields=["status", "error_type", "error_message"])
                message = message_for(
                    definition,
                    envelope_of(claimed, attempt=claimed.attempts + 1),
                    definition.backoff.seconds_after(claimed.attempts),
                )
                transaction.on_commit(functools.partial(transport.push, message))
                retried += 1
            else:
                claimed.status = RunStatus.FAILED
                claimed.finished_at = now
                claimed.error_type, claimed.error_message = "Abandoned", reason
                claimed.save(update_fields=["status", "finished_at", "error_type", "error_message"])
                abandoned += 1
        logger.warning("run %s of %s: %s", run.run_id, run.job_name, reason)
    return retried, abandoned


def delete_expired() -> tuple[int, int]:
    days = conf.get().RETENTION_DAYS
    if days == 0:
        return 0, 0
    cutoff = timezone.now() - timedelta(days=days)
    runs, _ = JobRun.objects.filter(status__in=FINISHED_STATUSES, finished_at__lt=cutoff).delete()
    rejections, _ = RejectedMessage.objects.filter(received_at__lt=cutoff).delete()
    return runs, rejections
