"""The example project's test set-up, as a project using kumiko_jobs writes it.

Only kumiko's pytest plugin and pytest-django: nothing comes from this repository's own test
suite. Run it as ``python -m pytest example_project --ds example_project.settings`` (the
repository's pytest settings name its own suite's; a project of yours has its own).
"""

from __future__ import annotations

from typing import Any

import pytest

# The kumiko_jobs fixture, and the clean-up at the end of the session: with DB_ROLES on (this
# project's setting), saving a tenant creates its database roles, which are server-wide; the
# plugin drops them when the test database goes.
pytest_plugins = ["kumiko_jobs.testing"]

TENANTS = (("public", "Operator", "localhost"), ("t1", "Tenant T1", "t1.localhost"))


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup: None, django_db_blocker: Any) -> None:
    """pytest-django's test database, and the tenants the tests use, once per session (a
    tenant's schema is DDL and migrations, too slow to make per test)."""
    from example_project.customers.models import Client, Domain

    with django_db_blocker.unblock():
        for schema, name, domain in TENANTS:
            tenant = Client.objects.filter(schema_name=schema).first()
            if tenant is None:
                tenant = Client(schema_name=schema, name=name)
                tenant.save()  # creates and migrates the schema; with DB_ROLES, its roles
            Domain.objects.get_or_create(
                domain=domain, defaults={"tenant": tenant, "is_primary": True}
            )
