"""The run history's admin: ``JobRunAdmin``, one class for both audiences.

Composed of the run's display (``RunDisplay``), the operators' actions (``RunActions``) and
"Run a job…" (``RunJobView``) on ``TenantScopedAdmin``; this module holds what each audience
sees of a run, and what only the run list does: the failure annotation for the "problem"
column, the indexed search, the tenant's page subtitle and the missing-scheduler banner.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.contrib.admin.views.main import ChangeList
from django.db.models import OuterRef, QuerySet, Subquery
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from ..core.audience import is_operator_request, sees_all_tenants
from ..models import JobFailure, JobRun, RunStatus
from ..transport.scheduler_liveness import overdue_problem
from .actions import RunActions
from .audiences import TenantScopedAdmin
from .bulk import BulkViews
from .dashboard import DashboardViews
from .display import JobAttemptInline, RunDisplay
from .filters import JobFilter, TenantFilter
from .pagination import rows_read
from .query_strings import bounded_search, checked_search
from .render import job_title
from .run_job import RunJobView
from .search import operator_search, tenant_search

_TENANT_RUN_FIELDS = (
    "job",
    "subject",
    "status_label",
    "problem",
    "progress_cell",
    "queued_at",
    "started_at",
    "finished_at",
    "duration",
)


# The request attribute that carries the list's order from RunChangeList to the search.
_ORDERING_ATTRIBUTE = "kumiko_jobs_list_ordering"


class RunChangeList(ChangeList):
    """Django's change list, which tells the search the order the list will be in.

    Django applies the search first and the order after it, but a search that reads only the
    rows the list can show must read them in that order (admin/search.py, newest_matches).
    The order is Django's own (``get_ordering``: the admin's, a column sorted by hand, then
    the primary key as tie-break), computed the same way from the same queryset ordering.
    """

    def get_queryset(self, request: HttpRequest, exclude_parameters: Any = None) -> QuerySet[Any]:
        """Record the list's order on the request for ``get_search_results``, then build the
        queryset as Django does."""
        setattr(request, _ORDERING_ATTRIBUTE, self.get_ordering(request, self.root_queryset))
        queryset: QuerySet[Any] = super().get_queryset(request, exclude_parameters)
        return queryset


def list_ordering(request: HttpRequest) -> tuple[str, ...] | None:
    """The order RunChangeList recorded for this request's list, as field names (duplicates
    dropped); ``None`` outside a change list (another caller of ``get_search_results``) or
    when the order holds an expression: the search then filters without narrowing."""
    recorded = getattr(request, _ORDERING_ATTRIBUTE, None)
    if recorded is None or not all(isinstance(item, str) for item in recorded):
        return None
    ordering: list[str] = []
    for item in recorded:
        if item.removeprefix("-") not in {o.removeprefix("-") for o in ordering}:
            ordering.append(item)
    return tuple(ordering)


@admin.register(JobRun)
class JobRunAdmin(DashboardViews, BulkViews, RunActions, RunJobView, RunDisplay, TenantScopedAdmin):
    """The run history for both audiences: operators see every tenant's runs with their attempts,
    actions and "Run a job…"; a tenant sees its own runs, by job title, status and problem sentence.
    """

    change_list_template = "admin/kumiko_jobs/jobrun/change_list.html"
    list_per_page = 50
    ordering = ("-queued_at",)

    operator_list_display = (
        "job",
        "tenant",
        "subject_cell",
        "status_label",
        "progress_cell",
        "attempts_of",
        "queued",
        "duration",
    )
    operator_list_filter = (
        "status",
        JobFilter,
        TenantFilter,
        ("queued_at", admin.DateFieldListFilter),
    )
    operator_search_fields = ("subject", "job_name", "=correlation_id")
    operator_fieldsets = (
        (
            None,
            {
                "fields": (
                    "run_ref",
                    ("job_name", "tenant"),
                    "subject",
                    ("status_label", "attempts_of"),
                    "problem",
                    "progress_cell",
                    ("queue", "defer_count", "gate_defer_count"),
                )
            },
        ),
        (
            _("Times"),
            {
                "fields": (
                    ("queued_at", "scheduled_for"),
                    ("started_at", "finished_at"),
                    "duration",
                )
            },
        ),
        (
            _("Origin"),
            {
                "fields": (
                    ("trigger", "triggered_by"),
                    ("correlation_id", "trace_id"),
                    ("parent_run_id", "rq_job_id"),
                    "flow_schema",
                )
            },
        ),
        (_("Arguments"), {"fields": ("payload_block",)}),
        (_("Result"), {"fields": ("result_block",)}),
        (_("Error"), {"fields": ("error_block",)}),
    )

    # The list leaves out "started" to stay readable next to the filters; the detail has it.
    tenant_list_display = (
        "job",
        "subject_cell",
        "status_and_problem",
        "progress_cell",
        "queued",
        "finished_with_duration",
    )
    tenant_list_filter = ("status", JobFilter, ("queued_at", admin.DateFieldListFilter))
    tenant_search_fields = ("subject",)
    tenant_fieldsets = ((None, {"fields": _TENANT_RUN_FIELDS}),)
    tenant_lookups = frozenset(
        {
            "status__exact",
            "job",
            "queued_at__gte",
            "queued_at__lt",
            "queued_at__isnull",
        }
    )
    tenant_only = (
        "run_id",
        "job_name",
        "schema_name",
        "subject",
        "status",
        "queued_at",
        "started_at",
        "finished_at",
        "duration_ms",
        "progress",
        "progress_message",
    )

    def get_queryset(self, request: HttpRequest) -> QuerySet[JobRun]:
        """The audience's runs, each annotated with the message key of its tenant-visible failure,
        so the "problem" column costs one index probe per row instead of a query.
        """
        # The tenant-visible failure of a run, for the "problem" column; correlated on the
        # unique (tenant, job, subject) key so each row costs one index probe.
        failure = JobFailure.objects.filter(
            schema_name=OuterRef("schema_name"),
            job_name=OuterRef("job_name"),
            subject=OuterRef("subject"),
            run_id=OuterRef("run_id"),
        ).values("message_key")[:1]
        runs: QuerySet[JobRun] = super().get_queryset(request)
        return runs.annotate(failure_key=Subquery(failure))

    def get_inlines(
        self, request: HttpRequest, obj: Any
    ) -> list[type[admin.options.InlineModelAdmin[Any, Any]]]:
        """The attempts (errors, tracebacks, logs) under an operator's run page; none for a tenant,
        who must not read them.
        """
        return [JobAttemptInline] if sees_all_tenants(request) else []

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[JobRun], search_term: str
    ) -> tuple[QuerySet[JobRun], bool]:
        """Search that an index can answer (admin/search.py) instead of Django's ``UPPER(...) LIKE``
        over every field: subjects for a tenant; subjects, job names, correlation and run ids for
        operators. Bounded for every caller (admin/query_strings.py): the change list, an action's
        POST and ``/admin/autocomplete/`` alike.
        """
        # Every caller, the autocomplete included, passes the changelist's checks (text, words).
        checked_search(request, search_term)
        if not search_term.strip():
            return queryset, False
        # A search reads only the rows the list can show, in the list's order (admin/search.py,
        # newest_matches): as many as this page's count reads and, for an action's POST, as
        # many as "select all" may act on. The order is the one RunChangeList hands over; a
        # caller that is no change list (the autocomplete) gets the admin's own order, so its
        # search is as narrow as a list's first pages, never the whole history.
        ordering = list_ordering(request) or self.search_ordering(request)
        rows = rows_read(
            self.page_asked(request), self.list_per_page, acting=request.method == "POST"
        )
        search = operator_search if is_operator_request() else tenant_search
        return bounded_search(request, lambda: search(queryset, search_term, ordering, rows)), False

    def search_ordering(self, request: HttpRequest) -> tuple[str, ...]:
        """The admin's order with the primary key as tie-break, as Django's change list makes it:
        the order a search outside a change list narrows in."""
        ordering = [o for o in self.get_ordering(request) if isinstance(o, str)]
        if not {"pk", "-pk", "run_id", "-run_id"} & set(ordering):
            ordering.append("-pk")
        return tuple(ordering)

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        """``RunChangeList``: Django's, handing its order to the search."""
        return RunChangeList

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        """For a tenant, replace the page's subtitle (``str(run)``, written for operators) with the
        job's title, the subject and the translated status; for those who may act on the run,
        its retry and cancel buttons (``RunActions.run_controls``).
        """
        extra_context = dict(extra_context or {})
        # One more read of the row, only for a page that uses it (Django's view reads its own).
        may_act = self.has_operate_permission(request)
        run = None
        if may_act or not is_operator_request():
            run = self.get_object(request, unquote(object_id))
        if run is not None and may_act:
            extra_context["kumiko_run_controls"] = self.run_controls(request, run)
        if run is not None and not is_operator_request():
            # The page's subtitle defaults to str(run), which is written for operators (raw
            # status, schema name); a tenant reads the job's title and the translated status.
            status = RunStatus(run.status).label if run.status in RunStatus.values else ""
            parts = [job_title(run.job_name), run.subject, str(status)]
            extra_context["subtitle"] = " · ".join(p for p in parts if p)
            # The breadcrumb too (jobrun/change_form.html): the title, not the dotted name.
            named = parts[:2] if run.subject else parts[:1]
            extra_context["kumiko_tenant_title"] = " · ".join(named)
        return super().change_view(request, object_id, form_url, extra_context)

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        """Add the "Run a job…" link for those allowed to use it, and on an operator's list a banner
        when delayed work is overdue because no scheduler runs.
        """
        extra_context = dict(extra_context or {})
        if self.has_run_job_permission(request):
            extra_context["kumiko_run_job_url"] = reverse(
                f"{self.admin_site.name}:kumiko_jobs_jobrun_run_job"
            )
        extra_context.update(self.dashboard_link(request))
        extra_context.update(self.bulk_links(request))
        # Operators only: this runs before Django's permission check, and the banner (a
        # count of overdue messages, kept in the session) is theirs to read.
        if sees_all_tenants(request) and request.method == "GET":
            self._warn_if_scheduler_missing(request)
        return super().changelist_view(request, extra_context)

    def _warn_if_scheduler_missing(self, request: HttpRequest) -> None:
        """A banner on the operators' run list when delayed work is overdue (no scheduler):
        otherwise retries and enqueue_in runs just sit in "queued" and nothing says why."""
        problem = overdue_problem()
        if problem:
            messages.warning(request, gettext("Scheduler: %(problem)s") % {"problem": problem})
