"""A new user's first commands, on the command line, on a new database (issue 23).

Each test creates an empty database of its own, runs ``python manage.py ...`` in a subprocess
with the environment a user would have (``DATABASE_URL``, ``REDIS_URL``, the settings module;
the README's settings, ``DB_ROLES`` on), and drops the database and the roles the commands
created afterwards. ``call_command()`` would not do: it skips the system checks, and the check
that crashed (E012, reading the tenant table before ``migrate_schemas --shared`` created it)
is one of those.

For each documented settings layout: (a) auth in TENANT_APPS too (the example project), (b)
auth in SHARED_APPS only (django-tenants' documented layout; tests/shared_auth).

The last test uses the suite's own database: E012's query failing for real inside a
transaction (W008, the transaction left usable).

Calibrated: with ``guard/roles/sync.py``'s ``_tenants`` reading the tenant table unconditionally
again (the code before this change), ``check --database default``, ``kumiko_jobs roles`` and
``migrate_schemas --shared`` each exit 1 with ``relation "customers_client" does not exist``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import urlparse

import psycopg
import pytest
from psycopg import sql

from kumiko_jobs.guard.roles.names import prefix_of
from tests.conftest import ROOT

LAYOUTS = {
    "auth_per_tenant": "example_project.settings",
    "auth_shared": "tests.shared_auth.project_settings",
}

CREATE_TENANT = (
    "from example_project.customers.models import Client, Domain\n"
    "tenant = Client(schema_name='alpha', name='Alpha')\n"
    "tenant.save()\n"
    "Domain.objects.create(domain='alpha.localhost', tenant=tenant, is_primary=True)\n"
    "print('created', tenant.schema_name)\n"
)


def _maintenance(url: str) -> str:
    """``url`` on the server's maintenance database: the one DATABASE_URL names may not exist."""
    return urlparse(url)._replace(path="/postgres").geturl()


def _admin_url() -> str:
    # The suite's administrator (tests/settings.py keeps it when the project user is not one).
    url = os.environ.get("KUMIKO_TEST_ADMIN_DATABASE_URL") or os.environ["DATABASE_URL"]
    return _maintenance(url)


def _drop(name: str) -> None:
    """The database and every role of its prefix (roles are cluster-wide and outlive it)."""
    with psycopg.connect(_admin_url(), autocommit=True) as admin:
        admin.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )
        roles = [
            row[0]
            for row in admin.execute(
                "SELECT rolname FROM pg_roles WHERE starts_with(rolname, %s)", [prefix_of(name)]
            ).fetchall()
        ]
        # The escape-hatch logins first: each is a member of its tenant's role.
        for role in sorted(roles, key=lambda r: r.endswith(("_r", "_w")), reverse=True):
            admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))


@dataclass
class Project:
    """A new database and the environment of a user whose settings point at it."""

    database: str
    env: dict[str, str]

    def manage(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=ROOT,
            env={**self.env, **env},
            capture_output=True,
            text=True,
            timeout=300,
        )

    def roles(self) -> list[str]:
        with psycopg.connect(_admin_url(), autocommit=True) as admin:
            rows = admin.execute(
                "SELECT rolname FROM pg_roles WHERE starts_with(rolname, %s) ORDER BY 1",
                [prefix_of(self.database)],
            ).fetchall()
        return [row[0] for row in rows]


@pytest.fixture(params=sorted(LAYOUTS))
def project(request: pytest.FixtureRequest) -> Iterator[Project]:
    name = f"test_kj_fresh_{os.getpid()}_{request.param}"
    _drop(name)  # left by a run that was killed
    url = urlparse(os.environ["DATABASE_URL"])
    # Created by the project's own database user, who then owns it, as a user's database.
    with psycopg.connect(_maintenance(os.environ["DATABASE_URL"]), autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("DJANGO_", "PYTEST_", "KUMIKO_TEST_"))
    }
    env |= {
        "DJANGO_SETTINGS_MODULE": LAYOUTS[request.param],
        "DATABASE_URL": url._replace(path=f"/{name}").geturl(),
        "REDIS_URL": os.environ["REDIS_URL"],  # this suite's own Redis database
        "PYTHONPATH": str(ROOT),
    }
    try:
        yield Project(name, env)
    finally:
        _drop(name)


def _database_checks_clean(project: Project) -> None:
    """``check --database default`` reports no issue, but W007 where it is true: the suite
    connects as a superuser unless KUMIKO_TEST_PROJECT_USER=1, which W007 warns of."""
    said = _ok(project.manage("check", "--database", "default"))
    if "no issues" in said:
        return
    with psycopg.connect(project.env["DATABASE_URL"]) as conn:
        row = conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user").fetchone()
    assert row and row[0], said
    assert "(kumiko_jobs.W007)" in said and "identified 1 issue" in said, said


def _ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    assert "Traceback" not in result.stderr, result.stderr
    return result.stdout + result.stderr


@pytest.mark.parametrize(
    "migrations",
    [("migrate_schemas", "--shared"), ("migrate",)],
    ids=["migrate_schemas_shared_first", "migrate_first"],
)
def test_every_first_command_works_on_a_new_database(
    project: Project, migrations: tuple[str, ...]
) -> None:
    """check, check --database default and kumiko_jobs roles before migrating; the first
    migration (django-tenants' ``migrate_schemas --shared``, or plain ``migrate``), then
    ``migrate``; the same three after migrating; and once a tenant exists, its role made and
    found in step."""
    # Before migrating: nothing to read yet, nothing to report, no crash.
    assert "no issues" in _ok(project.manage("check"))
    _database_checks_clean(project)
    said = _ok(project.manage("kumiko_jobs", "roles"))
    assert "ensured 0 tenant role(s), dropped 0" in said

    _ok(project.manage(*migrations))
    _ok(project.manage("migrate"))  # django-tenants' migrate: every schema
    _database_checks_clean(project)
    assert "ensured 0 tenant role(s)" in _ok(project.manage("kumiko_jobs", "roles"))

    # A tenant: its schema is migrated and its role made on save (the role hooks).
    assert "created alpha" in _ok(project.manage("shell", "-c", CREATE_TENANT))
    assert any(role.endswith("_t1") for role in project.roles()), project.roles()
    _database_checks_clean(project)
    assert "ensured 1 tenant role(s), dropped 0" in _ok(project.manage("kumiko_jobs", "roles"))
    assert "every tenant role is up to date" in _ok(
        project.manage("kumiko_jobs", "roles", "--check")
    )
    assert "no issues" in _ok(project.manage("check"))


@pytest.mark.parametrize("project", ["auth_shared"], indirect=True)
def test_shared_users_without_a_membership_rule_fail_check_naming_the_fix(
    project: Project,
) -> None:
    """Layout (b) without KUMIKO_JOBS["TENANT_MEMBERSHIP"]: ``check`` refuses (E014) and names
    the rule that fits the user model (its ``tenants`` field, django-tenant-users' layout)."""
    result = project.manage("check", KUMIKO_TEST_TENANT_MEMBERSHIP="")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "kumiko_jobs.E014" in result.stderr
    assert "KUMIKO_JOBS['TENANT_MEMBERSHIP'] = 'kumiko_jobs.core.audience.django_tenant_users'" in (
        result.stderr
    )
    assert "Traceback" not in result.stderr
    # A rule that cannot be imported: E015, not a crash at the first tenant request.
    result = project.manage("check", KUMIKO_TEST_TENANT_MEMBERSHIP="no_such_module.is_member")
    assert result.returncode == 1 and "kumiko_jobs.E015" in result.stderr, result.stderr
    assert "cannot be imported" in result.stderr


@pytest.mark.usefixtures("live_db")  # real commits; no flush of the tenants afterwards
def test_a_check_that_cannot_read_the_tenants_warns_and_leaves_the_transaction_usable(
    settings,
) -> None:
    """E012's query failing for real (a role that may not read the tenant table) inside the
    caller's transaction: a warning (W008) names the way out, and the transaction is not left
    aborted (its savepoint was rolled back). Calibrated: without the savepoint and the except
    clause, ``run_checks`` raises ProgrammingError ("permission denied for table")."""
    from django.core import checks
    from django.db import connection, transaction

    settings.KUMIKO_JOBS = {**settings.KUMIKO_JOBS, "DB_ROLES": True}
    role = f"kj_test_blind_{os.getpid()}"
    with connection.cursor() as cursor:
        cursor.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(sql.Identifier(role)).as_string())
        cursor.execute(sql.SQL("GRANT {} TO CURRENT_USER").format(sql.Identifier(role)).as_string())
    try:
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute(
                    sql.SQL("SET LOCAL ROLE {}").format(sql.Identifier(role)).as_string()
                )
            found = checks.run_checks(databases=["default"], tags=[checks.Tags.database])
            ours = [m for m in found if m.id.startswith("kumiko_jobs.")]
            assert [m.id for m in ours] == ["kumiko_jobs.W008"], ours
            assert "permission denied" in ours[0].msg
            with connection.cursor() as cursor:
                cursor.execute("SELECT 1")  # the transaction goes on
                assert cursor.fetchone() == (1,)
    finally:
        with connection.cursor() as cursor:
            cursor.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)).as_string())
