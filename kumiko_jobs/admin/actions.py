"""The operators' actions on runs: retry and cancel the selected runs.

Each run is handled in its own transaction, so one refusal (a run that has finished, a
tenant that is gone) skips that run only, and the message says how many were skipped and
why. "Select all" is refused when more rows match than the list counts (``selectable_rows``):
an action must never reach an unknown number of runs.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.db import transaction
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext, ngettext
from django.utils.translation import gettext_lazy as _

from .. import operations
from ..core.audience import sees_all_tenants
from ..core.exceptions import KumikoJobsError, OperationRefused
from ..models import JobRun
from .pagination import selectable_rows, too_many_selected


class RunActions(admin.ModelAdmin):  # type: ignore[type-arg]  # Django's admin classes are not subscriptable at runtime
    """Retry and cancel on the run list, for operators holding the change permission."""

    actions = ("retry_selected", "cancel_selected")

    def action_checkbox(self, obj: Any) -> SafeString:
        """Django's row checkbox, written as markup directly: rendering Django's widget through the
        template engine for every row costs a third of the list's time.
        """
        # The same markup as Django's, written directly: Django renders a form widget through
        # the template engine for each row, a third of the list's rendering time.
        return format_html(
            '<input type="checkbox" name="{}" value="{}" class="action-select" aria-label="{}">',
            ACTION_CHECKBOX_NAME,
            obj.pk,
            format_html(gettext("Select this object for an action - {}"), str(obj)),
        )

    def response_action(  # Django 6.1 passes action_location, 5.2 does not
        self, request: HttpRequest, queryset: QuerySet[Any], *args: Any, **kwargs: Any
    ) -> HttpResponse | None:
        """Refuse an action on "select all" when more runs match than the list counts, rather than
        retry or cancel an unknown number of them.
        """
        # "Select all" acts on every row the filters match, which the list no longer counts
        # beyond its pages: refuse rather than retry or cancel an unknown number of runs.
        if request.POST.get("select_across") == "1" and too_many_selected(queryset):
            self.message_user(
                request,
                gettext(
                    "More than %(count)d runs match: filter the list to fewer before "
                    "applying an action to all of them."
                )
                % {"count": selectable_rows()},
                messages.ERROR,
            )
            return None
        return super().response_action(request, queryset, *args, **kwargs)

    def has_operate_permission(self, request: HttpRequest) -> bool:
        """Retry and cancel: operators (``view_all_tenants``) holding the (otherwise unused)
        change permission."""
        return sees_all_tenants(request) and request.user.has_perm("kumiko_jobs.change_jobrun")

    @admin.action(description=_("Retry selected failed runs"), permissions=["operate"])
    def retry_selected(self, request: HttpRequest, queryset: QuerySet[JobRun]) -> None:
        """Retry each selected failed run in its own transaction, and report how many were retried
        and how many skipped, by reason.
        """

        def retry(run: JobRun) -> None:
            operations.retry_run(run, by=request.user)

        done, skipped = _apply(queryset, retry)
        self._report(
            request,
            ngettext("%(count)d run retried", "%(count)d runs retried", done) % {"count": done},
            done,
            skipped,
        )

    @admin.action(description=_("Cancel selected runs"), permissions=["operate"])
    def cancel_selected(self, request: HttpRequest, queryset: QuerySet[JobRun]) -> None:
        """Cancel the selected runs: waiting ones at once, running ones asked to stop (the job sees
        ``ctx.cancel_requested``); finished ones are skipped and counted.
        """
        # Waiting runs are cancelled at once; running ones are asked to stop (the job sees it
        # through ctx.cancel_requested; docs/reliability.md, Cancellation).
        requested = 0

        def cancel(run: JobRun) -> None:
            nonlocal requested
            result = operations.cancel_run(run, by=request.user)
            if not result:
                raise OperationRefused(
                    f"Run {run.run_id} has finished.", reason=_("already finished")
                )
            requested += result == operations.CANCEL_REQUESTED

        done, skipped = _apply(queryset, cancel)
        cancelled = done - requested
        head = ngettext("%(count)d run cancelled", "%(count)d runs cancelled", cancelled) % {
            "count": cancelled
        }
        if requested:
            head += ", " + ngettext(
                "%(count)d running run asked to stop",
                "%(count)d running runs asked to stop",
                requested,
            ) % {"count": requested}
        self._report(request, head, done, skipped)

    def _report(self, request: HttpRequest, head: str, done: int, skipped: Counter[str]) -> None:
        parts = [head]
        for reason, count in sorted(skipped.items()):
            parts.append(
                ngettext("%(count)d skipped: %(reason)s", "%(count)d skipped: %(reason)s", count)
                % {"count": count, "reason": reason}
            )
        level = messages.SUCCESS if not skipped else messages.WARNING if done else messages.ERROR
        self.message_user(request, ", ".join(parts) + ".", level)


def _apply(
    queryset: QuerySet[JobRun], operation: Callable[[JobRun], None]
) -> tuple[int, Counter[str]]:
    done, skipped = 0, Counter[str]()
    for run in queryset.order_by("queued_at"):
        try:
            # Each run in its own transaction: one refusal must not undo the others, and each
            # new run's message is pushed when its own row commits.
            with transaction.atomic():
                operation(run)
        except OperationRefused as exc:
            skipped[str(exc.reason)] += 1
        except KumikoJobsError:
            skipped[gettext("cannot be enqueued (tenant or arguments no longer valid)")] += 1
        else:
            done += 1
    return done, skipped
