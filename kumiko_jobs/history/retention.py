"""How long history is kept, and what is left of a tenant's history once the tenant is gone.

* Runs (``RETENTION_DAYS``) and rejected messages: finished ones older than the setting; the
  run lists of bulk operations that ended before then (the operations' rows stay); workflows
  that ended before the same cutoff, with their steps (their steps' runs are finished runs of
  that age too).
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
  for the operators' statistics and blanks everything the tenant's data could be in. Its
  refused queue messages (``RejectedMessage``, whose excerpts can hold its arguments) are
  deleted, or kept with their excerpts blanked. The escape-hatch audit is the operators'
  record and stays (under its own retention). The system runs its runs started go with its
  runs; one still waiting is cancelled (anonymise) or loses its row (purge), so it never
  runs. Its pauses are the worker's to remove (``worker/pauses.forget_tenant``).

Every deletion here runs in batches of ``BATCH_SIZE`` rows, each batch one ``DELETE`` statement
(the batch's attempts with it) in a transaction of its own: the history can hold millions of
rows, and one big ``DELETE`` would hold its row locks and a transaction open for minutes, while
Django's ``QuerySet.delete()`` would first load every run into Python to cascade to its
attempts. No ``pre_delete``/``post_delete`` signals are sent for history rows.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db import connection, models, transaction
from django.db.models import Exists, OuterRef, Q, QuerySet
from django.utils import timezone

from ..core import conf, project_settings
from ..models import (
    FINISHED_STATUSES,
    WAITING_STATUSES,
    BulkItem,
    EscapeHatchUse,
    JobAttempt,
    JobFailure,
    JobRun,
    RejectedMessage,
    RunStatus,
    Workflow,
    WorkflowStep,
)
from . import tenant_rollup
from .workflows import ended_workflows

# Workflows per batch: BATCH_SIZE divided by this (each takes its steps along).
WORKFLOW_BATCH_DIVISOR = 100

logger = logging.getLogger("kumiko_jobs.retention")

# The error message of a run ended by its tenant's deletion (anonymise mode): one waiting that a
# deleted tenant's run started, or one still running.
TENANT_DELETED = "Cancelled: the tenant it ran for was deleted."


@dataclass(frozen=True, slots=True)
class Deleted:
    """How many rows one retention pass deleted, per table (runs with their attempts, rejected
    messages, failures, escape-hatch uses).
    """

    runs: int = 0
    rejections: int = 0
    failures: int = 0
    audit: int = 0
    bulk_items: int = 0
    workflows: int = 0


# Rows per DELETE: a batch of runs with their attempts holds its row locks about half a second
# at 10 million runs on a busy 2-CPU machine (bench/history_scale.py --retention; only rows of
# finished runs, which no worker writes), and a day of that history goes in ~20 batches.
BATCH_SIZE = 5000


def delete_in_batches(
    queryset: QuerySet[Any],
    *,
    batch_size: int = BATCH_SIZE,
    after_batch: Callable[[int], None] | None = None,
) -> int:
    """Delete the rows of ``queryset`` (and the rows that cascade from them, one level) in
    batches, each one SQL statement in its own transaction; returns the rows deleted.

    Rows are chosen by the database (``LIMIT`` over the queryset's own SQL, ``FOR UPDATE SKIP
    LOCKED`` so that a row a worker holds is left for the next sweep), never loaded into
    Python. ``after_batch`` is called with each batch's count once it has committed.
    """
    model = queryset.model
    qn = connection.ops.quote_name
    table, pk = qn(model._meta.db_table), qn(model._meta.pk.column)
    cascades = []
    for relation in model._meta.related_objects:
        related = relation.related_model
        if relation.on_delete is not models.CASCADE or related._meta.related_objects:
            # Not a case this module meets today; refuse rather than leave orphans behind.
            raise NotImplementedError(f"batched delete of {model.__name__}: {relation}")
        cascades.append((qn(related._meta.db_table), qn(relation.field.column)))
    total = 0
    while True:
        with transaction.atomic():
            chosen = queryset.order_by().select_for_update(skip_locked=True).values("pk")
            select, params = chosen[:batch_size].query.sql_with_params()
            parts = [f"batch(key) AS ({select})"]
            parts += [
                f"gone{i} AS (DELETE FROM {related} WHERE {column} IN (SELECT key FROM batch))"
                for i, (related, column) in enumerate(cascades)
            ]
            with connection.cursor() as cursor:
                cursor.execute(
                    f"WITH {', '.join(parts)} DELETE FROM {table}"
                    f" WHERE {pk} IN (SELECT key FROM batch)",
                    params,
                )
                deleted = max(cursor.rowcount, 0)
        total += deleted
        if after_batch is not None:
            after_batch(deleted)
        if deleted < batch_size:
            return int(total)


def delete_expired(*, batch_size: int = BATCH_SIZE) -> Deleted:
    """Delete, in batches, finished runs and rejected messages past ``RETENTION_DAYS``, failures
    resolved by a later success or past ``FAILURE_RETENTION_DAYS``, and escape-hatch uses past
    ``ESCAPE_HATCH_RETENTION_DAYS``.
    """
    settings = conf.get()
    now = timezone.now()
    runs = rejections = bulk_items = workflows = 0
    if settings.RETENTION_DAYS:
        cutoff = now - timedelta(days=settings.RETENTION_DAYS)
        runs = delete_in_batches(
            JobRun.objects.filter(status__in=FINISHED_STATUSES, finished_at__lt=cutoff),
            batch_size=batch_size,
        )
        rejections = delete_in_batches(
            RejectedMessage.objects.filter(received_at__lt=cutoff), batch_size=batch_size
        )
        # The run lists of bulk operations that ended before it (up to 100,000 rows each);
        # the operation rows stay, with their counts: the operators' record.
        bulk_items = delete_in_batches(
            BulkItem.objects.filter(operation__finished_at__lt=cutoff), batch_size=batch_size
        )
        # A workflow's steps go with it (one level of cascade); fewer per batch, as each may
        # have thousands of steps.
        workflows = delete_in_batches(
            ended_workflows(cutoff), batch_size=max(1, batch_size // WORKFLOW_BATCH_DIVISOR)
        )
    failures = delete_resolved_failures(batch_size=batch_size)
    if settings.FAILURE_RETENTION_DAYS:
        cutoff = now - timedelta(days=settings.FAILURE_RETENTION_DAYS)
        old = delete_in_batches(
            JobFailure.objects.filter(failed_at__lt=cutoff), batch_size=batch_size
        )
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
        audit = delete_in_batches(
            EscapeHatchUse.objects.filter(last_seen__lt=cutoff), batch_size=batch_size
        )
    return Deleted(runs, rejections, failures, audit, bulk_items, workflows)


def delete_resolved_failures(*, batch_size: int = BATCH_SIZE) -> int:
    """Failures a later success of the same job and subject has resolved."""
    later_success = JobRun.objects.filter(
        schema_name=OuterRef("schema_name"),
        job_name=OuterRef("job_name"),
        subject=OuterRef("subject"),
        status=RunStatus.SUCCEEDED,
        finished_at__gt=OuterRef("failed_at"),
    )
    return delete_in_batches(
        JobFailure.objects.filter(Exists(later_success)), batch_size=batch_size
    )


def forget_tenant(schema: str) -> int:
    """Purge or anonymise the history of the deleted tenant ``schema``; returns the runs
    touched. Failures (tenant-facing texts) go in both modes; so do the excerpts of its refused
    queue messages (``tenant_rejections``), which can hold its arguments: purged with the
    rows, or blanked while the rows (time, queue, reason) stay for the operators."""
    if not schema:
        return 0  # system runs are nobody's tenant
    mode = conf.get().TENANT_DELETION
    runs = JobRun.objects.filter(schema_name=schema)
    if mode == "purge":
        # In batches (a tenant may have millions of runs); fan-out children are among them.
        delete_in_batches(JobFailure.objects.filter(schema_name=schema))
        delete_in_batches(tenant_rejections(schema))
        delete_in_batches(Workflow.objects.filter(schema_name=schema), batch_size=BATCH_SIZE // 100)
        touched = delete_in_batches(runs)
        # Its consoles' days too (counts, no data): a tenant given its schema name later must
        # not see them.
        tenant_rollup.forget(schema)
    else:
        with transaction.atomic():
            JobFailure.objects.filter(schema_name=schema).delete()
            tenant_rejections(schema).update(excerpt="", schema_name=schema)
            # A step's arguments and reason are the tenant's data, as a run's payload is.
            WorkflowStep.objects.filter(workflow__schema_name=schema).update(kwargs={}, reason="")
            touched = _scrub(runs, JobAttempt.objects.filter(run__schema_name=schema))
            # One still running would write its result, log and error back into the scrubbed
            # row: it ends here, and its late finish, fenced on ``running``, writes nothing.
            _end(runs.filter(status=RunStatus.RUNNING))
    # The system runs its runs started (``flow_schema``: tenant_may_start) carry its arguments
    # too; few, and found among the system's rows (``schema_name`` empty).
    started = JobRun.objects.filter(schema_name="", flow_schema=schema)
    if mode == "purge":
        # (a message of one still waiting finds no row and is dropped unrun: records step)
        touched += delete_in_batches(started)
    else:
        with transaction.atomic():
            attempts = JobAttempt.objects.filter(run__schema_name="", run__flow_schema=schema)
            touched += _scrub(started, attempts)
            # One still waiting would run (a system run needs no tenant) and write the
            # tenant's data back into the scrubbed row: it ends here, its message is dropped;
            # one running ends too (its late finish writes nothing: the finish is fenced).
            _end(started.filter(status__in=(*WAITING_STATUSES, RunStatus.RUNNING)))
    logger.info("tenant %s deleted: its run history was %sd (%d rows)", schema, mode, touched)
    return touched


def _end(runs: QuerySet[JobRun]) -> None:
    """End ``runs`` (waiting or running) as cancelled by the tenant's deletion."""
    runs.update(
        status=RunStatus.CANCELLED,
        finished_at=timezone.now(),
        scheduled_for=None,
        error_type="",
        error_message=TENANT_DELETED,
    )


def _scrub(runs: QuerySet[JobRun], attempts: QuerySet[JobAttempt]) -> int:
    """Blank what a deleted tenant's runs and their attempts say (its data); the rows stay."""
    attempts.update(error_message="", traceback="", log=[])
    return runs.update(
        payload={},
        subject="",
        error_message="",
        origin=None,
        triggered_by="",
        result=None,
        cancel_requested_by="",
    )


def tenant_rejections(schema: str) -> QuerySet[RejectedMessage]:
    """The refused messages that name ``schema``: by their ``schema_name`` (an index), and rows
    recorded before it existed (empty) by the schema field in their excerpt, as an envelope's
    JSON writes it (with or without a space: ``json.dumps``'s two separator styles)."""
    legacy = Q(schema_name="") & (
        Q(excerpt__contains=f'"schema":{json.dumps(schema)}')
        | Q(excerpt__contains=f'"schema": {json.dumps(schema)}')
    )
    return RejectedMessage.objects.filter(Q(schema_name=schema) | legacy)


def on_tenant_deleted(sender: Any, instance: Any, **kwargs: Any) -> None:
    """``post_delete`` receiver for the tenant model (connected in ``apps.ready``)."""
    schema = getattr(instance, "schema_name", "")
    if schema and schema != project_settings.public_schema_name():
        forget_tenant(str(schema))
