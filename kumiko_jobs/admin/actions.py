"""Retry and cancel runs: the selected runs of the run list (admin actions), and one run from its
own page (``act/retry/``, ``act/cancel/``, a POST that applies the same action to that run).

Who may: operators (``view_all_tenants``) holding ``change_jobrun``, on the public schema's
domain, on any tenant's runs; and on a tenant's domain that tenant's members holding
``kumiko_jobs.operate_tenant_runs`` (core/audience.py), on that tenant's runs only: the runs
come from the audience's queryset (``TenantScopedAdmin.get_queryset``: the domain's schema) and
are limited to that schema once more here, so a run id of another tenant posted to this domain
is not found, never acted on. A member is also refused the runs that stay the operators'
(admin/tenant_acts.py: a job declared ``tenant_operable=False``, a job no longer registered,
the retry of a run no member of the tenant cancelled); the run page shows why instead of the
button, and the list's actions skip them and count them. Every act goes through
kumiko_jobs/operations.py and records who asked (``by=``): an operator's username, or a tenant
member's with the tenant's schema (``alice (tenant t1)``), since a tenant's usernames are its
own and may be an operator's too.

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
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.db.models import QuerySet
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
)
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext, ngettext
from django.utils.translation import gettext_lazy as _

from .. import operations
from ..core.audience import (
    is_operator_request,
    operates_tenant_runs,
    sees_all_tenants,
    tenant_schema,
)
from ..core.exceptions import KumikoJobsError, OperationRefused
from ..history.transitions import CANCEL_BY_LIMIT
from ..models import WAITING_STATUSES, JobRun, RunStatus
from . import tenant_acts
from .pagination import selectable_rows, too_many_selected

# A run's page offers each act for the statuses it applies to (operations decides again).
_ACTS = {
    tenant_acts.RETRY: (
        "retry_selected",
        _("Retry this run"),
        frozenset(operations.RETRYABLE_STATUSES),
    ),
    tenant_acts.CANCEL: (
        "cancel_selected",
        _("Cancel this run"),
        frozenset((*WAITING_STATUSES, RunStatus.RUNNING)),
    ),
}


class RunActions(admin.ModelAdmin):  # type: ignore[type-arg]  # Django's admin classes are not subscriptable at runtime
    """Retry and cancel on the run list and a run's page, for operators holding the change
    permission and a tenant's members holding ``operate_tenant_runs``."""

    actions = ("retry_selected", "cancel_selected")

    def get_urls(self) -> list[URLPattern]:
        """The run admin's URLs plus a run's ``act/<retry|cancel>/``, behind the admin's login."""
        prefix = f"{self.opts.app_label}_{self.opts.model_name}"
        return [
            path(
                "<path:object_id>/act/<str:kind>/",
                self.admin_site.admin_view(self.act_view),
                name=f"{prefix}_act",
            ),
            *super().get_urls(),
        ]

    def act_view(self, request: HttpRequest, object_id: str, kind: str) -> HttpResponse:
        """A run page's button: the list's action on that one run (a POST), then back to its
        page. 403 for those who may not act; 404 for a run the audience cannot see (another
        tenant's on a tenant's domain), as for one that does not exist."""
        if kind not in _ACTS:
            raise Http404("A run's page acts with act/retry/ or act/cancel/.")
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not self.has_operate_permission(request):
            raise PermissionDenied
        run = self.get_object(request, unquote(object_id))
        if run is None:
            raise Http404("No such run.")
        action = getattr(self, _ACTS[kind][0])
        action(request, self.get_queryset(request).filter(pk=run.pk))
        name = f"{self.admin_site.name}:{self.opts.app_label}_{self.opts.model_name}_change"
        return HttpResponseRedirect(reverse(name, args=(object_id,)))

    def run_controls(self, request: HttpRequest, run: JobRun) -> list[dict[str, str]]:
        """The acts a run's page offers this request: each act that applies to the run's status,
        for those who may act; none for anyone else. An act a tenant's member may not take on
        this run (admin/tenant_acts.py) comes with ``refused``, the sentence the page shows
        instead of its button."""
        if not self.has_operate_permission(request):
            return []
        name = f"{self.admin_site.name}:{self.opts.app_label}_{self.opts.model_name}_act"
        controls = []
        for kind, (_action, label, statuses) in _ACTS.items():
            if run.status not in statuses:
                continue
            refused = member_refusal(kind, run)
            controls.append(
                {
                    "kind": kind,
                    "label": str(label),
                    "url": reverse(name, args=(run.pk, kind)),
                    "refused": str(refused.sentence) if refused else "",
                }
            )
        return controls

    @admin.display(empty_value="")
    def action_checkbox(self, obj: Any) -> SafeString:
        """Django's row checkbox, written as markup directly: rendering Django's widget through the
        template engine for every row costs a third of the list's time. No box on a tenant's
        domain for a run of a job its members may never act on (``tenant_acts.job_refusal``:
        the registry only, no SQL per row); the actions would skip it anyway.
        """
        if not is_operator_request() and tenant_acts.job_refusal(obj.job_name) is not None:
            return SafeString("")
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
        """Refuse an action on "select all" on a tenant's domain (every run a filter matches is
        the operators' bulk control), and for operators when more runs match than the list
        counts, rather than retry or cancel an unknown number of them.
        """
        # Every run a filter matches is the operators' bulk control (admin/bulk.py): a
        # tenant's member acts on the runs it ticked, at most a page's worth per request.
        across = self.selects_across(request)
        if across and not is_operator_request():
            self.message_user(
                request,
                gettext(
                    "Tick the runs to act on: acting on every run the filter matches is for "
                    "operators."
                ),
                messages.ERROR,
            )
            return None
        # "Select all" acts on every row the filters match, which the list no longer counts
        # beyond its pages: refuse rather than retry or cancel an unknown number of runs.
        if across and too_many_selected(queryset):
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

    def selects_across(self, request: HttpRequest) -> bool:
        """Whether this action's POST asks for "select all", read as Django's action form reads
        it (any value but ``""``, ``"0"`` and ``"false"``, so ``"2"`` and ``"true"`` are "select
        all" too, not ``"1"`` alone). A value the form refuses counts as "select all": refused
        here rather than acted on."""
        field = self.action_form.base_fields["select_across"]
        value = field.widget.value_from_datadict(request.POST, request.FILES, "select_across")
        try:
            return bool(field.clean(value))
        except ValidationError:
            return True

    def has_operate_permission(self, request: HttpRequest) -> bool:
        """Retry and cancel: operators (``view_all_tenants``) holding the (otherwise unused)
        change permission; on a tenant's domain its members holding ``operate_tenant_runs``."""
        if is_operator_request():
            return sees_all_tenants(request) and request.user.has_perm("kumiko_jobs.change_jobrun")
        return operates_tenant_runs(request)

    @admin.action(description=_("Retry selected failed runs"), permissions=["operate"])
    def retry_selected(self, request: HttpRequest, queryset: QuerySet[JobRun]) -> None:
        """Retry each selected failed run in its own transaction, and report how many were retried
        and how many skipped, by reason.
        """

        by = acting_user(request)

        def retry(run: JobRun) -> None:
            refuse_member(tenant_acts.RETRY, run)
            operations.retry_run(run, by=by)

        done, skipped = _apply(scoped(request, queryset), retry)
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
        by = acting_user(request)

        def cancel(run: JobRun) -> None:
            nonlocal requested
            refuse_member(tenant_acts.CANCEL, run)
            result = operations.cancel_run(run, by=by)
            if not result:
                raise OperationRefused(
                    f"Run {run.run_id} has finished.", reason=_("already finished")
                )
            requested += result == operations.CANCEL_REQUESTED

        done, skipped = _apply(scoped(request, queryset), cancel)
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


def scoped(request: HttpRequest, queryset: QuerySet[JobRun]) -> QuerySet[JobRun]:
    """The runs an act may reach: any for an operator, on a tenant's domain that tenant's only
    (the list's queryset is already so; this holds should a caller pass another)."""
    if is_operator_request():
        return queryset
    schema = tenant_schema()
    return queryset.filter(schema_name=schema) if schema else queryset.none()


def acting_user(request: HttpRequest) -> Any:
    """Who the history records as having acted (operations' ``by=``): the operator's user, or a
    tenant member's username with the tenant's schema, which says on whose domain and with
    whose users it was signed in (a tenant's ``admin`` is not the operators' ``admin``)."""
    if is_operator_request():
        return request.user
    return tenant_acts.member_label(
        operations.actor(request.user), tenant_schema(), CANCEL_BY_LIMIT
    )


def member_refusal(kind: str, run: JobRun) -> tenant_acts.Refusal | None:
    """Why a tenant's member may not ``kind`` this run (None: it may, or the request is an
    operator's, whom tenant_acts never refuses)."""
    if is_operator_request():
        return None
    return tenant_acts.refusal(run, kind, tenant_schema())


def refuse_member(kind: str, run: JobRun) -> None:
    """``OperationRefused`` with the list's reason when a tenant's member may not ``kind`` this
    run: the action skips it and counts it, as it does a finished run."""
    refused = member_refusal(kind, run)
    if refused is not None:
        raise OperationRefused(
            f"Run {run.run_id}: a tenant's member may not {kind} it ({refused.reason}).",
            reason=refused.reason,
        )


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
