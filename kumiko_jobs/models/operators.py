"""What operators set: pauses (a queue, a job, a tenant) and bulk retries and cancels."""

from __future__ import annotations

import uuid

from django.db import models
from django.utils.translation import gettext_lazy as _


class FlowPause(models.Model):
    """A pause an operator set: a queue, a job, a tenant, or a job in one tenant (the fields
    left empty match everything). The truth the workers' maintenance re-asserts into Redis,
    where the dequeue reads it (transport/fair.py); deleting the row is the resume."""

    queue = models.CharField(_("queue"), max_length=100, blank=True, default="")
    job_name = models.CharField(_("job"), max_length=200, blank=True, default="")
    schema_name = models.CharField(_("tenant"), max_length=63, blank=True, default="")
    paused_at = models.DateTimeField(_("paused"), auto_now_add=True)
    paused_by = models.CharField(_("paused by"), max_length=150, blank=True, default="")

    class Meta:
        """One row per paused thing."""

        verbose_name = _("pause")
        verbose_name_plural = _("pauses")
        constraints = (
            models.UniqueConstraint(
                fields=("queue", "job_name", "schema_name"), name="kj_pause_unique"
            ),
            models.CheckConstraint(
                condition=(
                    (~models.Q(queue="") & models.Q(job_name="", schema_name=""))
                    | (models.Q(queue="") & (~models.Q(job_name="") | ~models.Q(schema_name="")))
                ),
                name="kj_pause_one_kind",
            ),
        )

    def __str__(self) -> str:
        if self.queue:
            return f"queue {self.queue}"
        if self.job_name and self.schema_name:
            return f"{self.job_name} in {self.schema_name}"
        return f"job {self.job_name}" if self.job_name else f"tenant {self.schema_name}"


class BulkKind(models.TextChoices):
    """What a bulk operation does to each run (``operations.retry_run`` / ``cancel_run``)."""

    RETRY = "retry", _("retry")
    CANCEL = "cancel", _("cancel")


class BulkState(models.TextChoices):
    """Where a bulk operation is: its batches run until no run of its list is left (``done``), or
    an operator stops it (``stopped``: the runs not reached yet stay as they were)."""

    RUNNING = "running", _("running")
    DONE = "done", _("done")
    STOPPED = "stopped", _("stopped")


class BulkOperation(models.Model):
    """An operator's retry or cancel of every run matching a filter (kumiko_jobs/bulk.py).

    The runs it may act on are listed once, when the operator confirms (``BulkItem``, at most
    ``confirmed`` of them: the count the confirmation page showed), so runs that match the
    filter later are never reached. Batches (a system job) work through the list; the counters
    say how far they are and change only under this row's lock.
    """

    operation_id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    kind = models.CharField(_("operation"), max_length=16, choices=BulkKind.choices)
    state = models.CharField(
        _("state"), max_length=16, choices=BulkState.choices, default=BulkState.RUNNING
    )
    requested_by = models.CharField(_("requested by"), max_length=150, blank=True)
    requested_at = models.DateTimeField(_("requested"))
    # The run list's query string the operator confirmed (its filters and search), and the
    # newest ``queued_at`` a listed run could have (the confirmation page's time).
    filter_query = models.TextField(_("filter"), blank=True)
    as_of = models.DateTimeField(_("runs queued up to"))
    confirmed = models.PositiveIntegerField(_("confirmed count"))
    listed = models.PositiveIntegerField(_("runs listed"), default=0)
    done = models.PositiveIntegerField(_("done"), default=0)
    skipped = models.PositiveIntegerField(_("skipped"), default=0)
    failed = models.PositiveIntegerField(_("failed"), default=0)
    # {reason: count} of the skipped and failed runs ("not failed or cancelled", ...).
    reasons = models.JSONField(_("reasons"), default=dict, blank=True)
    batches = models.PositiveIntegerField(_("batches"), default=0)
    progressed_at = models.DateTimeField(_("last progress"), null=True, blank=True)
    finished_at = models.DateTimeField(_("finished"), null=True, blank=True)
    stopped_by = models.CharField(_("stopped by"), max_length=150, blank=True)

    class Meta:
        """Newest first."""

        ordering = ("-requested_at",)
        verbose_name = _("bulk operation")
        verbose_name_plural = _("bulk operations")

    def __str__(self) -> str:
        return f"{self.get_kind_display()} of {self.listed} runs: {self.get_state_display()}"


class BulkItem(models.Model):
    """One run a bulk operation may act on, and what became of it (``outcome``, empty until a
    batch reached it). ``run_id`` is no foreign key: retention may delete the run first, which
    the batch then counts as skipped."""

    operation = models.ForeignKey(BulkOperation, on_delete=models.CASCADE, related_name="items")
    run_id = models.UUIDField()
    outcome = models.CharField(max_length=16, blank=True, default="")
    note = models.CharField(max_length=200, blank=True, default="")

    class Meta:
        """The batches read an operation's runs not reached yet, in list order."""

        verbose_name = _("bulk operation run")
        verbose_name_plural = _("bulk operation runs")
        indexes = (
            models.Index(
                fields=("operation", "id"),
                condition=models.Q(outcome=""),
                name="kj_bulk_item_pending",
            ),
        )
        constraints = (
            models.UniqueConstraint(fields=("operation", "run_id"), name="kj_bulk_item_unique"),
        )

    def __str__(self) -> str:
        return f"{self.run_id}: {self.outcome or 'not reached yet'}"
