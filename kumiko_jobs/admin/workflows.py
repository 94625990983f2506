"""Workflows in the admin: operators only (``view_all_tenants``), read-only, with their steps
and one action, cancel (docs/workflows.md). A tenant's view of its own workflows is not here
yet: the steps' arguments and results are the job author's data, shown to operators only."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import OuterRef, QuerySet, Subquery
from django.http import HttpRequest
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from ..core.audience import sees_all_tenants
from ..enqueueing.workflow_release import cancel
from ..models import JobRun, Workflow, WorkflowStep
from .audiences import OperatorsOnly, ReadOnly
from .query_strings import CleanQueryStrings


class WorkflowStepInline(admin.TabularInline):  # type: ignore[type-arg]  # Django's admin classes are not subscriptable at runtime
    """A workflow's steps with their states (the first 200: a group of thousands is read by
    its counters on the workflow)."""

    model = WorkflowStep
    fields = (
        "key",
        "job_name",
        "state",
        "progress",
        "waiting_on",
        "run_id",
        "reason",
        "finished_at",
    )
    readonly_fields = fields
    extra = 0
    max_num = 0
    can_delete = False
    show_change_link = False

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        """Operators only, as the workflow itself; each step with its run's progress."""
        queryset: QuerySet[Any] = super().get_queryset(request)
        if not sees_all_tenants(request):
            return queryset.none()
        runs = JobRun.objects.filter(pk=OuterRef("run_id"))
        annotated: QuerySet[Any] = queryset.annotate(
            run_progress=Subquery(runs.values("progress")[:1]),
            run_progress_message=Subquery(runs.values("progress_message")[:1]),
        )
        return annotated

    @admin.display(description=_("progress"))
    def progress(self, step: WorkflowStep) -> str:
        """What the step's run last said of how far it is (``ctx.progress``), or "—"."""
        fraction = getattr(step, "run_progress", None)
        if fraction is None:
            return "—"
        text = getattr(step, "run_progress_message", "")
        return f"{round(fraction * 100)} %" + (f" · {text}" if text else "")

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Steps are written by the enqueue, never by hand."""
        return False


@admin.register(Workflow)
class WorkflowAdmin(CleanQueryStrings, OperatorsOnly, ReadOnly, admin.ModelAdmin):  # type: ignore[type-arg]  # Django's admin classes are not subscriptable at runtime
    """Every tenant's workflows: status, counters, steps; cancel what has not finished."""

    list_display = (
        "name",
        "schema_name",
        "status",
        "steps_total",
        "steps_pending",
        "steps_failed",
        "created_at",
        "finished_at",
    )
    list_filter = ("status", "name")
    search_fields = ("=workflow_id", "name", "=schema_name")
    fields = (
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
    readonly_fields = fields
    inlines = (WorkflowStepInline,)
    ordering = ("-created_at",)
    show_full_result_count = False
    actions = ("cancel_selected",)

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
