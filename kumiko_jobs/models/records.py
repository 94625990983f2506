"""The rows kept beside the runs: what a tenant may know of a failure, the escape-hatch audit,
the queue messages refused before any tenant was entered, the admission locks and the boot
markers.
"""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _


class JobFailure(models.Model):
    """What a tenant may know about a failure: a message key, never error text."""

    schema_name = models.CharField(_("tenant"), max_length=63)
    job_name = models.CharField(_("job"), max_length=200)
    subject = models.CharField(_("subject"), max_length=255, blank=True)
    message_key = models.CharField(max_length=200)
    failed_at = models.DateTimeField(_("failed at"))
    run_id = models.UUIDField()

    class Meta:
        """Newest first; one row per tenant, job and subject, so a repeated failure replaces the
        last one instead of piling up.
        """

        ordering = ("-failed_at",)
        verbose_name = _("failure")
        verbose_name_plural = _("failures")
        constraints = (
            models.UniqueConstraint(
                fields=("schema_name", "job_name", "subject"), name="kj_failure_one_per_subject"
            ),
        )
        indexes = (
            # The operators' failures list at hundreds of thousands of rows (migration 0014,
            # built CONCURRENTLY; docs/observability.md, "History at scale"): the list's order
            # (failed_at DESC, id DESC: the admin adds the pk as tie-break) and the same by
            # job, so a page is an index range read, not a sort of the table. The job one also
            # lists the job filter's names by a loose index scan (admin/filters.py); a tenant's
            # rows are found by the unique constraint's index, which starts with schema_name.
            models.Index(fields=("failed_at", "id"), name="kj_failure_recent"),
            models.Index(fields=("job_name", "failed_at", "id"), name="kj_failure_job_recent"),
        )

    def __str__(self) -> str:
        return f"{self.job_name} {self.subject}: {self.message_key}"


class EscapeHatchUse(models.Model):
    """A reported use of a declared escape hatch (deduplicated per window; see audit.py)."""

    job_name = models.CharField(_("job"), max_length=200)
    grant = models.CharField(max_length=40)
    reason = models.CharField(max_length=500)
    schema_name = models.CharField(_("tenant"), max_length=63, blank=True)
    actor = models.CharField(max_length=100, blank=True)
    triggered_by = models.CharField(max_length=64, blank=True)
    first_seen = models.DateTimeField()
    last_seen = models.DateTimeField()
    count = models.PositiveIntegerField(default=1)
    last_run_id = models.UUIDField(null=True, blank=True)

    class Meta:
        """Most recently used first; one row per job, grant, tenant and actor, counted, so a hatch
        used in a loop stays one row.
        """

        ordering = ("-last_seen",)
        verbose_name = _("escape hatch use")
        constraints = (
            models.UniqueConstraint(
                fields=("job_name", "grant", "schema_name", "actor"),
                name="kj_hatch_use_once_per_key",
            ),
        )

    def __str__(self) -> str:
        return f"{self.job_name} {self.grant} [{self.schema_name or 'public'}] x{self.count}"


class AdmissionLock(models.Model):
    """One row per (job, whose runs count) for the jobs whose enqueues are admitted under a lock
    (``concurrency`` skip/replace/debounce, ``max_per_tenant``: enqueueing/admission.py).

    The lock is the row's, taken by an upsert in the enqueuing transaction and held until it
    ends: a row lock on a kumiko table, which no tenant login may take (tenant roles hold no
    privilege on kumiko's tables, and the classifier refuses any statement naming this one).
    It replaced an advisory lock, which any session, a tenant role's included, could take and
    hold on another tenant's key (issue 22). Never cleaned: at most one row per job and tenant.
    """

    key = models.TextField(primary_key=True)

    def __str__(self) -> str:
        return self.key


class RejectedMessage(models.Model):
    """A queue message that failed closed before any tenant was entered (poison message)."""

    received_at = models.DateTimeField(auto_now_add=True)
    rq_job_id = models.CharField(max_length=128, blank=True)
    queue = models.CharField(max_length=100, blank=True)
    reason = models.CharField(max_length=500)
    excerpt = models.TextField(blank=True, help_text="The first bytes of the message, as received.")
    # So a deleted tenant's refused messages go with its history (history/retention.py).
    schema_name = models.CharField(
        max_length=63,
        blank=True,
        default="",
        help_text="The tenant the message names (unverified when it did not decode).",
    )

    class Meta:
        """Newest first; found by tenant when the tenant is deleted."""

        ordering = ("-received_at",)
        indexes = [
            models.Index(
                fields=["schema_name"],
                name="kj_rejected_schema",
                condition=~models.Q(schema_name=""),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.received_at:%Y-%m-%d %H:%M:%S} {self.reason}"


class BootMarker(models.Model):
    """A ``run_on_boot`` job enqueued for one Redis dataset (docs/reliability.md, "Boot").

    Written in the transaction that writes the boot run's row, and never deleted by retention:
    the run row alone was the marker, so once retention deleted it every worker start enqueued
    the boot job again (in every tenant, for a per-tenant one). The key is the boot run's id,
    derived from (job, dataset token); a flushed or new Redis has a new token, so its boot jobs
    run once more, as promised.
    """

    run_id = models.UUIDField(primary_key=True)
    job_name = models.CharField(max_length=200)
    dataset = models.CharField(max_length=100)
    enqueued_at = models.DateTimeField()

    class Meta:
        """Newest first."""

        ordering = ("-enqueued_at",)

    def __str__(self) -> str:
        return f"{self.job_name} @ {self.dataset}"
