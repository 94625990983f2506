"""The history's list filters: job and tenant.

Both stay cheap on a history of millions of runs and a project of thousands of tenants
(docs/observability.md, "History at scale"), and a tenant's job filter lists only the jobs of
its own runs, never another tenant's.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.admin.views.main import PAGE_VAR
from django.db import connection
from django.db.models import QuerySet
from django.http import HttpRequest, QueryDict
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _
from django_tenants.utils import get_tenant_model

from ..core import project_settings
from ..core.audience import is_operator_request, tenant_schema
from ..models import JobFailure, JobRun
from .render import job_title


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


def failure_job_names(schema: str | None = None) -> list[str]:
    """The distinct job names in the failures (of ``schema`` only, when given).

    The same loose index scan as ``run_job_names``, one probe per name: for operators over
    ``kj_failure_job_recent`` (job_name first), for a tenant over the unique (schema_name,
    job_name, subject) index, whose names within one schema are in order, so each probe stays
    inside the tenant's own rows.
    """
    table = connection.ops.quote_name(JobFailure._meta.db_table)
    tenant = "" if schema is None else "schema_name = %s AND "
    first = "" if schema is None else "WHERE schema_name = %s "
    statement = f"""
        WITH RECURSIVE names(job_name) AS (
            (SELECT job_name FROM {table} {first}ORDER BY job_name LIMIT 1)
            UNION ALL
            SELECT (SELECT f.job_name FROM {table} f WHERE {tenant}f.job_name > names.job_name
                    ORDER BY f.job_name LIMIT 1)
            FROM names WHERE names.job_name IS NOT NULL
        )
        SELECT job_name FROM names WHERE job_name IS NOT NULL"""
    params: list[str] = [] if schema is None else [schema, schema]
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return [str(name) for (name,) in cursor.fetchall()]


class JobFilter(admin.SimpleListFilter):
    """Jobs present in the rows this admin may show (so a tenant never sees others' jobs)."""

    title = _("job")
    parameter_name = "job"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        """The job names in the rows this admin shows, through an index for runs and failures
        (never a ``SELECT DISTINCT`` over the table); dotted names for operators, titles for a
        tenant.
        """
        operator = is_operator_request()
        schema = None if operator else tenant_schema()
        if model_admin.model is JobRun:
            names = run_job_names(schema)
        elif model_admin.model is JobFailure:
            names = failure_job_names(schema)
        else:
            names = list(
                model_admin.get_queryset(request)
                .order_by("job_name")
                .values_list("job_name", flat=True)
                .distinct()
            )
        return [(name, name if operator else job_title(name)) for name in names]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        """The rows of the chosen job, or all of them when none is chosen."""
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
        """Up to ``MAX_CHOICES`` tenants plus "system" as links; beyond that the filter switches to
        a text input and lists only the chosen tenant and "system".
        """
        tenants = list(
            get_tenant_model()
            .objects.exclude(schema_name=project_settings.public_schema_name())
            .order_by("schema_name")[: self.MAX_CHOICES + 1]
        )
        system = (self.SYSTEM, gettext("system (no tenant)"))
        self.as_input = len(tenants) > self.MAX_CHOICES
        if self.as_input:
            value = self.value()
            return [(value, value), system] if value and value != self.SYSTEM else [system]
        return [*((t.schema_name, f"{t.schema_name} ({t})") for t in tenants), system]

    def choices(self, changelist: Any) -> Any:
        """Django's choices, after keeping the other filters and the search as hidden fields, so the
        text input's form does not drop them.
        """
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
        """The rows of the chosen tenant, or of no tenant for "system"."""
        value = self.value()
        if not value:
            return queryset
        return queryset.filter(schema_name="" if value == self.SYSTEM else value)
