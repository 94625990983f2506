"""How long history is kept, and what is left of a tenant's history once the tenant is gone.

* Runs (``RETENTION_DAYS``) and rejected messages: finished ones older than the setting.
* Tenant-visible failures (``JobFailure``): a failure is *resolved* once a later run of the
  same job and subject succeeded; resolved ones are deleted at the next sweep whatever their
  age (a success normally deletes its failure at once, but not when the job stopped declaring
  ``tenant_visible_failure``, say). An unresolved failure is what tells a tenant that something
  still needs them, so it is kept, even after retention deleted the run it points to, unless
  ``FAILURE_RETENTION_DAYS`` is set; its deletions are counted and logged, never silent.
* Escape-hatch audit rows (``EscapeHatchUse``): deleted ``ESCAPE_HATCH_RETENTION_DAYS`` after
  their last use.
* A deleted tenant (``TENANT_DELETION``): history rows outlive the schema, and they hold the
  tenant's data (arguments, log lines, error texts, subjects). ``"purge"`` (default) deletes
  its runs and failures; ``"anonymise"`` keeps the runs' shape (job, status, times, attempts)
  for the operators' statistics and blanks everything the tenant's data could be in. The
  escape-hatch audit is the operators' record and stays (under its own retention).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.db.models import Exists, OuterRef
from django.utils import timezone

from . import conf
from .models import (
    FINISHED_STATUSES,
    EscapeHatchUse,
    JobAttempt,
    JobFailure,
    JobRun,
    RejectedMessage,
    RunStatus,
)

logger = logging.getLogger("kumiko_jobs.retention")


@dataclass(frozen=True, slots=True)
class Deleted:
    runs: int = 0
    rejections: int = 0
    failures: int = 0
    audit: int = 0


def delete_expired() -> Deleted:
    settings = conf.get()
    now = timezone.now()
    runs = rejections = 0
    if settings.RETENTION_DAYS:
        cutoff = now - timedelta(days=settings.RETENTION_DAYS)
        runs, _ = JobRun.objects.filter(
            status__in=FINISHED_STATUSES, finished_at__lt=cutoff
        ).delete()
        rejections, _ = RejectedMessage.objects.filter(received_at__lt=cutoff).delete()
    failures = delete_resolved_failures()
    if settings.FAILURE_RETENTION_DAYS:
        cutoff = now - timedelta(days=settings.FAILURE_RETENTION_DAYS)
        old, _ = JobFailure.objects.filter(failed_at__lt=cutoff).delete()
        if old:
            logger.warning(
                "deleted %d unresolved tenant-visible failure(s) older than "
                "FAILURE_RETENTION_DAYS=%d",
                old,
                settings.FAILURE_RETENTION_DAYS,
            )
        failures += old
    audit = 0
    if settings.ESCAPE_HATCH_RETENTION_DAYS:
        cutoff = now - timedelta(days=settings.ESCAPE_HATCH_RETENTION_DAYS)
        audit, _ = EscapeHatchUse.objects.filter(last_seen__lt=cutoff).delete()
    return Deleted(runs, rejections, failures, audit)


def delete_resolved_failures() -> int:
    """Failures a later success of the same job and subject has resolved."""
    later_success = JobRun.objects.filter(
        schema_name=OuterRef("schema_name"),
        job_name=OuterRef("job_name"),
        subject=OuterRef("subject"),
        status=RunStatus.SUCCEEDED,
        finished_at__gt=OuterRef("failed_at"),
    )
    deleted, _ = JobFailure.objects.filter(Exists(later_success)).delete()
    return deleted


def forget_tenant(schema: str) -> int:
    """Purge or anonymise the history of the deleted tenant ``schema``; returns the runs
    touched. Failures (tenant-facing texts) go in both modes."""
    if not schema:
        return 0  # system runs are nobody's tenant
    mode = conf.get().TENANT_DELETION
    with transaction.atomic():
        runs = JobRun.objects.filter(schema_name=schema)
        JobFailure.objects.filter(schema_name=schema).delete()
        if mode == "purge":
            touched, _ = runs.delete()
            # Fan-out children: counted among the deleted runs (and their attempts) above.
        else:
            JobAttempt.objects.filter(run__schema_name=schema).update(
                error_message="", traceback="", log=[]
            )
            touched = runs.update(
                payload={},
                subject="",
                error_message="",
                origin=None,
                triggered_by="",
                result=None,
                cancel_requested_by="",
            )
    logger.info("tenant %s deleted: its run history was %sd (%d rows)", schema, mode, touched)
    return touched


def on_tenant_deleted(sender: Any, instance: Any, **kwargs: Any) -> None:
    """``post_delete`` receiver for the tenant model (connected in ``apps.ready``)."""
    schema = getattr(instance, "schema_name", "")
    if schema and schema != conf.public_schema_name():
        forget_tenant(str(schema))
