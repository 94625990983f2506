"""How a run and its attempts are shown: the run's columns and fields (``RunDisplay``) and its
attempts (``JobAttemptInline``, operators only: errors, tracebacks and log lines).

Kept apart from ``JobRunAdmin`` so that the admin class says which columns each audience
gets, and this module how each column reads.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from ..core.audience import is_operator_request
from ..models import JobAttempt, JobRun
from ..worker.holds import HoldKind, hold_of
from .audiences import ReadOnly
from .render import (
    failure_sentence,
    human_duration,
    job_title,
    log_table,
    pre,
    pretty_json,
    short_time,
    status_badge,
    subject_html,
)


class JobAttemptInline(ReadOnly, admin.StackedInline):  # type: ignore[type-arg]  # Django's admin classes are not subscriptable at runtime
    """A run's attempts, one block each, under the run's detail page: when, on which worker, how it
    ended, and the error, traceback and log lines that explain a failure.
    """

    model = JobAttempt
    extra = 0
    can_delete = False
    show_change_link = False
    verbose_name = _("attempt")
    verbose_name_plural = _("attempts")
    fields = (
        ("number", "outcome", "worker"),
        ("started_at", "finished_at", "duration"),
        "error",
        "traceback_block",
        "log_lines",
    )
    readonly_fields = (
        "number",
        "outcome",
        "worker",
        "started_at",
        "finished_at",
        "duration",
        "error",
        "traceback_block",
        "log_lines",
    )

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Operators only: errors, tracebacks and log lines are internals a tenant must not read,
        so a tenant sees the run's status and problem sentence, never its attempts.
        """
        return is_operator_request() and super().has_view_permission(request, obj)

    @admin.display(description=_("duration"))
    def duration(self, attempt: JobAttempt) -> str:
        """How long the attempt ran, in human units ("—" while it still runs)."""
        return human_duration(attempt.duration_ms)

    @admin.display(description=_("error"))
    def error(self, attempt: JobAttempt) -> str:
        """The exception as ``Type: message``, or "—" when the attempt did not fail."""
        if not attempt.error_type and not attempt.error_message:
            return "—"
        return f"{attempt.error_type}: {attempt.error_message}".strip(": ")

    @admin.display(description=_("traceback"))
    def traceback_block(self, attempt: JobAttempt) -> SafeString | str:
        """The attempt's traceback, preformatted so its indentation survives."""
        return pre(attempt.traceback)

    @admin.display(description=_("log"))
    def log_lines(self, attempt: JobAttempt) -> SafeString | str:
        """The log records captured during the attempt, as a table."""
        return log_table(attempt.log or [])


# The status column's class per hold (tests and the browser's CSS read them), and whether
# the note may wrap.
_HOLD_CSS = {
    HoldKind.PAUSED: ("kj-paused", False),
    HoldKind.RATE: ("kj-rate", True),
    HoldKind.CAP: ("kj-cap", False),
    HoldKind.UNTIL: ("kj-until", True),
    HoldKind.DEFERRAL: ("kj-waiting-for", False),
}


class RunDisplay:
    """Column and field renderers shared by the run list and detail pages."""

    @admin.display(description=_("job"), ordering="job_name")
    def job(self, run: JobRun) -> str:
        """The job's dotted name for operators; for a tenant, its title (the first line of its
        description), which reads as a task rather than as code.
        """
        return run.job_name if is_operator_request() else job_title(run.job_name)

    @admin.display(description=_("tenant"), ordering="schema_name")
    def tenant(self, run: JobRun) -> SafeString | str:
        """The run's tenant schema, or an italic "system" for runs outside any tenant."""
        return run.schema_name or format_html("<em>{}</em>", gettext("system"))

    @admin.display(description=_("status"), ordering="status")
    def status_label(self, run: JobRun) -> SafeString:
        """The status badge, plus what holds a waiting run back (worker/holds.py) so that it
        does not look stuck: a pause, a rate window or a concurrency cap; "until <time>" for a
        queued run that is not due yet (a retry's back-off or an ``enqueue_in`` delay: the
        same word, "queued", as in code and the CLI); what a deferred run waits for.
        """
        hold = hold_of(run)
        if hold is None:
            return status_badge(run.status)
        if hold.kind == HoldKind.RATE:
            text = gettext("waiting for a rate limit (until %(time)s)") % {
                "time": short_time(hold.at)
            }
        elif hold.kind == HoldKind.UNTIL:
            text = gettext("until %(time)s") % {"time": short_time(hold.at)}
        else:
            text = hold.text
        css, nowrap = _HOLD_CSS[hold.kind]
        style = "font-size:0.85em;white-space:nowrap" if nowrap else "font-size:0.85em"
        return format_html(
            '{} <span class="{}" style="{}">{}</span>', status_badge(run.status), css, style, text
        )

    @admin.display(description=_("attempts"))
    def attempts_of(self, run: JobRun) -> str:
        """Attempts used out of attempts allowed (``2/5``): how many retries are left."""
        return f"{run.attempts}/{run.max_attempts}"

    @admin.display(description=_("duration"), ordering="duration_ms")
    def duration(self, run: JobRun) -> str:
        """The run's total time in human units."""
        return human_duration(run.duration_ms)

    @admin.display(description=_("problem"))
    def problem(self, run: JobRun) -> str:
        """Why the run failed, as a sentence in the reader's language, or "—"."""
        return failure_sentence(getattr(run, "failure_key", None)) or "—"

    @admin.display(description=_("status"), ordering="status")
    def status_and_problem(self, run: JobRun) -> SafeString:
        """The status badge with the failure sentence under it: the tenant's list shows both in one
        column.
        """
        # One column for both keeps the tenant's list narrow enough to read beside the filters.
        sentence = failure_sentence(getattr(run, "failure_key", None))
        if not sentence:
            return status_badge(run.status)
        return format_html(
            '{}<div class="kj-problem" style="margin-top:4px">{}</div>',
            status_badge(run.status),
            sentence,
        )

    @admin.display(description=_("progress"), ordering="progress")
    def progress_cell(self, run: JobRun) -> SafeString | str:
        """What the job last said of how far it is (``ctx.progress``): ``40 %`` and its text,
        "—" for a run that never said."""
        if run.progress is None:
            return "—"
        percent = f"{round(run.progress * 100)} %"
        if not run.progress_message:
            return percent
        return format_html(
            '{}<div class="kj-progress" style="font-size:0.85em">{}</div>',
            percent,
            run.progress_message,
        )

    @admin.display(description=_("payload"))
    def payload_block(self, run: JobRun) -> SafeString:
        """The arguments the run was enqueued with, as indented JSON."""
        return pretty_json(run.payload)

    @admin.display(description=_("result"))
    def result_block(self, run: JobRun) -> SafeString | str:
        """What the job returned, as indented JSON (or the marker saying why it was not kept); "—"
        when there is none.
        """
        # Operators only (not in the tenant's fieldsets): what the job returned, or the marker
        # saying why it was not kept (kumiko_jobs.results).
        if run.result is None:
            return "—"
        return pretty_json(run.result)

    @admin.display(description=_("error"))
    def error_block(self, run: JobRun) -> SafeString | str:
        """The final error as ``Type: message``, preformatted; "—" for a run that did not fail."""
        if not run.error_type and not run.error_message:
            return "—"
        return pre(f"{run.error_type}: {run.error_message}".strip(": "))

    @admin.display(description=_("run id"))
    def run_ref(self, run: JobRun) -> str:
        """The run id as text, to copy into a log search or the CLI."""
        return str(run.run_id)

    @admin.display(description=_("subject"), ordering="subject")
    def subject_cell(self, run: JobRun) -> SafeString | str:
        """What the run acted on (``invoice_id=7``), kept on one line when it is short."""
        return subject_html(run.subject)

    @admin.display(description=_("queued"), ordering="queued_at")
    def queued(self, run: JobRun) -> str:
        """When the run was enqueued, in the compact form list columns use."""
        return short_time(run.queued_at)

    @admin.display(description=_("finished"), ordering="finished_at")
    def finished(self, run: JobRun) -> str:
        """When the run finished ("—" while it has not), in the compact form."""
        return short_time(run.finished_at)

    @admin.display(description=_("finished"), ordering="finished_at")
    def finished_with_duration(self, run: JobRun) -> SafeString | str:
        """When the run finished, with its duration under the time; "—" while it runs."""
        # The duration under the time, so the tenant's list needs one column less.
        if run.finished_at is None:
            return "—"
        return format_html(
            '{}<div class="kj-duration" style="opacity:0.7">{}</div>',
            short_time(run.finished_at),
            human_duration(run.duration_ms),
        )
