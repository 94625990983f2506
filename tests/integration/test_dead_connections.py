"""A connection the worker keeps between runs may die while idle (PostgreSQL restarted, the
backend terminated, ``idle_session_timeout``, a proxy): the next run gets a fresh one and
succeeds on its first attempt (docs/reliability.md, "Outages").

Backends are killed with ``pg_terminate_backend`` from the test's second connection
(support.Observer), which is what a restart does to every session; the machine's PostgreSQL is
shared, so it is never restarted here. The in-process worker (tests.conftest.work) keeps its
connections between ``work()`` calls as a real worker keeps them between runs.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.conf import settings
from django.db import connection
from django.test import override_settings
from django_tenants.utils import tenant_context

from kumiko_jobs.guard.roles import names as role_names
from kumiko_jobs.models import JobRun, RunStatus
from tests.conftest import work
from tests.guardapp import jobs as guard_jobs
from tests.guardapp import role_jobs, support

pytestmark = pytest.mark.usefixtures("live_db")

ROLES = {**settings.KUMIKO_JOBS, "DB_GUARD": "enforce", "DB_ROLES": True}


def _enqueue(tenant: Any, job: Any, **kwargs: Any) -> str:
    with tenant_context(tenant):
        handle = job.enqueue(**kwargs)
    connection.set_schema_to_public()
    return str(handle.run_id)


def _run(tenant: Any, job: Any, **kwargs: Any) -> JobRun:
    with override_settings(KUMIKO_JOBS=ROLES):
        run_id = _enqueue(tenant, job, **kwargs)
        work()
    connection.set_schema_to_public()
    return JobRun.objects.get(pk=run_id)


def _terminate(observer: support.Observer, where: str, params: Any) -> list[int]:
    """Kill the matching backends as a restart would (the server says FATAL and hangs up), and
    wait until they are gone from pg_stat_activity."""
    pids = [
        row[0]
        for row in observer.rows(f"SELECT pid FROM pg_stat_activity WHERE {where}", params)
        if row[0] != observer.conn.info.backend_pid
    ]
    assert pids, f"no backend matches {where} {params}"
    for pid in pids:
        assert observer.value("SELECT pg_terminate_backend(%s, 5000)", [pid]) is True
    return pids


def _role_backends(observer: support.Observer, role: str) -> list[int]:
    return [
        r[0] for r in observer.rows("SELECT pid FROM pg_stat_activity WHERE usename = %s", [role])
    ]


def test_a_tenant_role_connection_killed_while_idle_is_replaced(tenants, guard_data, observer):
    role = role_names.role_name(tenants["t1"].pk)
    first = _run(tenants["t1"], role_jobs.role_whoami)
    assert first.status == RunStatus.SUCCEEDED, first.error_message
    killed = _terminate(observer, "usename = %s", [role])  # the pooled login, idle

    run = _run(tenants["t1"], role_jobs.role_whoami)

    assert (run.status, run.attempts) == (RunStatus.SUCCEEDED, 1), run.error_message
    assert support.findings("t1")["identity"] == f"{role}/{role}"
    alive = _role_backends(observer, role)
    assert alive and not set(alive) & set(killed)  # a new session, kept for the next run


@pytest.mark.parametrize("case", sorted(role_jobs.UNDO_IDENTITY))
def test_the_replaced_tenant_connection_is_as_restricted_as_a_new_one(
    tenants, guard_data, observer, case
):
    """The reconnect is a new login as the tenant's role, guarded, in its schema: the raw driver
    still cannot undo the role and read another tenant's table."""
    role = role_names.role_name(tenants["t1"].pk)
    with connection.cursor() as cursor:
        cursor.execute("SELECT session_user")
        project = str(cursor.fetchone()[0])
    assert _run(tenants["t1"], role_jobs.role_whoami).status == RunStatus.SUCCEEDED
    _terminate(observer, "usename = %s", [role])

    run = _run(tenants["t1"], role_jobs.undo_identity_then_read, case=case, project=project)

    assert (run.status, run.error_type) == (RunStatus.FAILED, "DatabaseAccessDenied")
    assert "denied by PostgreSQL: permission denied for schema t2" in run.error_message
    assert run.attempts == 1
    findings = support.findings("t1")
    assert "leaked" not in findings
    assert observer.rows("SELECT label, value FROM t2.guardapp_secret") == [
        ("t2-secret", "t2-value")
    ]


def test_the_guard_covers_the_replaced_tenant_connection(tenants, guard_data, observer):
    """The first wall on the new login: the guard refuses a read of t2 before PostgreSQL sees it,
    and the run's own tenant's data is still what the new session reads."""
    role = role_names.role_name(tenants["t1"].pk)
    assert _run(tenants["t1"], role_jobs.role_whoami).status == RunStatus.SUCCEEDED
    _terminate(observer, "usename = %s", [role])

    run = _run(tenants["t1"], guard_jobs.attack, case="orm_raw")

    assert (run.status, run.error_type) == (RunStatus.FAILED, "DatabaseAccessDenied")
    assert "'guardapp.attack' (tenant t1)" in run.error_message
    assert "denied a " in run.error_message and "by PostgreSQL" not in run.error_message
    assert run.attempts == 1
    _terminate(observer, "usename = %s", [role])
    run = _run(tenants["t1"], role_jobs.role_whoami)
    assert (run.status, run.attempts) == (RunStatus.SUCCEEDED, 1), run.error_message
    assert support.findings("t1")["secrets"] == "t1-value"


@pytest.mark.one_slot
@pytest.mark.parametrize("roles", [True, False], ids=["roles", "no_roles"])
def test_the_workers_own_connection_killed_while_idle_is_replaced(
    tenants, guard_data, observer, roles
):
    """The history's statements run on the worker's (the project's) connection: killed between
    runs, the next run's start is written on a new one."""
    mode = {**ROLES, "DB_ROLES": roles}
    with override_settings(KUMIKO_JOBS=mode):
        run_id = _enqueue(tenants["t1"], role_jobs.role_whoami)
        work()
        assert JobRun.objects.get(pk=run_id).status == RunStatus.SUCCEEDED
        connection.set_schema_to_public()
        connection.ensure_connection()
        pid = connection.connection.info.backend_pid
        run_id = _enqueue(tenants["t2"], role_jobs.role_whoami)
        killed = _terminate(observer, "pid = %s", [pid])  # idle, between two runs
        assert killed == [pid]

        work()

    connection.set_schema_to_public()
    run = JobRun.objects.get(pk=run_id)
    assert (run.status, run.attempts) == (RunStatus.SUCCEEDED, 1), run.error_message
    assert connection.connection.info.backend_pid != pid
