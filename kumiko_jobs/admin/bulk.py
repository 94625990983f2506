"""Bulk retry and cancel of every run matching the run list's filter: the confirmation page,
the start, and the operations' own (read-only) list with their progress.

``BulkViews`` is a base of ``JobRunAdmin``: ``bulk/retry/?<the list's query string>`` counts
the runs that filter matches now and asks the operator to confirm that count; the POST starts
the operation (kumiko_jobs/bulk.py), which never acts on more runs than that count, and logs
it in Django's admin log (``LogEntry``) under the operation. Operators only (``view_all_tenants``
and ``change_jobrun``, the run list's actions' permission): a tenant's domain has no such page.
The filter is the run list's own: its query string builds Django's change list, so the runs
counted are the runs the list shows, with its filters, search and checks.
"""

from __future__ import annotations

import copy
from datetime import datetime
from typing import Any, cast

from django.contrib import admin, messages
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.views.main import PAGE_VAR, SEARCH_VAR
from django.core.exceptions import PermissionDenied
from django.db import OperationalError
from django.db.models import QuerySet
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseBadRequest,
    HttpResponseRedirect,
    QueryDict,
)
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext, ngettext
from django.utils.translation import gettext_lazy as _

from .. import bulk, operations
from ..core.audience import sees_all_tenants
from ..core.exceptions import OperationRefused
from ..models import BulkKind, BulkOperation, BulkState, JobRun
from .audiences import OperatorsOnly, ReadOnly
from .query_strings import (
    CleanQueryStrings,
    bad_query_string,
    bad_search,
    bounded_statements,
    timed_out,
    timed_out_response,
)

_TITLES = {
    BulkKind.RETRY: _("Retry every run matching the filter"),
    BulkKind.CANCEL: _("Cancel every run matching the filter"),
}


def _bad_request(text: str) -> HttpResponse:
    return HttpResponseBadRequest(text, content_type="text/plain; charset=utf-8")


class BulkViews(admin.ModelAdmin):  # type: ignore[type-arg]  # Django's admin classes are not subscriptable at runtime
    """The confirmation page and start of a bulk operation, on the run admin."""

    def get_urls(self) -> list[URLPattern]:
        """The run admin's URLs plus ``bulk/<retry|cancel>/``, behind the admin's login."""
        prefix = f"{self.opts.app_label}_{self.opts.model_name}"
        return [
            path(
                "bulk/<str:kind>/",
                self.admin_site.admin_view(self.bulk_view),
                name=f"{prefix}_bulk",
            ),
            *super().get_urls(),
        ]

    def may_bulk(self, request: HttpRequest) -> bool:
        """The run list's actions' permission: an operator holding ``change_jobrun``."""
        return sees_all_tenants(request) and request.user.has_perm("kumiko_jobs.change_jobrun")

    def bulk_links(self, request: HttpRequest) -> dict[str, str]:
        """For the run list's tools: the two bulk pages for the list's current filter."""
        if not self.may_bulk(request):
            return {}
        query = request.GET.copy()
        query.pop(PAGE_VAR, None)
        suffix = f"?{query.urlencode()}" if query else ""
        return {
            f"kumiko_bulk_{kind.value}_url": bulk_url(self.admin_site.name, kind) + suffix
            for kind in BulkKind
        }

    def bulk_view(self, request: HttpRequest, kind: str) -> HttpResponse:
        """GET: the count and the confirm button; POST: start the operation."""
        if not self.may_bulk(request):
            raise PermissionDenied
        try:
            operation_kind = BulkKind(kind)
        except ValueError:
            raise Http404(f"No bulk operation {kind!r}: use retry or cancel.") from None
        # Under the run list's statement timeout: a filter that reads too long answers 503 with
        # the list's sentence, and a POST that hits it starts nothing (one transaction).
        try:
            with bounded_statements(request):
                if request.method == "POST":
                    return self._bulk_start(request, operation_kind)
                return self._bulk_confirmation(request, operation_kind)
        except OperationalError as exc:
            if not timed_out(exc):
                raise
            return timed_out_response()

    def _bulk_confirmation(self, request: HttpRequest, operation_kind: BulkKind) -> HttpResponse:
        query = request.GET.copy()
        query.pop(PAGE_VAR, None)
        as_of = timezone.now()
        try:
            runs = self._filtered_runs(request, query)
        except ValueError as exc:
            return _bad_request(str(exc))
        count = (
            runs.filter(queued_at__lte=as_of)
            .exclude(job_name=bulk.BATCH_JOB)
            .order_by()
            .values("pk")[: bulk.MAX_RUNS + 1]
            .count()
        )
        changelist = reverse(f"{self.admin_site.name}:kumiko_jobs_jobrun_changelist")
        context = {
            **self.admin_site.each_context(request),
            "title": _TITLES[operation_kind],
            "opts": self.opts,
            "kind": operation_kind.value,
            "count": count,
            "too_many": count > bulk.MAX_RUNS,
            "max_runs": bulk.MAX_RUNS,
            "batch_size": bulk.BATCH_SIZE,
            "query": query.urlencode(),
            "filters": [(k, v) for k, values in query.lists() for v in values],
            "as_of": as_of.isoformat(),
            "runs_url": f"{changelist}?{query.urlencode()}" if query else changelist,
        }
        response = TemplateResponse(request, "admin/kumiko_jobs/jobrun/bulk_confirm.html", context)
        return response.render()

    def _filtered_runs(self, request: HttpRequest, query: QueryDict) -> QuerySet[JobRun]:
        """The runs the change list shows for ``query``: its filters, search and checks, read as
        an action's POST reads them (a search reads as many rows as "select all" may act on).
        ``ValueError`` names what is wrong with the query."""
        problem = bad_query_string(query) or bad_search(query.get(SEARCH_VAR, ""))
        if problem:
            raise ValueError(problem)
        shadow = copy.copy(request)
        shadow.GET = cast(Any, query)  # the change list reads GET only
        shadow.method = "POST"
        try:
            changelist = self.get_changelist_instance(shadow)
        except IncorrectLookupParameters:
            raise ValueError(
                gettext(
                    "The run list's filter in this address is not valid; filter the list again."
                )
            ) from None
        runs: QuerySet[JobRun] = changelist.get_queryset(shadow)
        return runs

    def _bulk_start(self, request: HttpRequest, kind: BulkKind) -> HttpResponse:
        query = QueryDict(request.POST.get("query", ""))
        try:
            confirmed = int(request.POST.get("confirmed", ""))
            as_of = datetime.fromisoformat(request.POST.get("as_of", ""))
            if timezone.is_naive(as_of):
                raise ValueError
        except ValueError:
            return _bad_request(
                gettext("The confirmation is incomplete: open the confirmation page again.")
            )
        try:
            runs = self._filtered_runs(request, query)
            operation = bulk.start(
                kind,
                runs,
                query=query.urlencode(),
                confirmed=confirmed,
                as_of=min(as_of, timezone.now()),
                by=operations.actor(request.user),
            )
        except ValueError as exc:
            return _bad_request(str(exc))
        except OperationRefused as exc:
            return _bad_request(str(exc))
        self.log_addition(
            request,
            operation,
            f"{kind.label} of the runs matching ?{query.urlencode()}: {confirmed} confirmed, "
            f"{operation.listed} listed",
        )
        self.message_user(
            request,
            ngettext(
                "Started: %(kind)s of %(count)d run, in the background.",
                "Started: %(kind)s of %(count)d runs, in the background.",
                operation.listed,
            )
            % {"kind": kind.label, "count": operation.listed},
            messages.SUCCESS,
        )
        return HttpResponseRedirect(
            reverse(
                f"{self.admin_site.name}:kumiko_jobs_bulkoperation_change",
                args=[operation.pk],
            )
        )


def bulk_url(site_name: str, kind: BulkKind) -> str:
    """The confirmation page of ``kind`` (add the run list's query string)."""
    return reverse(f"{site_name}:kumiko_jobs_jobrun_bulk", args=[kind.value])


@admin.register(BulkOperation)
class BulkOperationAdmin(CleanQueryStrings, OperatorsOnly, ReadOnly, admin.ModelAdmin):  # type: ignore[type-arg]  # Django's admin classes are not subscriptable at runtime
    """The bulk operations and their progress, for operators; stop a running one."""

    list_display = (
        "kind",
        "state",
        "progress",
        "done",
        "skipped",
        "failed",
        "requested_by",
        "requested_at",
        "filter_link",
    )
    list_filter = ("state", "kind")
    ordering = ("-requested_at",)
    actions = ("stop_selected",)
    fields = (
        ("kind", "state"),
        ("requested_by", "requested_at"),
        "filter_link",
        ("as_of", "confirmed", "listed"),
        ("done", "skipped", "failed", "batches"),
        "reasons_list",
        ("progressed_at", "finished_at", "stopped_by"),
    )
    readonly_fields = tuple(
        name for row in fields for name in (row if isinstance(row, tuple) else (row,))
    )

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Operators who may read the runs (``view_jobrun``) read what was done to them, without
        a permission of its own to hand out; never on a tenant's domain."""
        user = request.user
        return sees_all_tenants(request) and (
            user.has_perm("kumiko_jobs.view_jobrun")
            or user.has_perm("kumiko_jobs.view_bulkoperation")
        )

    def has_module_permission(self, request: HttpRequest) -> bool:
        """Listed in the admin's index for those who may view it."""
        return self.has_view_permission(request)

    @admin.display(description=_("progress"))
    def progress(self, operation: BulkOperation) -> str:
        """Runs reached of runs listed."""
        reached = operation.done + operation.skipped + operation.failed
        return f"{reached} / {operation.listed}"

    @admin.display(description=_("filter"))
    def filter_link(self, operation: BulkOperation) -> SafeString:
        """The run list with the operation's filter (what matches it now, not its list)."""
        url = reverse(f"{self.admin_site.name}:kumiko_jobs_jobrun_changelist")
        query = operation.filter_query
        return format_html(
            '<a href="{}">{}</a>', f"{url}?{query}" if query else url, query or gettext("(all)")
        )

    @admin.display(description=_("reasons"))
    def reasons_list(self, operation: BulkOperation) -> str:
        """Skipped and failed runs, by reason."""
        return "; ".join(f"{n} {reason}" for reason, n in sorted(operation.reasons.items()))

    def has_stop_permission(self, request: HttpRequest) -> bool:
        """Stopping: as starting, an operator holding ``change_jobrun``."""
        return sees_all_tenants(request) and request.user.has_perm("kumiko_jobs.change_jobrun")

    @admin.action(description=_("Stop the selected operations"), permissions=["stop"])
    def stop_selected(self, request: HttpRequest, queryset: QuerySet[BulkOperation]) -> None:
        """Stop the selected running operations: runs not reached yet stay as they are."""
        stopped = 0
        for operation in queryset.filter(state=BulkState.RUNNING):
            if bulk.stop(operation, by=request.user):
                stopped += 1
                self.log_change(request, operation, "Stopped")
        self.message_user(
            request,
            ngettext("%(count)d operation stopped.", "%(count)d operations stopped.", stopped)
            % {"count": stopped},
        )
