"""Runs and their attempts, and the one status vocabulary (``RunStatus``) they share.

Rows carry the tenant's schema name rather than a foreign key: history must outlive a
deleted tenant, and a reusable app cannot depend on the project's tenant model migrations.
"""

from __future__ import annotations

import uuid

from django.db import models
from django.utils.translation import gettext_lazy as _


class RunStatus(models.TextChoices):
    """Where a run stands, in the one vocabulary the admin, the CLI, the logs and the docs share."""

    # One vocabulary everywhere: the labels (admin badges and filters, translated) are the
    # values' own words, the ones the CLI, the logs, the demo and the docs use. A run waiting
    # for a retry or an enqueue_in delay is "queued" (scheduled_for says until when); "deferred"
    # is only a run whose job returned ctx.defer().
    QUEUED = "queued", _("queued")
    RUNNING = "running", _("running")
    DEFERRED = "deferred", _("deferred")
    SUCCEEDED = "succeeded", _("succeeded")
    FAILED = "failed", _("failed")
    CANCELLED = "cancelled", _("cancelled")
    # Enqueues the job's concurrency options refused: recorded (finished at once, never run) so
    # that operators and tenants see why a requested run did not happen. Two reasons, kept
    # apart because they call for different fixes: ``skipped`` is concurrency="skip" doing its
    # job (a run of this job was already active for the tenant), ``capped`` is
    # max_per_tenant's cap refusing one more.
    SKIPPED = "skipped", _("skipped")
    CAPPED = "capped", _("capped")


FINISHED_STATUSES = (
    RunStatus.SUCCEEDED,
    RunStatus.FAILED,
    RunStatus.CANCELLED,
    RunStatus.SKIPPED,
    RunStatus.CAPPED,
)
# The two ways an enqueue is refused by concurrency options (RunHandle.status, signals).
REFUSED_STATUSES = (RunStatus.SKIPPED, RunStatus.CAPPED)
WAITING_STATUSES = (RunStatus.QUEUED, RunStatus.DEFERRED)


class DeferralKind(models.TextChoices):
    """Who postponed a run: its job (``ctx.defer``) or a gate (an inactive tenant).

    They count against different limits (``max_defers`` counts only the job's), resume with
    different messages and are reported apart (the telemetry's ``deferred_by``). A deferred
    run's row records which one it waits for (``JobRun.waiting_for``), so whoever rebuilds its
    next message from the row (the relay, the test helpers) does not have to guess. The labels
    complete "waiting for".
    """

    JOB = "job", _("the delay its job asked for (ctx.defer)")
    GATE = "gate", _("its tenant to be active again")


class JobRun(models.Model):
    """One logical execution of a job for one tenant, across attempts and deferrals."""

    run_id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    job_name = models.CharField(_("job"), max_length=200)
    schema_name = models.CharField(
        _("tenant"), max_length=63, blank=True, help_text=_("Empty for system runs.")
    )
    subject = models.CharField(_("subject"), max_length=255, blank=True)
    status = models.CharField(
        _("status"), max_length=16, choices=RunStatus.choices, default=RunStatus.QUEUED
    )
    queue = models.CharField(max_length=100)
    attempts = models.PositiveIntegerField(_("attempts"), default=0)
    max_attempts = models.PositiveIntegerField(default=1)
    defer_count = models.PositiveIntegerField(default=0)
    gate_defer_count = models.PositiveIntegerField(default=0)
    # Which deferral a deferred run waits for (DeferralKind); "" for every other status, and
    # for a deferral recorded by a worker older than this column (enqueueing.messages.
    # waiting_envelope keeps the old guess for those). db_default too: a process of the previous
    # release, still running during a rolling deploy, inserts rows without this column.
    waiting_for = models.CharField(
        _("waiting for"),
        max_length=8,
        choices=DeferralKind.choices,
        default="",
        db_default="",
        blank=True,
    )
    queued_at = models.DateTimeField(_("queued"))
    scheduled_for = models.DateTimeField(_("scheduled for"), null=True, blank=True)
    started_at = models.DateTimeField(_("started"), null=True, blank=True)
    finished_at = models.DateTimeField(_("finished"), null=True, blank=True)
    duration_ms = models.FloatField(_("duration (ms)"), null=True, blank=True)
    triggered_by = models.CharField(max_length=64, blank=True)
    trigger = models.CharField(max_length=200, blank=True)
    correlation_id = models.CharField(max_length=64, blank=True)
    trace_id = models.CharField(max_length=32, blank=True)
    # The W3C trace context its messages carry, so a message rebuilt from the row (relay,
    # sweep) continues the same trace.
    trace_context = models.JSONField(default=dict, blank=True)
    parent_run_id = models.UUIDField(null=True, blank=True)
    # A system run a tenant's run started (a system job with tenant_may_start, or a system run
    # such a run started): that tenant's schema, whose flow control (pause, caps, rate limits,
    # fair share) its messages count against (Envelope.flow_schema); "" for every other run.
    # db_default: a process of the previous release inserts rows without this column.
    flow_schema = models.CharField(
        _("counts against tenant"), max_length=63, default="", db_default="", blank=True
    )
    payload = models.JSONField(default=dict, blank=True)
    origin = models.JSONField(null=True, blank=True, help_text="Write origin of the request.")
    error_type = models.CharField(max_length=200, blank=True)
    error_message = models.TextField(blank=True)
    rq_job_id = models.CharField(max_length=128, blank=True)
    # What the job returned when it succeeded (JSON, at most MAX_RESULT_BYTES), or a marker
    # saying why it was not kept (kumiko_jobs.results). Operators only: never shown to tenants.
    result = models.JSONField(_("result"), null=True, blank=True)
    # A cancellation an operator asked for while the run was running (operations.cancel_run):
    # when and by whom. The job sees it cooperatively (ctx.cancel_requested); the run ends
    # ``cancelled`` unless its body had already completed (docs/reliability.md, Cancellation).
    cancel_requested_at = models.DateTimeField(_("cancel requested"), null=True, blank=True)
    cancel_requested_by = models.CharField(_("cancel requested by"), max_length=150, blank=True)
    # Unique jobs (@job(unique=...), enqueueing/unique.py): a digest of the job, the tenant and
    # the unique arguments' values; NULL for every other job, so the two partial indexes below
    # hold only unique jobs' rows. PostgreSQL's unique index is what settles two concurrent
    # enqueues of the same key: the second INSERT waits for the first transaction, then fails.
    # NULL, not "": a process of the previous release inserts rows without the column.
    unique_key = models.CharField(  # noqa: DJ001
        _("unique key"), max_length=64, null=True, blank=True
    )
    # An atomic run's attempt key: the SHA-256 (hex) of a secret the runner holds for the attempt
    # it runs, written before the body's transaction opens; migration 0017's success function
    # accepts the attempt's success only with that secret (run/steps/atomic.py). "" otherwise.
    # Tenant logins hold no privilege on this table, and the classifier refuses its writes.
    atomic_key = models.CharField(
        max_length=64, default="", db_default="", blank=True, editable=False
    )
    # The workflow this run is a step of (Workflow.workflow_id), NULL for every other run: the
    # start statement returns it, so the finish of a run outside a workflow decides from this
    # flag alone and costs no statement more (docs/workflows.md).
    workflow_id = models.UUIDField(_("workflow"), null=True, blank=True)
    # The run's priority level in its queue (-100..100, higher first: docs/design.md, "Flow
    # control"), for the messages the relay and the sweep rebuild from this row. db_default:
    # a process of the previous release inserts rows without this column.
    priority = models.SmallIntegerField(_("priority"), default=0, db_default=0)
    # What the job last said of how far it is (``ctx.progress``: a fraction 0..1 and a short
    # text), written at most every PROGRESS_INTERVAL seconds while it runs and with its finish
    # (run/progress.py). NULL: never reported. db_default: the previous release's inserts.
    progress = models.FloatField(_("progress"), null=True, blank=True)
    progress_message = models.CharField(
        _("progress message"), max_length=200, default="", db_default="", blank=True
    )

    class Meta:
        """Newest first, with the indexes that keep the admin's lists an index range read at
        millions of rows, and the operators' permissions (django-rq's queue pages, every tenant's
        runs).
        """

        ordering = ("-queued_at",)
        verbose_name = _("job run")
        verbose_name_plural = _("job runs")
        # Not about runs: the operators' right to django-rq's queue pages (kumiko_jobs.urls),
        # which show and delete every tenant's raw messages. Declared here because a
        # permission needs a model; is_staff alone is not enough for those pages.
        # view_all_tenants: the operators' view of every tenant's runs on the public schema's
        # domain (admin/audiences.py); view_jobrun alone is no longer enough there, since with
        # shared users a tenant's staff user holds view_jobrun too.
        # operate_tenant_runs: a tenant's members retry and cancel that tenant's runs on its
        # domain (core/audience.py); change_jobrun is the operators' and stays so.
        permissions = (
            ("manage_queues", _("Can use django-rq's queue pages")),
            ("view_all_tenants", _("Can view every tenant's runs (the operators' admin)")),
            ("operate_tenant_runs", _("Can retry and cancel its tenant's runs")),
        )
        # Migration 0015 builds both CONCURRENTLY (AddIndexConcurrently cannot build a unique
        # partial index, so it is SQL there and a constraint here).
        constraints = (
            models.UniqueConstraint(
                fields=("unique_key",),
                condition=models.Q(
                    unique_key__isnull=False,
                    status__in=("queued", "running", "deferred"),
                ),
                name="kj_run_unique_active",
            ),
        )
        indexes = (
            models.Index(fields=("schema_name", "-queued_at"), name="kj_run_tenant_recent"),
            models.Index(fields=("status", "started_at"), name="kj_run_status_started"),
            # Whole although its active-run readers (admission, replace, a retry's check) would
            # do with a partial one: the tenants' job filter probes it in every status
            # (admin/filters.py, run_job_names; migration 0027 says what it costs without).
            models.Index(fields=("job_name", "schema_name", "status"), name="kj_run_job_tenant"),
            # Partial (migration 0027): every reader asks for a range of finished_at, so the
            # enqueue's and the start's row versions (no finished_at) need no entry: a run's
            # history writes one index entry less at each (bench/README.md, "What a job costs").
            models.Index(
                fields=("finished_at",),
                condition=models.Q(finished_at__isnull=False),
                name="kj_run_finished",
            ),
            # The admin's run lists at millions of rows (migration 0010, built CONCURRENTLY;
            # docs/observability.md, "History at scale"). Each matches one filter and the
            # list's order (queued_at DESC, run_id DESC: the admin adds the pk as tie-break),
            # so a page is an index range read, never a sort of the table. run_id is in the
            # key so that a deep page's OFFSET is skipped by an index-only scan.
            models.Index(fields=("queued_at", "run_id"), name="kj_run_recent"),
            models.Index(fields=("status", "queued_at", "run_id"), name="kj_run_status_recent"),
            models.Index(fields=("job_name", "queued_at"), name="kj_run_job_recent"),
            # A tenant's list by status (theirs, or an operator's tenant + status): without it
            # the list's bounded count reads thousands of a busy tenant's rows one by one.
            models.Index(
                fields=("schema_name", "status", "queued_at"), name="kj_run_tenant_status"
            ),
            # The system runs a tenant's run started, by that tenant (migration 0032, partial:
            # no entry for any other run): the dashboard's tenant filter reads them beside the
            # tenant's own runs (history/stats.py, Scope), as kj_run_tenant_recent reads those.
            models.Index(
                fields=("flow_schema", "-queued_at"),
                condition=~models.Q(flow_schema=""),
                name="kj_run_flow_recent",
            ),
            # The operators' search finds a request's runs by its correlation id (exactly).
            models.Index(fields=("correlation_id",), name="kj_run_correlation"),
            # unique_for: the latest finished run of a key.
            models.Index(
                fields=("unique_key", "finished_at"),
                condition=models.Q(unique_key__isnull=False),
                name="kj_run_unique_recent",
            ),
            # Not declared here: kj_run_subject_trgm, the trigram index for substring search
            # on subjects, made by SQL in 0010 (a GinIndex here would make every project add
            # django.contrib.postgres to INSTALLED_APPS, and it needs pg_trgm, which 0010
            # creates when the project's user may and skips, with a warning, when not).
        )

    def __str__(self) -> str:
        # Shown to tenants (breadcrumbs, messages): no schema name, the translated status.
        subject = f" ({self.subject})" if self.subject else ""
        return f"{self.job_name}{subject}: {self.get_status_display()}"

    @property
    def is_finished(self) -> bool:
        """True once the run can change no more (succeeded, failed, cancelled, or refused as skipped
        or capped).
        """
        return self.status in FINISHED_STATUSES


class JobAttempt(models.Model):
    """One execution of a run (an attempt, or a resumption after a deferral). Operators only."""

    class Outcome(models.TextChoices):
        """How one attempt ended; ``retrying`` and ``deferred`` mean the run goes on in another
        attempt, ``dropped`` that its message was not run (duplicate, stale, replaced, inactive
        tenant).
        """

        SUCCEEDED = "succeeded"
        FAILED = "failed"
        RETRYING = "retrying"
        DEFERRED = "deferred"
        DROPPED = "dropped"
        CANCELLED = "cancelled"

        @property
        def status(self) -> RunStatus:
            """The run's status after an attempt that ended this way (a retry waits queued; a
            dropped message leaves its run cancelled)."""
            return _RUN_STATUS_AFTER[self]

        @property
        def final(self) -> bool:
            """The run ends here (it gets a ``finished_at``); retrying and deferred runs go on."""
            return self not in (JobAttempt.Outcome.RETRYING, JobAttempt.Outcome.DEFERRED)

    run = models.ForeignKey(JobRun, on_delete=models.CASCADE, related_name="attempt_set")
    number = models.PositiveIntegerField()
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField()
    duration_ms = models.FloatField()
    outcome = models.CharField(max_length=16, choices=Outcome.choices)
    error_type = models.CharField(max_length=200, blank=True)
    error_message = models.TextField(blank=True)
    traceback = models.TextField(blank=True)
    log = models.JSONField(default=list, blank=True)
    worker = models.CharField(max_length=200, blank=True)

    class Meta:
        """A run's attempts in the order they started."""

        ordering = ("run", "started_at")
        verbose_name = _("attempt")

    def __str__(self) -> str:
        return f"attempt {self.number}: {self.outcome}"


# The run's status after each attempt outcome (JobAttempt.Outcome.status).
_RUN_STATUS_AFTER = {
    JobAttempt.Outcome.SUCCEEDED: RunStatus.SUCCEEDED,
    JobAttempt.Outcome.FAILED: RunStatus.FAILED,
    JobAttempt.Outcome.RETRYING: RunStatus.QUEUED,
    JobAttempt.Outcome.DEFERRED: RunStatus.DEFERRED,
    JobAttempt.Outcome.DROPPED: RunStatus.CANCELLED,
    JobAttempt.Outcome.CANCELLED: RunStatus.CANCELLED,
}
