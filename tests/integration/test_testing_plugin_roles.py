"""``kumiko_jobs.testing`` under ``DB_ROLES``: in pytest-django's ``db`` fixture, a tenant
body runs as its tenant's role, as on a worker (``testing/inline_roles.py``).

Before, the body ran there as the project's user: an ``unsafe_raw`` block that read another
tenant's schema passed ``run()`` in tests and failed on every worker. Each refusal is
calibrated: the same job with ``DB_ROLES`` off reads what the role is refused, so the refusal
is the role's doing; and the same job through a real worker fails the same way. The guard logs
only (``DB_GUARD="log"``), so that PostgreSQL, not the classifier, is the one that refuses.
"""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from django.conf import settings
from django.db import connection
from django.test import override_settings
from django_tenants.utils import schema_context

from example_project.customers.models import Client
from kumiko_jobs import EscapeHatch
from kumiko_jobs.guard.roles import names as role_names
from kumiko_jobs.models import JobRun, RunStatus
from kumiko_jobs.testing import KumikoJobs, MissingTenantRole
from kumiko_jobs.testing.inline_roles import role_of
from tests.conftest import work
from tests.guardapp import role_jobs, support

JOB_PREFIX = "plugin_roles"
ROLES = {**settings.KUMIKO_JOBS, "DB_GUARD": "log", "DB_ROLES": True}
NO_ROLES = {**settings.KUMIKO_JOBS, "DB_GUARD": "log", "DB_ROLES": False}
RAW = EscapeHatch(reason="tests: a raw read of another tenant's table", grants=["unsafe_raw"])


@pytest.fixture(scope="module", autouse=True)
def _tenant_roles(django_db_setup: None, django_db_blocker: Any) -> None:
    """The session's tenants have roles only with KUMIKO_TEST_DB_ROLES=1 (the default): these
    tests need them in both modes (the plugin drops them at the end of the session)."""
    from kumiko_jobs.core import conf
    from kumiko_jobs.guard.roles import sync as role_sync

    if not conf.get().DB_ROLES:
        with django_db_blocker.unblock():
            role_sync.sync_all()


def raw_read_of_t2(ctx: Any) -> list[str]:
    with ctx.unsafe_raw(), connection.cursor() as cursor:
        cursor.execute("SELECT value FROM t2.guardapp_secret")
        return [row[0] for row in cursor.fetchall()]


@pytest.fixture
def seeded(db: None) -> Iterator[None]:
    """The guard suites' data, inside the test's transaction (rolled back after it)."""
    support.seed()
    yield


def identity() -> tuple[str, str, bool]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT session_user, current_user, rolsuper FROM pg_roles WHERE rolname = session_user"
        )
        session_user, current_user, superuser = cursor.fetchone()
    return session_user, current_user, superuser


def run_inline(in_schema: str, job: Any, mode: dict[str, Any], **kwargs: Any) -> JobRun:
    from kumiko_jobs.testing import run_jobs

    with override_settings(KUMIKO_JOBS=mode):
        with schema_context(in_schema):
            handle = job.enqueue(**kwargs)
        run_jobs()
    return JobRun.objects.get(pk=handle.run_id)


def t(schema: str) -> Client:
    return Client.objects.get(schema_name=schema)


def test_the_body_runs_as_its_tenants_role_then_the_test_is_itself_again(
    seeded: None, kumiko_jobs: KumikoJobs
) -> None:
    before = identity()
    assert connection.in_atomic_block  # the db fixture's transaction
    run = run_inline("t1", role_jobs.role_whoami, ROLES)
    assert run.status == RunStatus.SUCCEEDED, run.error_message
    role = role_names.role_name(t("t1").pk)
    session_user, current_user = support.findings("t1")["identity"].split("/")
    assert (session_user, current_user) == (before[0], role)
    assert support.findings("t1")["secrets"] == "t1-value"
    assert identity() == before
    with connection.cursor() as cursor:  # a project user that is not a superuser was lent
        cursor.execute("SELECT pg_has_role(session_user, %s, 'MEMBER')", [role])
        assert cursor.fetchone()[0] is before[2]  # the membership for the body only


def test_calibration_without_db_roles_the_body_is_the_project_user(seeded: None) -> None:
    run = run_inline("t1", role_jobs.role_whoami, NO_ROLES)
    assert run.status == RunStatus.SUCCEEDED, run.error_message
    session_user, current_user = support.findings("t1")["identity"].split("/")
    assert current_user == session_user == identity()[0]


@pytest.mark.parametrize("mode", ["roles", "no_roles"])
def test_an_unsafe_raw_read_of_another_tenant_fails_in_the_test_as_on_a_worker(
    seeded: None, declare: Any, mode: str
) -> None:
    job = declare(raw_read_of_t2, escape_hatch=RAW)
    before = identity()
    run = run_inline("t1", job, ROLES if mode == "roles" else NO_ROLES)
    if mode == "no_roles":  # calibration: the job does read t2 when the wall is down
        assert run.status == RunStatus.SUCCEEDED, run.error_message
        assert run.result == ["t2-value"]
        return
    assert run.status == RunStatus.FAILED
    assert run.error_type == "DatabaseAccessDenied", run.error_message
    assert "permission denied for schema t2" in run.error_message
    # The test goes on: its transaction is usable, and it is its own user again.
    assert identity() == before
    assert support.secrets("t1") == [("t1-secret", "t1-value")]


def test_the_same_unsafe_raw_read_fails_on_a_worker(live_db: None, declare: Any) -> None:
    """The worker side of the test above: the same job, a real worker, real commits."""
    support.seed()
    try:
        job = declare(raw_read_of_t2, escape_hatch=RAW)
        with override_settings(KUMIKO_JOBS=ROLES):
            handle = job.enqueue(tenant="t1")
            work()
        run = JobRun.objects.get(pk=handle.run_id)
        assert run.status == RunStatus.FAILED
        assert run.error_type == "DatabaseAccessDenied", run.error_message
        assert "permission denied for schema t2" in run.error_message
    finally:
        support.discard_worker_connections()
        support.clean()


def test_global_writes_switch_to_the_tenants_writer_for_the_block(seeded: None) -> None:
    run = run_inline("t1", role_jobs.role_add_plan, ROLES, name="added")
    assert run.status == RunStatus.SUCCEEDED, run.error_message
    found = support.findings("t1")
    assert found["inside_global_writes"].split("/")[1] == role_names.writer_name(t("t1").pk)
    assert found["after_global_writes"].split("/")[1] == role_names.role_name(t("t1").pk)
    assert ("added", "3.00") in support.plans()


def test_without_global_writes_a_shared_write_is_refused_as_on_a_worker(seeded: None) -> None:
    run = run_inline("t1", role_jobs.write_shared_unguarded, ROLES)
    assert run.status == RunStatus.FAILED
    assert run.error_type == "DatabaseAccessDenied", run.error_message
    assert "permission denied for table catalog_plan" in run.error_message
    assert support.plans() == [("basic", "10.00"), ("pro", "25.00")]


def test_cross_tenant_reads_switch_to_the_other_tenants_reader(seeded: None) -> None:
    run = run_inline("t1", role_jobs.read_other_tenant, ROLES, schema="t2")
    assert run.status == RunStatus.SUCCEEDED, run.error_message
    found = support.findings("t1")
    assert found["read"] == "t2-value"
    assert found["identity_in_block"].split("/")[1] == role_names.reader_name(t("t2").pk)
    assert found["identity_after"].split("/")[1] == role_names.role_name(t("t1").pk)


def test_a_swallowed_denial_still_fails_the_run(seeded: None) -> None:
    run = run_inline("t1", role_jobs.swallow_denial, ROLES)
    assert run.status == RunStatus.FAILED, run.error_message


def test_a_tenant_without_its_role_is_a_clear_error_naming_the_fix(db: None) -> None:
    nobody = SimpleNamespace(pk=987654321, schema_name="nowhere")
    with pytest.raises(MissingTenantRole, match="sync_all"):
        role_of(nobody)
    assert role_of(t("t1")) == role_names.role_name(t("t1").pk)
