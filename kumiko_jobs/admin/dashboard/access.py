"""Who may open the dashboard pages: the one place that decides it.

* The operators' dashboard and the metrics endpoint: on the public schema's domain, users
  holding ``kumiko_jobs.view_all_tenants`` (every tenant's numbers; superusers hold it).
* A tenant's console: on a tenant's domain, whoever the run admin lets see that tenant's runs
  (its ``has_view_permission``, which decides the tenant's audience), for that tenant's
  schema only.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest

from ...core.audience import is_operator_request, sees_all_tenants, tenant_schema


def is_operator(request: HttpRequest) -> bool:
    """The operators' dashboard: the public schema's domain and ``view_all_tenants``, decided
    where the rest of the admin decides it (``core.audience``)."""
    return sees_all_tenants(request)


def console_schema(request: HttpRequest, run_admin: Any) -> str | None:
    """The schema whose console this request may read, or None: a tenant's domain, and a user the
    run admin lets see that tenant's runs. Never the public schema, never a schema taken from
    the request's parameters."""
    if is_operator_request():
        return None
    schema = tenant_schema()
    if not schema or not run_admin.has_view_permission(request):
        return None
    return schema
