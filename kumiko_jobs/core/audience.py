"""Who a web request is for: operators (the public schema's domain) or one tenant.

Decided from ``connection.schema_name``, which django-tenants' middleware sets from the
request's host, never from the user: a tenant's superuser is still a tenant.
"""

from __future__ import annotations

from django.db import connection

from . import project_settings

# Operators holding this may use django-rq's queue pages (see kumiko_jobs.urls).
MANAGE_QUEUES = "kumiko_jobs.manage_queues"


def is_operator_request() -> bool:
    """True on the public schema's domain (operators), False on a tenant's domain."""
    return getattr(connection, "schema_name", project_settings.public_schema_name()) == (
        project_settings.public_schema_name()
    )


def tenant_schema() -> str:
    """The schema of the tenant this request is for (``""`` if the connection has none): what the
    admin limits a tenant's rows to.
    """
    return str(getattr(connection, "schema_name", ""))
