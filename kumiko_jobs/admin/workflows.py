"""Workflows in the admin, for both audiences, read-only (docs/workflows.md, "The admin").

Operators (``view_all_tenants``, on the public domain) see every tenant's workflows with their
counters, reasons and steps, and may cancel them. A tenant's staff, on its own domain, sees its
own workflows only (``TenantScopedAdmin``: filtered by the tenant's schema), each with its
steps' keys, job titles, states and progress, and nothing the operators' columns hold (the
reasons name operators; the arguments and results are the job author's data). Another
tenant's workflow is "not found", as an unknown id is.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import OuterRef, QuerySet, Subquery
from django.http import HttpRequest
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from ..core.audience import is_operator_request, sees_all_tenants, tenant_schema
from ..enqueueing.workflow_release import cancel
from ..models import JobRun, Workflow, WorkflowStep
from .audiences import TenantScopedAdmin, admitted
from .render import job_title

_OPERATOR_STEP_FIELDS = (
    "key",
    "job_name",
    "state",
    "leads_to",
    "progress",
    "waiting_on",
    "run_id",
    "reason",
    "finished_at",
)
_TENANT_STEP_FIELDS = ("key", "job", "state", "leads_to", "progress", "finished_at")
# Dependents named per step in the list: a group's callback is one name, a fan-out of
# thousands a count.
_DEPENDENTS_SHOWN = 5


class WorkflowStepInline(admin.TabularInline):  # type: ignore[type-arg]  # Django's admin classes are not subscriptable at runtime
    """A workflow's steps with their states and progress (the first 200: a group of thousands
    is read by its counters on the workflow)."""

    model = WorkflowStep
    fields = _OPERATOR_STEP_FIELDS
    readonly_fields = (*_OPERATOR_STEP_FIELDS, "job")
    ordering = ("id",)  # the order the workflow was built in: a chain reads top to bottom
    extra = 0
    max_num = 0
    can_delete = False
    show_change_link = False

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        """The operator's columns, or the tenant's (no reasons, runs or counters)."""
        return _OPERATOR_STEP_FIELDS if is_operator_request() else _TENANT_STEP_FIELDS

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        """The audience's steps (a tenant's: of its own workflows only), each with its run's
        progress."""
        queryset: QuerySet[Any] = super().get_queryset(request)
        if not admitted(request):
            return queryset.none()
        if not is_operator_request():
            queryset = queryset.filter(workflow__schema_name=tenant_schema())
        runs = JobRun.objects.filter(pk=OuterRef("run_id"))
        annotated: QuerySet[Any] = queryset.annotate(
            run_progress=Subquery(runs.values("progress")[:1]),
            run_progress_message=Subquery(runs.values("progress_message")[:1]),
        )
        return annotated

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Steps are written by the enqueue, never by hand."""
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Steps are history: shown, never edited."""
        return False

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """As the workflow: its audience with the workflows' view permission."""
        return admitted(request) and request.user.has_perm("kumiko_jobs.view_workflow")

    @admin.display(description=_("job"))
    def job(self, step: WorkflowStep) -> str:
        """The job's title, as a tenant reads it (the first line of its description)."""
        return job_title(step.job_name)

    @admin.display(description=_("then"))
    def leads_to(self, step: WorkflowStep) -> str:
        """The steps that wait for this one (the workflow's edges, read as a list: "→ b, c"),
        or "—" for a last step."""
        keys = [str(k) for k in step.dependents or ()]
        if not keys:
            return "—"
        shown = ", ".join(keys[:_DEPENDENTS_SHOWN])
        more = len(keys) - _DEPENDENTS_SHOWN
        return f"→ {shown}" + (f" (+{more})" if more > 0 else "")

    @admin.display(description=_("progress"))
    def progress(self, step: WorkflowStep) -> str:
        """What the step's run last said of how far it is (``ctx.progress``), or "—"."""
        fraction = getattr(step, "run_progress", None)
        if fraction is None:
            return "—"
        text = getattr(step, "run_progress_message", "")
        return f"{round(fraction * 100)} %" + (f" · {text}" if text else "")


@admin.register(Workflow)
class WorkflowAdmin(TenantScopedAdmin):
    """Every tenant's workflows for operators (status, counters, steps; cancel what has not
    finished); a tenant's own for its staff."""

    operator_list_display = (
        "name",
        "schema_name",
        "status",
        "steps_total",
        "steps_pending",
        "steps_failed",
        "created_at",
        "finished_at",
    )
    operator_list_filter = ("status", "name")
    operator_search_fields = ("=workflow_id", "name", "=schema_name")
    operator_fieldsets = (
        (
            None,
            {
                "fields": (
                    "workflow_id",
                    "name",
                    "schema_name",
                    "status",
                    "stop_on_failure",
                    "steps_total",
                    "steps_pending",
                    "steps_failed",
                    "created_at",
                    "finished_at",
                    "reason",
                    "correlation_id",
                )
            },
        ),
    )
    tenant_list_display = ("name", "status", "steps_total", "steps_pending", "created_at")
    tenant_list_filter = ("status",)
    tenant_search_fields = ("name",)
    tenant_fieldsets = (
        (
            None,
            {
                "fields": (
                    "name",
                    "status",
                    "steps_total",
                    "steps_pending",
                    "steps_failed",
                    "created_at",
                    "finished_at",
                )
            },
        ),
    )
    tenant_lookups = frozenset({"status__exact"})
    inlines = (WorkflowStepInline,)
    ordering = ("-created_at",)
    actions = ("cancel_selected",)

    def get_sortable_by(self, request: HttpRequest) -> tuple[str, ...]:
        """Sortable by time only, as the runs (the base class names the runs' columns)."""
        return ("created_at",)

    def has_operate_permission(self, request: HttpRequest) -> bool:
        """Cancel: operators holding the change permission of runs, as the runs' own cancel."""
        return sees_all_tenants(request) and request.user.has_perm("kumiko_jobs.change_jobrun")

    @admin.action(description=_("Cancel selected workflows"), permissions=["operate"])
    def cancel_selected(self, request: HttpRequest, queryset: QuerySet[Workflow]) -> None:
        """Cancel each selected workflow that is still running; report how many."""
        done = sum(cancel(wf.workflow_id, by=request.user) for wf in queryset[:100])
        self.message_user(
            request,
            gettext("%(count)d workflow(s) cancelled.") % {"count": done},
            messages.SUCCESS if done else messages.WARNING,
        )
