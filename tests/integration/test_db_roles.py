"""The second wall: tenant job bodies log in as their tenant's PostgreSQL role (DB_ROLES).

Every test runs real jobs through a real RQ worker on the real database; what a job could
reach is read back on a second connection (support.Observer) with the project's credentials.
Calibration: each way out is first shown to work with both walls down (DB_GUARD off, DB_ROLES
off), so that its failure with the roles on proves the roles stopped it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.db import connection
from django.test import override_settings
from django_tenants.utils import tenant_context

from kumiko_jobs import db_roles
from kumiko_jobs.models import JobRun, RunStatus
from tests.conftest import work
from tests.guardapp import role_jobs, support

pytestmark = pytest.mark.usefixtures("live_db")

ROLES_LOG = {**settings.KUMIKO_JOBS, "DB_GUARD": "log", "DB_ROLES": True}
ROLES_ENFORCE = {**settings.KUMIKO_JOBS, "DB_GUARD": "enforce", "DB_ROLES": True}
NO_WALLS = {**settings.KUMIKO_JOBS, "DB_GUARD": "off", "DB_ROLES": False}


@pytest.fixture(autouse=True)
def _only_on_a_test_database(django_db_setup: None) -> None:
    support.refuse_unless_test_database()


@pytest.fixture
def guard_data(live_db: None) -> Iterator[None]:
    support.seed()
    yield
    support.discard_worker_connections()
    support.clean()


@pytest.fixture
def observer() -> Iterator[support.Observer]:
    seen = support.Observer()
    yield seen
    seen.close()


def _run(tenant: Any, job: Any, mode: dict[str, Any], **kwargs: Any) -> JobRun:
    with override_settings(KUMIKO_JOBS=mode):
        with tenant_context(tenant):
            handle = job.enqueue(**kwargs)
        work()
    connection.set_schema_to_public()
    return JobRun.objects.get(pk=handle.run_id)


def _project_user() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT session_user")
        return str(cursor.fetchone()[0])


def test_the_body_logs_in_as_its_tenants_role(tenants, guard_data):
    run = _run(tenants["t1"], role_jobs.role_whoami, ROLES_ENFORCE)
    assert run.status == RunStatus.SUCCEEDED, run.error_message
    role = db_roles.role_name(tenants["t1"].pk)
    assert support.findings("t1") == {"identity": f"{role}/{role}", "secrets": "t1-value"}
    # ... and the history was written with the project's own user, on its own connection.
    assert _project_user() != role


# --- raw driver: undoing the identity first, then reading t2 -----------------------------------


@pytest.mark.parametrize("case", sorted(role_jobs.UNDO_IDENTITY))
def test_calibration_the_raw_driver_reads_t2_without_walls(tenants, guard_data, case):
    run = _run(
        tenants["t1"],
        role_jobs.undo_identity_then_read,
        NO_WALLS,
        case=case,
        project=_project_user(),
    )
    assert run.status == RunStatus.SUCCEEDED, run.error_message
    assert support.findings("t1")["leaked"] == "t2-value"


@pytest.mark.parametrize("mode", [ROLES_LOG, ROLES_ENFORCE], ids=["log", "enforce"])
@pytest.mark.parametrize("case", sorted(role_jobs.UNDO_IDENTITY))
def test_the_raw_driver_cannot_undo_the_login_role(tenants, guard_data, observer, case, mode):
    run = _run(
        tenants["t1"],
        role_jobs.undo_identity_then_read,
        mode,
        case=case,
        project=_project_user(),
    )
    assert run.status == RunStatus.FAILED
    assert run.error_type == "DatabaseAccessDenied", run.error_message
    assert "denied by PostgreSQL: permission denied for schema t2" in run.error_message
    assert run.attempts == 1
    findings = support.findings("t1")
    assert "leaked" not in findings
    assert findings["undo"].startswith("refused") or findings["undo"] == "accepted"
    assert observer.rows("SELECT label, value FROM t2.guardapp_secret") == [
        ("t2-secret", "t2-value")
    ]


def test_a_swallowed_permission_denied_still_fails_the_run(tenants, guard_data):
    """The job catches PostgreSQL's refusal and returns normally: the run is still failed."""
    run = _run(tenants["t1"], role_jobs.swallow_denial, ROLES_LOG)
    assert support.findings("t1") == {"swallowed": "carried on"}
    assert run.status == RunStatus.FAILED
    assert run.error_type == "DatabaseAccessDenied"
    assert run.error_message.startswith("the job swallowed a database access denial")


# --- escape hatches switch identity -------------------------------------------------------------


def test_global_writes_run_as_the_project_user_for_the_block(tenants, guard_data, observer):
    run = _run(tenants["t1"], role_jobs.role_add_plan, ROLES_LOG, name="added")
    assert run.status == RunStatus.SUCCEEDED, run.error_message
    role = db_roles.role_name(tenants["t1"].pk)
    project = _project_user()
    assert support.findings("t1") == {
        "inside_global_writes": f"{project}/{project}",
        "after_global_writes": f"{role}/{role}",
    }
    assert ("added", "3.00") in support.plans()


def test_without_global_writes_a_shared_write_is_refused_by_postgresql(tenants, guard_data):
    run = _run(tenants["t1"], role_jobs.write_shared_unguarded, ROLES_LOG)
    assert run.status == RunStatus.FAILED
    assert run.error_type == "DatabaseAccessDenied"
    assert "permission denied for table catalog_plan" in run.error_message
    assert support.plans() == [("basic", "10.00"), ("pro", "25.00")]


def test_cross_tenant_reads_use_the_other_tenants_role_read_only(tenants, guard_data):
    run = _run(tenants["t1"], role_jobs.read_other_tenant, ROLES_LOG, schema="t2")
    assert run.status == RunStatus.SUCCEEDED, run.error_message
    t1_role, t2_role = (db_roles.role_name(tenants[s].pk) for s in ("t1", "t2"))
    assert support.findings("t1") == {
        "read": "t2-value",
        "identity_in_block": f"{t2_role}/{t2_role}",
        "identity_after": f"{t1_role}/{t1_role}",
    }


def test_cross_tenant_reads_cannot_write_even_past_the_classifier(tenants, guard_data):
    run = _run(tenants["t1"], role_jobs.read_other_tenant, ROLES_LOG, schema="t2", write_too=True)
    assert run.status == RunStatus.FAILED
    assert "read-only transaction" in run.error_message, run.error_message
    assert support.secrets("t2") == [("t2-secret", "t2-value")]


def test_system_jobs_run_as_the_project_user(live_db, guard_data):
    from kumiko_jobs.enqueueing import enqueue

    with override_settings(KUMIKO_JOBS=ROLES_ENFORCE):
        handle = enqueue(role_jobs.role_system_identity)
        work()
    run = JobRun.objects.get(pk=handle.run_id)
    assert run.status == RunStatus.SUCCEEDED, run.error_message
    project = _project_user()
    assert (f"{project}/{project}|{project}/{project}", "0.00") in support.plans()


def test_a_connection_with_the_project_credentials_opened_in_the_body_is_refused(
    tenants, guard_data
):
    run = _run(tenants["t1"], role_jobs.open_project_connection, ROLES_LOG)
    assert run.status == RunStatus.FAILED
    assert run.error_type == "DatabaseAccessDenied"
    assert "with the project's credentials was opened during the run" in run.error_message
    assert "leaked" not in support.findings("t1")
