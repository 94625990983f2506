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
from django.core import checks
from django.core.management import call_command
from django.db import connection
from django.test import override_settings
from django_tenants.utils import tenant_context

from kumiko_jobs import db_roles, tenant_connections
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
