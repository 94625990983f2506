"""``manage.py kumiko_jobs drop-roles``: the roles ``DB_ROLES`` created for this database go,
through the real command line (a subprocess), and nobody else's.

Roles are cluster-wide and ``dropdb`` leaves them behind. The command drops only the roles of
this database's prefix (``guard.roles.names``), lists them without ``--yes``, and, with
``--of-dropped-database NAME``, drops those a database that is gone left behind. The test
drops the session's own tenant roles, then gives them back with ``kumiko_jobs roles`` (the
command line too), so the tests after it find them as before.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection

from kumiko_jobs.guard.roles import connections as tenant_connections
from kumiko_jobs.guard.roles import names as role_names
from tests.conftest import kumiko_jobs_command
from tests.guardapp.support import Observer

GONE = "kj_test_database_that_was_dropped"


@pytest.fixture(scope="module", autouse=True)
def _tenant_roles(django_db_setup: None, django_db_blocker: Any) -> None:
    """The session's tenants have roles only with KUMIKO_TEST_DB_ROLES=1 (the default): these
    tests need them in both modes (the plugin drops them at the end of the session)."""
    from kumiko_jobs.core import conf
    from kumiko_jobs.guard.roles import sync as role_sync

    if not conf.get().DB_ROLES:
        with django_db_blocker.unblock():
            role_sync.sync_all()


def manage(*args: str) -> subprocess.CompletedProcess[str]:
    return kumiko_jobs_command(*args)


def roles_of(observer: Observer, database: str) -> list[str]:
    rows = observer.rows(
        "SELECT rolname FROM pg_roles WHERE rolname LIKE %s ORDER BY rolname",
        [role_names.prefix_of(database) + r"\_%"],
    )
    return [row[0] for row in rows]


@pytest.fixture
def observer(live_db: None) -> Iterator[Observer]:
    seen = Observer()
    yield seen
    seen.close()


@pytest.fixture
def decoys(observer: Observer) -> Iterator[dict[str, list[str]]]:
    """Roles named like kumiko's of two other databases: one that is gone, one that is not
    ours (another suite's, another project's): only the first may ever be dropped, on request."""
    names = {
        "gone": [role_names.prefix_of(GONE) + s for s in ("_t1", "_t1_r", "_tenants")],
        "other": [role_names.prefix_of("kj_someone_elses_database") + "_t1"],
    }
    for role in [*names["gone"], *names["other"]]:
        observer.rows(f'CREATE ROLE "{role}" NOLOGIN')
    yield names
    for role in [*names["gone"], *names["other"]]:
        observer.rows(f'DROP ROLE IF EXISTS "{role}"')


def test_drop_roles_lists_then_drops_this_databases_roles_only(
    observer: Observer, decoys: dict[str, list[str]]
) -> None:
    database = str(connection.settings_dict["NAME"])
    ours = roles_of(observer, database)
    # 3 tenants x (role, reader, writer) and the two groups, made by the session's tenants
    assert len(ours) == 3 * 3 + 2, ours

    listed = manage("drop-roles")
    assert listed.returncode != 0  # without --yes: a list and an error naming the flag
    assert "pass --yes" in listed.stderr
    assert sorted(line.split(": ", 1)[1] for line in listed.stdout.splitlines()) == ours
    assert roles_of(observer, database) == ours

    tenant_connections.close_all()  # this process's tenant logins, about to lose their roles
    try:
        dropped = manage("drop-roles", "--yes")
        assert dropped.returncode == 0, dropped.stderr
        assert f"dropped {len(ours)} role(s)" in dropped.stdout
        assert roles_of(observer, database) == []
        assert roles_of(observer, GONE) == sorted(decoys["gone"])
        assert roles_of(observer, "kj_someone_elses_database") == decoys["other"]
        again = manage("drop-roles", "--yes")
        assert again.returncode == 0 and "no kumiko roles" in again.stdout
    finally:
        restored = manage("roles")
    assert restored.returncode == 0, restored.stderr
    assert roles_of(observer, database) == ours


def test_drop_roles_of_a_dropped_database(observer: Observer, decoys: dict[str, list[str]]) -> None:
    listed = manage("drop-roles", "--of-dropped-database", GONE)
    assert listed.returncode != 0 and "pass --yes" in listed.stderr
    assert sorted(line.split(": ", 1)[1] for line in listed.stdout.splitlines()) == sorted(
        decoys["gone"]
    )
    assert roles_of(observer, GONE) == sorted(decoys["gone"])

    dropped = manage("drop-roles", "--of-dropped-database", GONE, "--yes")
    assert dropped.returncode == 0, dropped.stderr
    assert f"dropped 3 role(s) of dropped database {GONE!r}" in dropped.stdout
    assert roles_of(observer, GONE) == []
    assert roles_of(observer, "kj_someone_elses_database") == decoys["other"]


def test_drop_roles_refuses_a_database_that_still_exists(observer: Observer) -> None:
    database = str(connection.settings_dict["NAME"])
    ours = roles_of(observer, database)
    refused = manage("drop-roles", "--of-dropped-database", database, "--yes")
    assert refused.returncode != 0
    assert f"database {database!r} exists" in refused.stderr
    assert roles_of(observer, database) == ours
