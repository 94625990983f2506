"""The plugin's clean-up at the end of a test session: tenant logins closed, roles dropped.

With ``DB_ROLES`` on, saving a tenant in the test database creates its roles (three per tenant,
and two groups per database), and roles are server-wide: they outlive the test database, so
every session would leave its own behind. Whatever ``django_db_setup`` the project uses
(pytest-django's, or an override of its own that creates the tenants), the plugin:

* before the test database is dropped, closes this thread's pooled tenant logins (runs with
  real commits log in as the tenant's role, as on a worker): PostgreSQL refuses to drop a
  database that sessions are connected to;
* after, drops the roles of every test database of the session that no longer exists
  (``guard.roles.names.drop_roles_of_dropped_database``: only names of that database's prefix).
  A database kept for the next session (pytest-django's ``--reuse-db``) keeps its roles.
"""

from __future__ import annotations

import warnings
from collections.abc import Generator
from typing import Any

import psycopg
import pytest
from django.db import connections

from ..guard.roles import connections as tenant_connections
from ..guard.roles import names as role_names

TEST_DATABASES = pytest.StashKey[set[tuple[str, str]]]()
SETUP_FIXTURE = "django_db_setup"


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef: Any, request: Any) -> Generator[None, Any, Any]:
    """Note the test databases ``django_db_setup`` made; close tenant logins before it ends."""
    result = yield
    if fixturedef.argname == SETUP_FIXTURE:
        found = request.config.stash.setdefault(TEST_DATABASES, set())
        found.update(
            (alias, str(connections[alias].settings_dict["NAME"]))
            for alias in tenant_connections.tenant_aliases()
        )
        # A fixture's finalizers run last added first: this one runs before the fixture's
        # own teardown drops the database.
        fixturedef.addfinalizer(tenant_connections.close_all)
    return result


def pytest_fixture_post_finalizer(fixturedef: Any, request: Any) -> None:
    """After ``django_db_setup``'s teardown: the roles of the test databases that are gone."""
    if fixturedef.argname != SETUP_FIXTURE:
        return
    for alias, database in sorted(request.config.stash.get(TEST_DATABASES, set())):
        try:
            drop_roles_if_gone(alias, database)
        except psycopg.Error as exc:  # the session's results stand; say what is left behind
            warnings.warn(
                f"kumiko_jobs.testing could not drop the roles of test database {database!r} "
                f"({exc}); run `manage.py kumiko_jobs drop-roles --of-dropped-database "
                f"{database} --yes`",
                stacklevel=1,
            )


def drop_roles_if_gone(alias: str, database: str) -> list[str]:
    """Drop the roles of ``database`` when it no longer exists; returns the roles dropped."""
    # The driver itself, on the server's maintenance database: Django's connection names the
    # database that was just dropped, and pytest-django blocks it outside tests.
    params = connections[alias].get_connection_params()
    params["dbname"] = "postgres"
    with psycopg.connect(**params, autocommit=True) as conn, conn.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_database WHERE datname = %s", [database])
        if cursor.fetchone():
            return []  # kept for the next session (--reuse-db): its roles serve it
        return role_names.drop_roles_of_dropped_database(cursor, database)
