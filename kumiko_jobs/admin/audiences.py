"""Who sees what: read-only history, operator-only tables, and the two-audience base admin.

The request's domain picks the view (``audience.is_operator_request``: a tenant superuser on
its own domain is still a tenant) and the user must belong to it (core/audience.py): the
operators' view needs ``kumiko_jobs.view_all_tenants``, a tenant's view membership of that
tenant. Anyone else gets no kumiko page and no row, whatever model permissions they hold.
Acting on runs comes on top (admin/actions.py), and only on the rows this module's queryset
gives the request: a tenant's member reaches its own tenant's runs and no other's.
``TenantScopedAdmin`` picks per request between the operator's and the tenant's columns,
filters, search fields, fieldsets and lookups, and limits a tenant to its own rows; its lists
are counted by ``BoundedPaginator``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.contrib import admin
from django.contrib.admin.utils import flatten_fieldsets
from django.contrib.admin.views.main import PAGE_VAR
from django.db.models import QuerySet
from django.http import HttpRequest

from ..core.audience import (
    is_operator_request,
    is_tenant_member,
    sees_all_tenants,
    tenant_schema,
)
from .pagination import BoundedPaginator
from .query_strings import CleanQueryStrings


class ReadOnly:
    """Rows written by the runner, never by hand; the retention sweep is what deletes them."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Nobody adds history rows by hand: only a run writes them."""
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Nobody edits history rows: they record what happened, so they are shown read-only."""
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Nobody deletes history rows from the admin; the retention sweep does, by the configured
        age.
        """
        return False


def admitted(request: HttpRequest) -> bool:
    """The request's user belongs to the audience its domain serves: an operator holding
    ``view_all_tenants`` on the public schema's domain, a member of the tenant on a tenant's.
    Model permissions come on top of this, never instead of it."""
    return sees_all_tenants(request) if is_operator_request() else is_tenant_member(request)


class OperatorsOnly:
    """Shown to operators (``view_all_tenants``) on the public domain only, never on a tenant's."""

    def has_module_permission(self, request: HttpRequest) -> bool:
        """Hide the app's section from the index on a tenant's domain and from users without
        ``view_all_tenants``, whatever their other permissions.
        """
        return sees_all_tenants(request) and super().has_module_permission(request)  # type: ignore[misc]

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Refuse the pages on a tenant's domain, even to a tenant superuser with the model
        permission, and on the operators' domain to users without ``view_all_tenants``.
        """
        return sees_all_tenants(request) and super().has_view_permission(request, obj)  # type: ignore[misc]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        """No rows for anyone but an operator, should a view reach the queryset without asking
        for the permission first."""
        queryset: QuerySet[Any] = super().get_queryset(request)  # type: ignore[misc]
        return queryset if sees_all_tenants(request) else queryset.none()


class TenantScopedAdmin(CleanQueryStrings, ReadOnly, admin.ModelAdmin):  # type: ignore[type-arg]  # Django's admin classes are not subscriptable at runtime
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
        """A ``BoundedPaginator`` told which page is asked for, so it counts rows only as far as
        that page needs instead of the whole history.
        """
        page = self.page_asked(request)
        return BoundedPaginator(queryset, per_page, orphans, allow_empty_first_page, page)

    def page_asked(self, request: HttpRequest) -> int:
        """The list page the request asks for (1 when it names none or not a number), which
        decides how far the list counts and how many rows a search reads."""
        try:
            return int(request.GET.get(PAGE_VAR, 1))
        except ValueError:
            return 1

    def has_module_permission(self, request: HttpRequest) -> bool:
        """The app's section on the index only for the domain's own audience (``admitted``)."""
        return admitted(request) and super().has_module_permission(request)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """The model's view permission, and only for the domain's own audience: an operator
        holding ``view_all_tenants``, or a member of the domain's tenant."""
        return admitted(request) and super().has_view_permission(request, obj)

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        """All rows for operators; for a tenant's member only its own schema's rows, loading only
        the ``tenant_only`` fields its pages render (payloads can be large and are not the
        tenant's to read); none for anyone else.
        """
        queryset = super().get_queryset(request)
        if not admitted(request):
            # Every page asks for the permission first; this holds should one not.
            return queryset.none()
        if is_operator_request():
            return queryset
        queryset = queryset.filter(schema_name=tenant_schema())
        # Load only what the tenant view renders: payloads can be large and are not theirs.
        return queryset.only(*self.tenant_only) if self.tenant_only else queryset

    def get_list_display(self, request: HttpRequest) -> tuple[Any, ...]:
        """The list's columns for this request's audience (operator or tenant)."""
        if is_operator_request():
            return self.operator_list_display
        return self.tenant_list_display

    def get_list_display_links(
        self, request: HttpRequest, list_display: Sequence[Any]
    ) -> tuple[Any, ...]:
        """Link the first of the columns this request's audience gets, whichever that is (the
        operators' and the tenant's lists start with different columns).
        """
        return tuple(list_display[:1])

    def get_list_filter(self, request: HttpRequest) -> tuple[Any, ...]:
        """The sidebar filters for this request's audience."""
        if is_operator_request():
            return self.operator_list_filter
        return self.tenant_list_filter

    def get_search_fields(self, request: HttpRequest) -> tuple[str, ...]:
        """The searched fields for this request's audience: a tenant cannot search fields it cannot
        see.
        """
        if is_operator_request():
            return self.operator_search_fields
        return self.tenant_search_fields

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        """The detail page's fieldsets for this request's audience."""
        if is_operator_request():
            return self.operator_fieldsets
        return self.tenant_fieldsets

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        """Every shown field is read-only (the history is never edited), so the detail page renders
        values rather than form inputs.
        """
        return tuple(flatten_fieldsets(self.get_fieldsets(request, obj)))

    def lookup_allowed(self, lookup: str, value: str, request: HttpRequest) -> bool:
        """Operators get Django's rules; a tenant only the lookups in ``tenant_lookups``, so it
        cannot probe hidden fields (``?payload__secret=...``) by watching the row count change.
        """
        if is_operator_request():
            return bool(super().lookup_allowed(lookup, value, request))
        return lookup in self.tenant_lookups
