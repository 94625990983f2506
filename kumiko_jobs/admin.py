"""Run history in the Django admin: one site, two audiences.

On the public schema's domain the admin is the **operator** view: every tenant's runs with
payload, errors, tracebacks, attempts and log lines, and the actions retry, cancel and "run a
job". On a tenant's domain the same admin site shows the **tenant** view: only that tenant's
runs and failures, and only the fields a tenant may read (job, subject, status, times, and
failure messages rendered from their message keys through Django's i18n).

The audience is decided per request from ``connection.schema_name`` (set by django-tenants'
middleware), never from the user: a tenant superuser is still a tenant. Django's model
permissions govern access in both places; tenants' users and permissions live in their schema.
"""

from __future__ import annotations

import inspect
import json
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.utils import flatten_fieldsets
from django.contrib.admin.views.main import PAGE_VAR
from django.core.paginator import Page, Paginator
from django.db import connection, transaction
from django.db.models import OuterRef, Q, QuerySet, Subquery
from django.db.models.functions import Lower
from django.http import (
    HttpRequest,
    HttpResponse,
    HttpResponseBadRequest,
    HttpResponseRedirect,
    QueryDict,
)
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.formats import date_format
from django.utils.functional import cached_property
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.text import smart_split, unescape_string_literal
from django.utils.timezone import localtime, now
from django.utils.translation import gettext, ngettext
from django.utils.translation import gettext_lazy as _

from . import conf, operations
from .audience import is_operator_request, tenant_schema
from .exceptions import KumikoJobsError
from .models import EscapeHatchUse, JobAttempt, JobFailure, JobRun, RejectedMessage, RunStatus
from .registry import JobDefinition, registry

# --- shared rendering -------------------------------------------------------------------------

# Text on a coloured background; chosen for contrast on both light and dark admin themes.
_BADGE_COLOURS: dict[str, str] = {
    RunStatus.QUEUED: "#57606a",
    RunStatus.RUNNING: "#0969da",
    RunStatus.DEFERRED: "#9a6700",
    RunStatus.SUCCEEDED: "#1a7f37",
    RunStatus.FAILED: "#cf222e",
    RunStatus.CANCELLED: "#6e7781",
    RunStatus.SKIPPED: "#8c959f",
    RunStatus.CAPPED: "#bc4c00",
}


def status_badge(status: str) -> SafeString:
    label = RunStatus(status).label if status in RunStatus.values else status
    return format_html(
        '<span class="kj-status kj-status-{}" style="background:{};color:#fff;'
        'border-radius:9px;padding:1px 8px;font-size:0.85em;white-space:nowrap">{}</span>',
        status,
        _BADGE_COLOURS.get(status, "#57606a"),
        label,
    )


def human_duration(ms: float | None) -> str:
    if ms is None:
        return "—"
    if ms < 1000:
        return f"{ms:.0f} ms"
    seconds = ms / 1000
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {rest} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min"


def short_time(value: datetime | None) -> str:
    """A compact local date and time for list columns (the detail page shows the long form)."""
    if value is None:
        return "—"
    return date_format(localtime(value), "SHORT_DATETIME_FORMAT")


def subject_html(subject: str) -> SafeString | str:
    # Short subjects (invoice_id=7) read best unbroken; long ones may wrap.
    if not subject:
        return "—"
    if len(subject) > 40:
        return subject
    return format_html('<span style="white-space:nowrap">{}</span>', subject)


def job_title(job_name: str) -> str:
    """What a tenant reads for a job: the first line of its description, else its name."""
    definition = registry.get(job_name) if job_name in registry else None
    description = definition.description.strip() if definition else ""
    if not description:
        return job_name
    # Projects may translate their job descriptions; untranslated text passes unchanged.
    return gettext(description.splitlines()[0])


def failure_sentence(message_key: str | None) -> str:
    """A failure's message key as a sentence in the request's language.

    The key is the msgid (``billing.sync_failed``); a key the project has not translated is
    shown as it is, which is still safe: keys are chosen by developers, never error text.
    """
    if not message_key:
        return ""
    return gettext(message_key)


# Inline styles, because a reusable app's templates cannot rely on the project's CSS pipeline.
_PRE_STYLE = "white-space:pre-wrap;max-height:32em;overflow:auto;margin:0;font-size:0.85em"


def pretty_json(value: Any) -> SafeString:
    text = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)
    return format_html('<pre class="kj-pre" style="{}">{}</pre>', _PRE_STYLE, text)


def pre(text: str) -> SafeString | str:
    if not text:
        return "—"
    return format_html('<pre class="kj-pre" style="{}">{}</pre>', _PRE_STYLE, text)


def log_table(lines: Sequence[dict[str, Any]]) -> SafeString | str:
    if not lines:
        return "—"

    def row(line: dict[str, Any]) -> tuple[str, str, str, str]:
        stamp = line.get("t")
        when = (
            datetime.fromtimestamp(stamp, tz=UTC).strftime("%H:%M:%S.%f")[:-3]
            if isinstance(stamp, int | float)
            else ""
        )
        data = line.get("data") or {}
        return (
            when,
            str(line.get("level", "")),
            str(line.get("msg", "")),
            json.dumps(data, ensure_ascii=False, default=str) if data else "",
        )

    body = format_html_join(
        "", "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>", (row(line) for line in lines)
    )
    return format_html(
        '<table class="kj-log"><thead><tr><th>{}</th><th>{}</th><th>{}</th><th>{}</th></tr>'
        "</thead><tbody>{}</tbody></table>",
        _("time (UTC)"),
        _("level"),
        _("message"),
        _("data"),
        body,
    )


# --- list filters -----------------------------------------------------------------------------


def run_job_names(schema: str | None = None) -> list[str]:
    """The distinct job names in the run history (of ``schema`` only, when given).

    A ``SELECT DISTINCT`` would read every row (millions); this walks the job-name index
    instead, one probe per name (a "loose index scan": the next name after the last one), and,
    for a tenant, keeps the names with one of its runs (one probe each on (job, tenant)).
    """
    table = connection.ops.quote_name(JobRun._meta.db_table)
    statement = f"""
        WITH RECURSIVE names(job_name) AS (
            (SELECT job_name FROM {table} ORDER BY job_name LIMIT 1)
            UNION ALL
            SELECT (SELECT r.job_name FROM {table} r WHERE r.job_name > names.job_name
                    ORDER BY r.job_name LIMIT 1)
            FROM names WHERE names.job_name IS NOT NULL
        )
        SELECT job_name FROM names WHERE job_name IS NOT NULL"""
    params: list[str] = []
    if schema is not None:
        statement += (
            f" AND EXISTS (SELECT 1 FROM {table} r"
            " WHERE r.job_name = names.job_name AND r.schema_name = %s)"
        )
        params.append(schema)
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return [str(name) for (name,) in cursor.fetchall()]


class JobFilter(admin.SimpleListFilter):
    """Jobs present in the rows this admin may show (so a tenant never sees others' jobs)."""

    title = _("job")
    parameter_name = "job"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        operator = is_operator_request()
        if model_admin.model is JobRun:
            names = run_job_names(None if operator else tenant_schema())
        else:
            names = list(
                model_admin.get_queryset(request)
                .order_by("job_name")
                .values_list("job_name", flat=True)
                .distinct()
            )
        return [(name, name if operator else job_title(name)) for name in names]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        return queryset.filter(job_name=value) if value else queryset


class TenantFilter(admin.SimpleListFilter):
    """Tenants by schema name (operators only), from the project's tenant model.

    Up to ``MAX_CHOICES`` tenants are listed as links; beyond, the filter is a text input for
    the schema name (10,000 links would make the page heavy and the list useless), and only
    the chosen tenant and "system" are links.
    """

    title = _("tenant")
    parameter_name = "tenant"
    template = "admin/kumiko_jobs/tenant_filter.html"
    SYSTEM = "-"
    MAX_CHOICES = 100

    as_input = False
    hidden_fields: list[tuple[str, str]] = []

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        from django_tenants.utils import get_tenant_model

        tenants = list(
            get_tenant_model()
            .objects.exclude(schema_name=conf.public_schema_name())
            .order_by("schema_name")[: self.MAX_CHOICES + 1]
        )
        system = (self.SYSTEM, gettext("system (no tenant)"))
        self.as_input = len(tenants) > self.MAX_CHOICES
        if self.as_input:
            value = self.value()
            return [(value, value), system] if value and value != self.SYSTEM else [system]
        return [*((t.schema_name, f"{t.schema_name} ({t})") for t in tenants), system]

    def choices(self, changelist: Any) -> Any:
        # The input's form keeps the other filters and the search (a GET form sends only its
        # own fields), and starts again at the first page.
        query = changelist.get_query_string(remove=[self.parameter_name, PAGE_VAR])
        self.hidden_fields = [
            (name, value)
            for name, values in QueryDict(query.lstrip("?")).lists()
            for value in values
        ]
        yield from super().choices(changelist)

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if not value:
            return queryset
        return queryset.filter(schema_name="" if value == self.SYSTEM else value)


# --- lists of millions of rows ----------------------------------------------------------------

# The run lists offer this many pages at most: the newest runs; older ones are found by filter
# or search (a page 20,000 deep would mean skipping a million rows on every request).
MAX_PAGES = 200
# ... and count rows only this many pages beyond the one shown: a count reads every row it
# counts, and a filter no index fully answers (a busy tenant's search) makes that row by row.
LOOKAHEAD_PAGES = 5


class BoundedPaginator(Paginator):
    """Pages of a list that may hold millions of rows, without counting them all.

    ``count`` stops at ``LOOKAHEAD_PAGES`` pages beyond the page asked for (``page_hint``), and
    never beyond ``MAX_PAGES`` (``COUNT`` over a ``LIMIT``ed subquery, which an index answers);
    ``capped`` says there are more. A page is read in
    two steps: the primary keys of its rows (the ``OFFSET`` is skipped in an index-only scan
    of the list's order), then those rows with their columns and annotations, so the rows
    skipped over are never read from the table.
    """

    def __init__(
        self,
        object_list: Any,
        per_page: int | str,
        orphans: int = 0,
        allow_empty_first_page: bool = True,
        page_hint: int = 1,
    ) -> None:
        super().__init__(object_list, per_page, orphans, allow_empty_first_page)
        pages = min(MAX_PAGES, max(page_hint, 1) + LOOKAHEAD_PAGES)
        self.limit = pages * int(per_page)
        self.capped = False

    object_list: QuerySet[Any]

    @cached_property
    def count(self) -> int:
        # In the list's order, like the page itself: the planner then reads the same index the
        # page does and stops at the limit; unordered, it may pick a scan of the whole table
        # for a filter it cannot estimate (a busy tenant's search for a short value: 5 s).
        found = int(self.object_list.values("pk")[: self.limit + 1].count())
        self.capped = found > self.limit
        return min(found, self.limit)

    def page(self, number: Any) -> Page:
        number = self.validate_number(number)
        bottom = (number - 1) * self.per_page
        top = bottom + self.per_page
        if top + self.orphans >= self.count:
            top = self.count
        keys = list(self.object_list.values_list("pk", flat=True)[bottom:top])
        rows = list(self.object_list.filter(pk__in=keys))
        return self._get_page(rows, number, self)  # type: ignore[attr-defined]


def search_words(search_term: str) -> list[str]:
    """The words of a search, as Django's admin splits them (quotes keep spaces)."""
    words = []
    for word in smart_split(search_term):
        if word.startswith(('"', "'")) and word[0] == word[-1]:
            word = unescape_string_literal(word)
        if word:
            words.append(word)
    return words


def subject_contains(word: str) -> Q:
    """Subjects containing ``word`` (any case), written so that the trigram index is asked
    only for the selective part of it. Needs ``kj_subject_lower`` (``Lower("subject")``).

    Subjects are ``field=value`` pairs; the field names are in every run of a job, so their
    trigrams are in millions of rows, and a trigram search for ``invoice_id=445196`` reads
    all of those posting lists (1.2 s at 10 million runs) where ``445196`` alone takes 20 ms.
    So for a word with ``=``, the index is asked for the value after the last ``=`` (when it
    has three characters or more: a trigram's length) and the whole word is checked on the
    rows it returns through ``LOWER(subject)``, which the index does not cover, so the planner
    keeps it as a filter. A shorter value is no use to the index: the filter alone then, and
    the list's own order finds the matches (short values match many rows). Other words: the
    index on the whole word.
    """
    whole = Q(kj_subject_lower__contains=word.lower())
    if "=" not in word:
        return Q(subject__icontains=word)
    value = word.rsplit("=", 1)[1]
    if len(value) < 3:
        return whole
    return Q(subject__icontains=value) & whole


def too_many_selected(queryset: QuerySet[Any]) -> bool:
    """Whether "select all" would act on more rows than the list can show."""
    return bool(queryset.order_by().values("pk")[: MAX_PAGES * 50 + 1].count() > MAX_PAGES * 50)


# Longer filter or search values than any job name, subject or reason: refused before they cost
# a query (a 200 KB search term would otherwise run as LIKE patterns over every row).
MAX_QUERY_VALUE = 1000


def bad_query_string(params: Any) -> str:
    """Why a changelist query string cannot be served, or ``""`` if it can.

    PostgreSQL refuses text with NUL characters, and the driver raises on them *after* the
    admin has validated the lookups: without this, ``?job=%00`` or ``?q=%00`` is a 500 (and on
    a debug server a page of settings). Refused as a whole, whatever parameter carries it.
    """
    for key, values in params.lists():
        for text in (key, *values):
            if "\x00" in text:
                return gettext("Query parameters cannot contain NUL characters.")
            if len(text) > MAX_QUERY_VALUE:
                return gettext("A query parameter is longer than %(max)d characters.") % {
                    "max": MAX_QUERY_VALUE
                }
    return ""


class CleanQueryStrings:
    """Changelists answer a malformed query string with 400 Bad Request, never a 500."""

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        problem = bad_query_string(request.GET)
        if problem:
            return HttpResponseBadRequest(problem, content_type="text/plain; charset=utf-8")
        return super().changelist_view(request, extra_context)  # type: ignore[misc]


class ReadOnly:
    """Rows written by the runner, never by hand; the retention sweep is what deletes them."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class OperatorsOnly:
    """Shown on the public (operator) domain only, never on a tenant's."""

    def has_module_permission(self, request: HttpRequest) -> bool:
        return is_operator_request() and super().has_module_permission(request)  # type: ignore[misc]

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return is_operator_request() and super().has_view_permission(request, obj)  # type: ignore[misc]


class TenantScopedAdmin(CleanQueryStrings, ReadOnly, admin.ModelAdmin):
    """Read-only history: rows are written by the runner, never by hand.

    Subclasses describe both audiences; the methods below pick one per request.
    """

    # Only these changelist query parameters are honoured on a tenant's domain. Django allows
    # any lookup on a local field by default (``?payload__secret=...``), which would let a
    # tenant probe fields it cannot see by watching the row count change.
    tenant_lookups: frozenset[str] = frozenset()
    tenant_list_display: tuple[Any, ...] = ()
    tenant_list_filter: tuple[Any, ...] = ()
    tenant_search_fields: tuple[str, ...] = ()
    tenant_fieldsets: Any = ()
    tenant_only: tuple[str, ...] = ()
    operator_list_display: tuple[Any, ...] = ()
    operator_list_filter: tuple[Any, ...] = ()
    operator_search_fields: tuple[str, ...] = ()
    operator_fieldsets: Any = ()

    show_full_result_count = False  # the history is large; skip the second COUNT(*)
    paginator = BoundedPaginator  # and count the first only as far as the pages go
    # Sortable by time only: each other column would sort millions of rows per page.
    sortable_by = ("queued", "failed")
    empty_value_display = "—"

    def get_paginator(
        self,
        request: HttpRequest,
        queryset: QuerySet[Any],
        per_page: int,
        orphans: int = 0,
        allow_empty_first_page: bool = True,
    ) -> BoundedPaginator:
        try:
            page = int(request.GET.get(PAGE_VAR, 1))
        except ValueError:
            page = 1
        return BoundedPaginator(queryset, per_page, orphans, allow_empty_first_page, page)

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        queryset = super().get_queryset(request)
        if is_operator_request():
            return queryset
        queryset = queryset.filter(schema_name=tenant_schema())
        # Load only what the tenant view renders: payloads can be large and are not theirs.
        return queryset.only(*self.tenant_only) if self.tenant_only else queryset

    def get_list_display(self, request: HttpRequest) -> tuple[Any, ...]:
        if is_operator_request():
            return self.operator_list_display
        return self.tenant_list_display

    def get_list_display_links(
        self, request: HttpRequest, list_display: Sequence[Any]
    ) -> tuple[Any, ...]:
        return tuple(list_display[:1])

    def get_list_filter(self, request: HttpRequest) -> tuple[Any, ...]:
        if is_operator_request():
            return self.operator_list_filter
        return self.tenant_list_filter

    def get_search_fields(self, request: HttpRequest) -> tuple[str, ...]:
        if is_operator_request():
            return self.operator_search_fields
        return self.tenant_search_fields

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        if is_operator_request():
            return self.operator_fieldsets
        return self.tenant_fieldsets

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        return tuple(flatten_fieldsets(self.get_fieldsets(request, obj)))

    def lookup_allowed(self, lookup: str, value: str, request: HttpRequest) -> bool:
        if is_operator_request():
            return bool(super().lookup_allowed(lookup, value, request))
        return lookup in self.tenant_lookups


# --- JobRun -----------------------------------------------------------------------------------


class JobAttemptInline(ReadOnly, admin.StackedInline):
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
        return is_operator_request() and super().has_view_permission(request, obj)

    @admin.display(description=_("duration"))
    def duration(self, attempt: JobAttempt) -> str:
        return human_duration(attempt.duration_ms)

    @admin.display(description=_("error"))
    def error(self, attempt: JobAttempt) -> str:
        if not attempt.error_type and not attempt.error_message:
            return "—"
        return f"{attempt.error_type}: {attempt.error_message}".strip(": ")

    @admin.display(description=_("traceback"))
    def traceback_block(self, attempt: JobAttempt) -> SafeString | str:
        return pre(attempt.traceback)

    @admin.display(description=_("log"))
    def log_lines(self, attempt: JobAttempt) -> SafeString | str:
        return log_table(attempt.log or [])


class RunDisplay:
    """Column and field renderers shared by the run list and detail pages."""

    @admin.display(description=_("job"), ordering="job_name")
    def job(self, run: JobRun) -> str:
        return run.job_name if is_operator_request() else job_title(run.job_name)

    @admin.display(description=_("tenant"), ordering="schema_name")
    def tenant(self, run: JobRun) -> SafeString | str:
        return run.schema_name or format_html("<em>{}</em>", gettext("system"))

    @admin.display(description=_("status"), ordering="status")
    def status_label(self, run: JobRun) -> SafeString:
        # A run waiting for a retry's back-off or an enqueue_in delay is "queued" (the same
        # word as in code and the CLI); the time says it is not due yet.
        if run.status == RunStatus.QUEUED and run.scheduled_for and run.scheduled_for > now():
            return format_html(
                '{} <span class="kj-until" style="font-size:0.85em;white-space:nowrap">{}</span>',
                status_badge(run.status),
                gettext("until %(time)s") % {"time": short_time(run.scheduled_for)},
            )
        return status_badge(run.status)

    @admin.display(description=_("attempts"))
    def attempts_of(self, run: JobRun) -> str:
        return f"{run.attempts}/{run.max_attempts}"

    @admin.display(description=_("duration"), ordering="duration_ms")
    def duration(self, run: JobRun) -> str:
        return human_duration(run.duration_ms)

    @admin.display(description=_("problem"))
    def problem(self, run: JobRun) -> str:
        return failure_sentence(getattr(run, "failure_key", None)) or "—"

    @admin.display(description=_("status"), ordering="status")
    def status_and_problem(self, run: JobRun) -> SafeString:
        # One column for both keeps the tenant's list narrow enough to read beside the filters.
        sentence = failure_sentence(getattr(run, "failure_key", None))
        if not sentence:
            return status_badge(run.status)
        return format_html(
            '{}<div class="kj-problem" style="margin-top:4px">{}</div>',
            status_badge(run.status),
            sentence,
        )

    @admin.display(description=_("payload"))
    def payload_block(self, run: JobRun) -> SafeString:
        return pretty_json(run.payload)

    @admin.display(description=_("result"))
    def result_block(self, run: JobRun) -> SafeString | str:
        # Operators only (not in the tenant's fieldsets): what the job returned, or the marker
        # saying why it was not kept (kumiko_jobs.results).
        if run.result is None:
            return "—"
        return pretty_json(run.result)

    @admin.display(description=_("error"))
    def error_block(self, run: JobRun) -> SafeString | str:
        if not run.error_type and not run.error_message:
            return "—"
        return pre(f"{run.error_type}: {run.error_message}".strip(": "))

    @admin.display(description=_("run id"))
    def run_ref(self, run: JobRun) -> str:
        return str(run.run_id)

    @admin.display(description=_("subject"), ordering="subject")
    def subject_cell(self, run: JobRun) -> SafeString | str:
        return subject_html(run.subject)

    @admin.display(description=_("queued"), ordering="queued_at")
    def queued(self, run: JobRun) -> str:
        return short_time(run.queued_at)

    @admin.display(description=_("finished"), ordering="finished_at")
    def finished(self, run: JobRun) -> str:
        return short_time(run.finished_at)

    @admin.display(description=_("finished"), ordering="finished_at")
    def finished_with_duration(self, run: JobRun) -> SafeString | str:
        # The duration under the time, so the tenant's list needs one column less.
        if run.finished_at is None:
            return "—"
        return format_html(
            '{}<div class="kj-duration" style="opacity:0.7">{}</div>',
            short_time(run.finished_at),
            human_duration(run.duration_ms),
        )


_TENANT_RUN_FIELDS = (
    "job",
    "subject",
    "status_label",
    "problem",
    "queued_at",
    "started_at",
    "finished_at",
    "duration",
)


@admin.register(JobRun)
class JobRunAdmin(RunDisplay, TenantScopedAdmin):
    change_list_template = "admin/kumiko_jobs/jobrun/change_list.html"
    list_per_page = 50
    ordering = ("-queued_at",)

    operator_list_display = (
        "job",
        "tenant",
        "subject_cell",
        "status_label",
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
    )
    actions = ("retry_selected", "cancel_selected")

    def get_queryset(self, request: HttpRequest) -> QuerySet[JobRun]:
        # The tenant-visible failure of a run, for the "problem" column; correlated on the
        # unique (tenant, job, subject) key so each row costs one index probe.
        failure = JobFailure.objects.filter(
            schema_name=OuterRef("schema_name"),
            job_name=OuterRef("job_name"),
            subject=OuterRef("subject"),
            run_id=OuterRef("run_id"),
        ).values("message_key")[:1]
        return super().get_queryset(request).annotate(failure_key=Subquery(failure))

    def action_checkbox(self, obj: Any) -> SafeString:
        # The same markup as Django's, written directly: Django renders a form widget through
        # the template engine for each row, a third of the list's rendering time.
        return format_html(
            '<input type="checkbox" name="{}" value="{}" class="action-select" aria-label="{}">',
            ACTION_CHECKBOX_NAME,
            obj.pk,
            format_html(gettext("Select this object for an action - {}"), str(obj)),
        )

    def get_inlines(
        self, request: HttpRequest, obj: Any
    ) -> list[type[admin.options.InlineModelAdmin]]:
        return [JobAttemptInline] if is_operator_request() else []

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[JobRun], search_term: str
    ) -> tuple[QuerySet[JobRun], bool]:
        if not is_operator_request():
            # Subjects only (tenant_search_fields), each word as subject_contains() reads it.
            queryset = queryset.alias(kj_subject_lower=Lower("subject"))
            for word in search_words(search_term):
                queryset = queryset.filter(subject_contains(word))
            return queryset, False
        # Run ids are pasted from logs with or without dashes: match them exactly (the
        # primary key index) rather than as text; a generated correlation id has the same
        # shape (32 hex digits), so it is looked up too (its own index).
        term = search_term.strip()
        try:
            run_id = uuid.UUID(term)
        except ValueError:
            pass
        else:
            return queryset.filter(Q(pk=run_id) | Q(correlation_id=term)), False
        # Each word must match the subject (substring: the trigram index), the job name
        # (substring of one of the few names, then an index lookup of those) or the
        # correlation id (exactly: its index). Django's own search would put the job name and
        # the correlation id under UPPER(...) LIKE, which no index answers.
        names: list[str] | None = None
        queryset = queryset.alias(kj_subject_lower=Lower("subject"))
        for word in search_words(search_term):
            if names is None:
                names = run_job_names()
            matching = [n for n in names if word.casefold() in n.casefold()]
            queryset = queryset.filter(
                subject_contains(word) | Q(correlation_id=word) | Q(job_name__in=matching)
            )
        return queryset, False

    def response_action(  # Django 6.1 passes action_location, 5.2 does not
        self, request: HttpRequest, queryset: QuerySet[Any], *args: Any, **kwargs: Any
    ) -> HttpResponse | None:
        # "Select all" acts on every row the filters match, which the list no longer counts
        # beyond its pages: refuse rather than retry or cancel an unknown number of runs.
        if request.POST.get("select_across") == "1" and too_many_selected(queryset):
            self.message_user(
                request,
                gettext(
                    "More than %(count)d runs match: filter the list to fewer before "
                    "applying an action to all of them."
                )
                % {"count": MAX_PAGES * 50},
                messages.ERROR,
            )
            return None
        return super().response_action(request, queryset, *args, **kwargs)

    # --- operator actions -----------------------------------------------------------------

    def has_operate_permission(self, request: HttpRequest) -> bool:
        """Retry and cancel: operators holding the (otherwise unused) change permission."""
        return is_operator_request() and request.user.has_perm("kumiko_jobs.change_jobrun")

    def has_run_job_permission(self, request: HttpRequest) -> bool:
        """Run a manual job: operators holding the (otherwise unused) add permission."""
        return is_operator_request() and request.user.has_perm("kumiko_jobs.add_jobrun")

    @admin.action(description=_("Retry selected failed runs"), permissions=["operate"])
    def retry_selected(self, request: HttpRequest, queryset: QuerySet[JobRun]) -> None:
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
        # Waiting runs are cancelled at once; running ones are asked to stop (the job sees it
        # through ctx.cancel_requested; docs/reliability.md, Cancellation).
        requested = 0

        def cancel(run: JobRun) -> None:
            nonlocal requested
            result = operations.cancel_run(run, by=request.user)
            if not result:
                raise operations.OperationRefused(
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

    # --- "Run a job…" ---------------------------------------------------------------------

    def get_urls(self) -> list[URLPattern]:
        info = self.opts.app_label, self.opts.model_name
        return [
            path(
                "run-job/",
                self.admin_site.admin_view(self.run_job_view),
                name="{}_{}_run_job".format(*info),
            ),
            *super().get_urls(),
        ]

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        extra_context = dict(extra_context or {})
        if not is_operator_request():
            # The page's subtitle defaults to str(run), which is written for operators (raw
            # status, schema name); a tenant reads the job's title and the translated status.
            run = self.get_object(request, object_id)
            if run is not None:
                status = RunStatus(run.status).label if run.status in RunStatus.values else ""
                parts = [job_title(run.job_name), run.subject, str(status)]
                extra_context["subtitle"] = " · ".join(p for p in parts if p)
        return super().change_view(request, object_id, form_url, extra_context)

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        extra_context = dict(extra_context or {})
        if self.has_run_job_permission(request):
            extra_context["kumiko_run_job_url"] = reverse(
                f"{self.admin_site.name}:kumiko_jobs_jobrun_run_job"
            )
        if is_operator_request() and request.method == "GET":
            self._warn_if_scheduler_missing(request)
        return super().changelist_view(request, extra_context)

    def _warn_if_scheduler_missing(self, request: HttpRequest) -> None:
        """A banner on the operators' run list when delayed work is overdue (no scheduler):
        otherwise retries and enqueue_in runs just sit in "queued" and nothing says why."""
        from .scheduler_liveness import overdue_problem

        problem = overdue_problem()
        if problem:
            messages.warning(request, gettext("Scheduler: %(problem)s") % {"problem": problem})

    def run_job_view(self, request: HttpRequest) -> HttpResponse:
        from django.core.exceptions import PermissionDenied

        if not self.has_run_job_permission(request):
            raise PermissionDenied
        form = RunJobForm(request.POST or None)
        if request.method == "POST" and form.is_valid():
            try:
                # One transaction: an error after the history row was written leaves neither
                # the row nor (the push waits for commit) a queue message.
                with transaction.atomic():
                    handle = operations.enqueue_manual(
                        form.cleaned_data["definition"],
                        form.cleaned_data["tenant"] or None,
                        form.cleaned_data["arguments"],
                        by=request.user,
                    )
            except KumikoJobsError as exc:
                form.add_error(None, str(exc))
            else:
                url = reverse(
                    f"{self.admin_site.name}:kumiko_jobs_jobrun_change",
                    args=[uuid.UUID(handle.run_id)],
                )
                self.message_user(
                    request,
                    format_html(
                        gettext("Queued {job} for {tenant}: run {run}."),
                        job=handle.job_name,
                        tenant=handle.schema_name or gettext("system"),
                        run=format_html('<a href="{}">{}</a>', url, handle.run_id),
                    ),
                    messages.SUCCESS,
                )
                return HttpResponseRedirect(url)
        context = {
            **self.admin_site.each_context(request),
            "title": gettext("Run a job"),
            "opts": self.opts,
            "form": form,
            "manual_jobs": _manual_job_rows(),
            "has_view_permission": self.has_view_permission(request),
        }
        return TemplateResponse(request, "admin/kumiko_jobs/jobrun/run_job.html", context)


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
        except operations.OperationRefused as exc:
            skipped[str(exc.reason)] += 1
        except KumikoJobsError:
            skipped[gettext("cannot be enqueued (tenant or arguments no longer valid)")] += 1
        else:
            done += 1
    return done, skipped


def manual_jobs() -> list[JobDefinition]:
    return [d for d in registry if d.manual]


def _signature(definition: JobDefinition) -> str:
    """``invoice_id: int, fail_times: int = 0``, from annotations that may be strings."""
    parts = []
    for param in list(inspect.signature(definition.func).parameters.values())[1:]:
        text = param.name
        if param.annotation is not param.empty:
            annotation = param.annotation
            text += f": {annotation if isinstance(annotation, str) else annotation.__name__}"
        if param.default is not param.empty:
            text += f" = {param.default!r}"
        parts.append(text)
    return ", ".join(parts)


def _manual_job_rows() -> list[dict[str, Any]]:
    # Plain dicts: templates call callables, and a JobDefinition is callable.
    return [
        {
            "name": d.name,
            "system": d.system,
            "description": d.description,
            "signature": _signature(d),
        }
        for d in manual_jobs()
    ]


class RunJobForm(forms.Form):
    job = forms.ChoiceField(label=_("Job"))
    tenant = forms.ChoiceField(
        label=_("Tenant"), required=False, help_text=_("Leave empty for a system job.")
    )
    arguments = forms.CharField(
        label=_("Arguments"),
        required=False,
        initial="{}",
        widget=forms.Textarea(attrs={"rows": 6, "cols": 60, "spellcheck": "false"}),
        help_text=_('A JSON object of the job\'s keyword arguments, e.g. {"invoice_id": 7}.'),
    )

    def __init__(self, *args: Any, **kwargs: Any):
        from django_tenants.utils import get_tenant_model

        super().__init__(*args, **kwargs)
        job_field = self.fields["job"]
        assert isinstance(job_field, forms.ChoiceField)
        job_field.choices = [
            (d.name, f"{d.name} — {d.description}" if d.description else d.name)
            for d in manual_jobs()
        ]
        tenants = (
            get_tenant_model()
            .objects.exclude(schema_name=conf.public_schema_name())
            .order_by("schema_name")
        )
        tenant_field = self.fields["tenant"]
        assert isinstance(tenant_field, forms.ChoiceField)
        tenant_field.choices = [
            ("", "—"),
            *((t.schema_name, f"{t} ({t.schema_name})") for t in tenants),
        ]

    def clean_arguments(self) -> dict[str, Any]:
        text = (self.cleaned_data.get("arguments") or "").strip() or "{}"
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise forms.ValidationError(
                gettext("Not valid JSON: %(error)s") % {"error": exc}
            ) from None
        except RecursionError:
            # json.loads recurses once per nesting level; thousands of levels exhaust the stack
            # before enqueue's own MAX_ARGUMENT_DEPTH check could give its clearer message.
            raise forms.ValidationError(
                gettext("The arguments are nested too deeply; pass ids, not deep structures.")
            ) from None
        if not isinstance(value, dict):
            raise forms.ValidationError(
                gettext('Arguments must be a JSON object, e.g. {"invoice_id": 7}.')
            )
        return value

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        name = data.get("job")
        if not name or name not in registry:
            return data
        definition = registry.get(name)
        data["definition"] = definition
        if definition.system and data.get("tenant"):
            self.add_error("tenant", gettext("A system job runs for no tenant; leave it empty."))
        elif not definition.system and not data.get("tenant"):
            self.add_error("tenant", gettext("Choose the tenant this job runs for."))
        arguments = data.get("arguments")
        if isinstance(arguments, dict):
            try:
                definition.bind_arguments(arguments)
            except KumikoJobsError as exc:
                self.add_error("arguments", str(exc))
        return data


# --- JobFailure -------------------------------------------------------------------------------


@admin.register(JobFailure)
class JobFailureAdmin(TenantScopedAdmin):
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
        return job_title(failure.job_name)

    @admin.display(description=_("subject"), ordering="subject")
    def subject_cell(self, failure: JobFailure) -> SafeString | str:
        return subject_html(failure.subject)

    @admin.display(description=_("failed at"), ordering="failed_at")
    def failed(self, failure: JobFailure) -> str:
        return short_time(failure.failed_at)

    @admin.display(description=_("what went wrong"))
    def message(self, failure: JobFailure) -> str:
        return failure_sentence(failure.message_key)

    @admin.display(description=_("run"))
    def run_link(self, failure: JobFailure) -> SafeString:
        url = reverse(f"{self.admin_site.name}:kumiko_jobs_jobrun_change", args=[failure.run_id])
        return format_html('<a href="{}">{}</a>', url, gettext("view run"))


# --- RejectedMessage (operators only) ---------------------------------------------------------


@admin.register(RejectedMessage)
class RejectedMessageAdmin(CleanQueryStrings, OperatorsOnly, ReadOnly, admin.ModelAdmin):
    list_display = ("received_at", "queue", "rq_job_id", "reason")
    list_filter = ("queue", ("received_at", admin.DateFieldListFilter))
    search_fields = ("rq_job_id", "reason")
    fields = ("received_at", "queue", "rq_job_id", "reason", "excerpt_block")
    readonly_fields = fields
    ordering = ("-received_at",)
    show_full_result_count = False

    @admin.display(description=_("excerpt"))
    def excerpt_block(self, message: RejectedMessage) -> SafeString | str:
        return pre(message.excerpt)


# --- EscapeHatchUse (operators only) ----------------------------------------------------------


@admin.register(EscapeHatchUse)
class EscapeHatchUseAdmin(CleanQueryStrings, OperatorsOnly, ReadOnly, admin.ModelAdmin):
    """Every declared crossing of a tenant boundary that was used, with its reason."""

    list_display = ("job_name", "grant", "schema_name", "actor", "count", "last_seen", "reason")
    list_filter = ("grant", "job_name", "schema_name")
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
