"""The operators' pauses page: what is paused, pause something, resume it (delete the row).

Adding a row is ``worker.pauses.pause`` and deleting it ``worker.pauses.resume`` (the same
checks and the same Redis writes as ``manage.py kumiko_jobs pause|resume``), so the dequeue
sees the change at once. Operators only (``view_all_tenants``, on the public schema's domain):
a tenant's domain shows no such page, and adding or deleting is refused to anyone else whatever
their model permissions, including a staff user of the public domain without
``view_all_tenants`` (with users shared by every tenant, a tenant's staff user signs in there).
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from ..core.audience import sees_all_tenants
from ..models import FlowPause
from ..worker import pauses
from .audiences import OperatorsOnly
from .query_strings import CleanQueryStrings


class PauseForm(forms.ModelForm):  # type: ignore[type-arg]  # ModelForm is not subscriptable at runtime
    """The three fields, checked as the command checks them."""

    class Meta:
        """What an operator fills in: a queue, or a job and/or a tenant."""

        model = FlowPause
        fields = ("queue", "job_name", "schema_name")

    def clean(self) -> dict[str, Any]:
        """Refuse what names nothing real, or a queue with a job or tenant."""
        data = super().clean() or {}
        try:
            pauses.check(
                data.get("queue", ""), data.get("job_name", ""), data.get("schema_name", "")
            )
        except pauses.PauseRefused as exc:
            raise forms.ValidationError(str(exc)) from None
        return data


@admin.register(FlowPause)
class FlowPauseAdmin(CleanQueryStrings, OperatorsOnly, admin.ModelAdmin):  # type: ignore[type-arg]  # Django's admin classes are not subscriptable at runtime
    """Pauses in force; add one to pause, delete it to resume."""

    form = PauseForm
    list_display = ("__str__", "queue", "job_name", "schema_name", "paused_at", "paused_by")
    ordering = ("-paused_at",)
    actions = ("resume_selected",)

    def has_add_permission(self, request: HttpRequest) -> bool:
        """Operators only (``view_all_tenants``): the public domain alone is not enough."""
        return sees_all_tenants(request) and super().has_add_permission(request)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """A pause is added or deleted, never edited (resume, then pause the other thing)."""
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Operators only (``view_all_tenants``): the public domain alone is not enough."""
        return sees_all_tenants(request) and super().has_delete_permission(request, obj)

    def save_model(self, request: HttpRequest, obj: FlowPause, form: Any, change: bool) -> None:
        """Pause through ``worker.pauses`` (the row and the Redis sets)."""
        pauses.pause(obj.queue, obj.job_name, obj.schema_name, by=str(request.user))
        saved = FlowPause.objects.filter(
            queue=obj.queue, job_name=obj.job_name, schema_name=obj.schema_name
        ).first()
        if saved is not None:
            obj.pk = saved.pk  # the admin's message links to the row

    def delete_model(self, request: HttpRequest, obj: FlowPause) -> None:
        """Resume through ``worker.pauses``."""
        pauses.resume(obj.queue, obj.job_name, obj.schema_name)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[FlowPause]) -> None:
        """Resume each (the bulk delete of the changelist)."""
        for obj in queryset:
            pauses.resume(obj.queue, obj.job_name, obj.schema_name)

    @admin.action(description="Resume the selected pauses", permissions=["delete"])
    def resume_selected(self, request: HttpRequest, queryset: QuerySet[FlowPause]) -> None:
        """Resume the selected pauses: their runs go on where they were."""
        self.delete_queryset(request, queryset)
