"""What a body leaves on a session past both walls, and that no later run meets it.

Found by the red-team pass over the merged second wall: the raw driver (``connection.connection``)
is judged by PostgreSQL's privileges, not by the classifier, so the session reset that used to
follow only the statements the guard saw missed what it sent. Each test runs the planting job
through the worker, then a later run of another tenant (or the system) on the same worker, and
reads the effect through the test's second connection. Each is calibrated: with the reset that
closes it switched off, the plant does reach the later run.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.conf import settings
from django.db import connection
from django.test import override_settings
from django_tenants.utils import tenant_context

from kumiko_jobs.core import session
from kumiko_jobs.core.db import ADMISSION_LOCK_CLASS
from kumiko_jobs.models import JobRun, RunStatus
from tests.conftest import work
from tests.guardapp import role_jobs, support

pytestmark = pytest.mark.usefixtures("live_db")

ROLES_ENFORCE = {**settings.KUMIKO_JOBS, "DB_GUARD": "enforce", "DB_ROLES": True}


@pytest.fixture(params=["closed", "calibration"])
def reset(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """``closed``: as shipped. ``calibration``: the reset that closes the case is off."""
    if request.param == "calibration":
        monkeypatch.setattr(session, "reset_borrowed", lambda conn: None)
        monkeypatch.setattr(session, "discard", lambda conn, raw=False: None)
        monkeypatch.setattr(session, "send_discard", lambda conn: None)
    return str(request.param)


def _runs(*jobs: tuple[Any, ...], mode: dict[str, Any] = ROLES_ENFORCE) -> list[JobRun]:
    """Enqueue ``(tenant or None, job[, kwargs])`` in order, then one worker drains them."""
    handles = []
    with override_settings(KUMIKO_JOBS=mode):
        for tenant, job, *kwargs in jobs:
            arguments = kwargs[0] if kwargs else {}
            if tenant is None:
                handles.append(job.enqueue(**arguments))
            else:
                with tenant_context(tenant):
                    handles.append(job.enqueue(**arguments))
        work()
    connection.set_schema_to_public()
    return [JobRun.objects.get(pk=h.run_id) for h in handles]


def test_a_raw_session_lock_on_the_admission_key_is_released_after_the_run(
    tenants, guard_data, observer, reset
):
    """No grant: t1 holds t2's admission lock through the raw driver; t2's enqueues of a
    limited job would wait on it for as long as t1's pooled connection lives."""
    (planted,) = _runs((tenants["t1"], role_jobs.raw_hold_admission_lock))
    assert planted.status == RunStatus.SUCCEEDED, planted.error_message
    free = observer.value(
        "SELECT pg_try_advisory_lock(%s, hashtext(%s))",
        (ADMISSION_LOCK_CLASS, role_jobs.ADMISSION_KEY),
    )
    if free:
        observer.value(
            "SELECT pg_advisory_unlock(%s, hashtext(%s))",
            (ADMISSION_LOCK_CLASS, role_jobs.ADMISSION_KEY),
        )
    assert free is (reset == "closed")


def test_a_borrowed_tenant_session_is_reset_when_cross_tenant_reads_ends(
    tenants, guard_data, observer, reset
):
    """With cross_tenant_reads(t2), t1 borrows t2's pooled reader connection; a temp table
    left there would shadow t2's table in the next tenant's cross_tenant_reads(t2)."""
    planted, victim = _runs(
        (tenants["t1"], role_jobs.plant_in_borrowed_session),
        (tenants["t3"], role_jobs.read_other_tenant, {"schema": "t2"}),
    )
    assert planted.status == RunStatus.SUCCEEDED, planted.error_message
    assert victim.status == RunStatus.SUCCEEDED, victim.error_message
    seen = support.findings("t3")["read"]
    if reset == "closed":
        assert seen == "t2-value"
    else:
        assert seen == "PLANTED-by-t1"
    assert support.secrets("t2") == [("t2-secret", "t2-value")]  # the real table, untouched


def test_the_writer_session_is_reset_after_global_writes(tenants, guard_data, observer, reset):
    """Inside global_writes the body runs on the tenant's pooled writer connection, whose next
    user is the tenant's next global_writes block: a temp table there would shadow a shared
    table."""
    planted, later = _runs(
        (tenants["t1"], role_jobs.plant_in_project_session),
        (tenants["t1"], role_jobs.read_plans_in_global_writes),
    )
    assert planted.status == RunStatus.SUCCEEDED, planted.error_message
    assert later.status == RunStatus.SUCCEEDED, later.error_message
    plans = support.findings("t1")["plans"]
    assert plans == ("basic,pro" if reset == "closed" else "PLANTED")


def test_role_defaults_a_tenant_gives_itself_are_reset_by_the_roles_command(
    tenants, guard_data, observer
):
    """``ALTER ROLE CURRENT_USER SET ...`` is allowed to any role for itself and lives in the
    catalog, not the session; `manage.py kumiko_jobs roles` (run on every deploy) resets it."""
    from io import StringIO

    from django.core.management import call_command

    from kumiko_jobs.guard.roles import names as role_names

    role = role_names.role_name(tenants["t1"].pk)
    query = (
        "SELECT count(*) FROM pg_db_role_setting s JOIN pg_roles r ON r.oid = s.setrole "
        "WHERE r.rolname = %s"
    )
    (planted,) = _runs((tenants["t1"], role_jobs.raw_set_own_role_default))
    assert planted.status == RunStatus.SUCCEEDED, planted.error_message
    assert observer.value(query, (role,)) == 1  # calibration: the role did set it
    call_command("kumiko_jobs", "roles", stdout=StringIO())
    assert observer.value(query, (role,)) == 0


NO_SECOND_WALL = {**settings.KUMIKO_JOBS, "DB_GUARD": "enforce", "DB_ROLES": False}


@pytest.mark.parametrize("mode", ["roles", "calibration"])
def test_cross_tenant_reads_cannot_write_by_leaving_the_read_only_transaction(
    tenants, guard_data, mode
):
    """A raw ROLLBACK ends the block's READ ONLY transaction; the block's login, t2's reader,
    holds no write privilege, so PostgreSQL still refuses. Calibration: without the second
    wall (the project's user) the raw write lands."""
    (run,) = _runs(
        (tenants["t1"], role_jobs.raw_write_in_cross_tenant_reads),
        mode=ROLES_ENFORCE if mode == "roles" else NO_SECOND_WALL,
    )
    if mode == "roles":
        assert (run.status, run.error_type) == (RunStatus.FAILED, "DatabaseAccessDenied")
        assert "permission denied for table guardapp_secret" in run.error_message
        assert support.secrets("t2") == [("t2-secret", "t2-value")]
    else:
        assert run.status == RunStatus.SUCCEEDED, run.error_message
        assert support.secrets("t2") == [("t2-secret", "overwritten-by-t1")]


@pytest.mark.parametrize("mode", ["roles", "calibration"])
def test_global_writes_cannot_read_another_tenant_by_the_raw_driver(tenants, guard_data, mode):
    """The writer login holds the tenant's own privileges and writes on shared tables, not the
    project user's: another tenant's schema stays closed. Calibration: without the second wall
    the raw read returns t2's secret."""
    (run,) = _runs(
        (tenants["t1"], role_jobs.raw_read_in_global_writes),
        mode=ROLES_ENFORCE if mode == "roles" else NO_SECOND_WALL,
    )
    if mode == "roles":
        assert (run.status, run.error_type) == (RunStatus.FAILED, "DatabaseAccessDenied")
        assert "permission denied for schema t2" in run.error_message
        assert "leaked" not in support.findings("t1")
    else:
        assert run.status == RunStatus.SUCCEEDED, run.error_message
        assert support.findings("t1")["leaked"] == "t2-value"


def test_the_writer_login_cannot_write_the_tenant_registry(tenants, guard_data):
    """Shared writes stop at the protected tables (kumiko's history, tenants, domains), which
    the classifier refuses with any grant; PostgreSQL refuses them to the writer login too."""
    from example_project.customers.models import Client

    (run,) = _runs((tenants["t1"], role_jobs.raw_write_registry_in_global_writes))
    assert (run.status, run.error_type) == (RunStatus.FAILED, "DatabaseAccessDenied")
    assert "permission denied for table customers_client" in run.error_message
    assert Client.objects.get(schema_name="t2").name != "renamed-by-t1"
