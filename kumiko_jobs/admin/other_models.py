"""The admins of the other history tables: failures for both audiences (``JobFailureAdmin``),
rejected messages and escape-hatch uses for operators only.

Read-only like the runs: the runner, the worker's refusal of bad messages and the
escape-hatch audit write these rows; the retention sweep deletes them.
"""

from __future__ import annotations

from django.contrib import admin
from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from ..models import EscapeHatchUse, JobFailure, RejectedMessage
from .audiences import OperatorsOnly, ReadOnly, TenantScopedAdmin
from .filters import JobFilter, TenantFilter
from .query_strings import CleanQueryStrings
from .render import failure_sentence, job_title, pre, short_time, subject_html

# --- JobFailure -------------------------------------------------------------------------------


@admin.register(JobFailure)
class JobFailureAdmin(TenantScopedAdmin):
    """The latest failure per tenant, job and subject, for both audiences: operators see the message
    key and tenant, a tenant only its own failures as sentences, each linking to its run.
    """

    list_per_page = 50
    ordering = ("-failed_at",)

    operator_list_display = (
        "job_name",
        "schema_name",
        "subject_cell",
        "message_key",
        "message",
        "failed",
        "run_link",
    )
    operator_list_filter = (JobFilter, TenantFilter, ("failed_at", admin.DateFieldListFilter))
    operator_search_fields = ("subject", "message_key", "job_name")
    operator_fieldsets = (
        (
            None,
            {
                "fields": (
                    "job_name",
                    "schema_name",
                    "subject",
                    "message_key",
                    "message",
                    "failed_at",
                    "run_link",
                )
            },
        ),
    )

    tenant_list_display = ("job", "subject_cell", "message", "failed", "run_link")
    tenant_list_filter = (JobFilter, ("failed_at", admin.DateFieldListFilter))
    tenant_search_fields = ("subject",)
    tenant_fieldsets = ((None, {"fields": ("job", "subject", "message", "failed_at", "run_link")}),)
    tenant_lookups = frozenset({"job", "failed_at__gte", "failed_at__lt", "failed_at__isnull"})

    @admin.display(description=_("job"), ordering="job_name")
    def job(self, failure: JobFailure) -> str:
        """The job's title, for a tenant's list (operators see the dotted ``job_name``)."""
        return job_title(failure.job_name)

    @admin.display(description=_("subject"), ordering="subject")
    def subject_cell(self, failure: JobFailure) -> SafeString | str:
        """What the failed run acted on (``invoice_id=7``), kept on one line when it is short."""
        return subject_html(failure.subject)

    @admin.display(description=_("failed at"), ordering="failed_at")
    def failed(self, failure: JobFailure) -> str:
        """When it failed, in the compact form list columns use."""
        return short_time(failure.failed_at)

    @admin.display(description=_("what went wrong"))
    def message(self, failure: JobFailure) -> str:
        """The failure's message key as a sentence in the reader's language, never the error's own
        text.
        """
        return failure_sentence(failure.message_key)

    @admin.display(description=_("run"))
    def run_link(self, failure: JobFailure) -> SafeString:
        """A link to the run that failed, where its status (and, for operators, its attempts)
        explain more.
        """
        url = reverse(f"{self.admin_site.name}:kumiko_jobs_jobrun_change", args=[failure.run_id])
        return format_html('<a href="{}">{}</a>', url, gettext("view run"))


# --- RejectedMessage (operators only) ---------------------------------------------------------


@admin.register(RejectedMessage)
class RejectedMessageAdmin(CleanQueryStrings, OperatorsOnly, ReadOnly, admin.ModelAdmin):  # type: ignore[type-arg]  # Django's admin classes are not subscriptable at runtime
    """Operators only: the queue messages refused before any tenant was entered (undecodable,
    not a call of the runner, a job RQ cannot load), to see what arrived and why it was refused.
    """

    list_display = ("received_at", "queue", "rq_job_id", "reason")
    list_filter = ("queue", ("received_at", admin.DateFieldListFilter))
    search_fields = ("rq_job_id", "reason")
    fields = ("received_at", "queue", "rq_job_id", "reason", "excerpt_block")
    readonly_fields = fields
    ordering = ("-received_at",)
    show_full_result_count = False

    @admin.display(description=_("excerpt"))
    def excerpt_block(self, message: RejectedMessage) -> SafeString | str:
        """The message's first bytes as received, preformatted."""
        return pre(message.excerpt)


# --- EscapeHatchUse (operators only) ----------------------------------------------------------


@admin.register(EscapeHatchUse)
class EscapeHatchUseAdmin(CleanQueryStrings, OperatorsOnly, ReadOnly, admin.ModelAdmin):  # type: ignore[type-arg]  # Django's admin classes are not subscriptable at runtime
    """Every declared crossing of a tenant boundary that was used, with its reason."""

    list_display = ("job_name", "grant", "schema_name", "actor", "count", "last_seen", "reason")
    # The tenant filter of the runs (an input past TenantFilter.MAX_CHOICES tenants): Django's
    # own would list one link per tenant that ever used a grant, thousands at 10,000 tenants.
    list_filter = ("grant", JobFilter, TenantFilter)
    search_fields = ("job_name", "reason", "actor")
    readonly_fields = (
        "job_name",
        "grant",
        "reason",
        "schema_name",
        "actor",
        "triggered_by",
        "first_seen",
        "last_seen",
        "count",
        "last_run_id",
    )
    fields = readonly_fields
    ordering = ("-last_seen",)
