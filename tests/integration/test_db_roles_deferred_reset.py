"""A tenant login's session reset is sent without waiting, and read before the login serves again.

With ``DB_ROLES`` the tenancy step resets the tenant's pooled session after every run
(core.session), but the worker does not wait for the reset's reply: ``send_discard`` sends it,
and the records step reads it once the run's finish is written (``settle_resets``), before the
worker takes its next message; ``wrapper_for`` reads any still unread before the connection
serves again. Each test plants session state in tenant t1 (``guardapp.plant``), then runs
``guardapp.observe`` in t1 on the same worker, which reports what its session shows: the same
backend (``pid``) when the reset worked, a new one when it failed and the session was closed,
and never the planted state.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.conf import settings
from django.db import connection
from django.test import override_settings
from django_tenants.utils import tenant_context

from kumiko_jobs.core import session
from kumiko_jobs.guard.roles import connections as tenant_connections
from kumiko_jobs.guard.roles import names as role_names
from kumiko_jobs.models import JobRun, RunStatus
from tests.conftest import work
from tests.guardapp import route_jobs, support

pytestmark = pytest.mark.usefixtures("cold_pool", "live_db")

ROLES = {**settings.KUMIKO_JOBS, "DB_GUARD": "enforce", "DB_ROLES": True}


def _run(tenant: Any, job: Any, **kwargs: Any) -> JobRun:
    with override_settings(KUMIKO_JOBS=ROLES):
        with tenant_context(tenant):
            handle = job.enqueue(**kwargs)
        work()
    connection.set_schema_to_public()
    run: JobRun = JobRun.objects.get(pk=handle.run_id)
    assert run.status == RunStatus.SUCCEEDED, (run.error_type, run.error_message)
    return run


def _pooled(tenant: Any) -> Any:
    """The tenant's pooled login for the default alias, as the pool holds it (not handed out)."""
    role = role_names.role_name(tenant.pk, "default")
    return tenant_connections._wrappers()[("default", role)]


def _clear_findings(schema: str) -> None:
    support.observed(f'DELETE FROM "{schema}".guardapp_finding RETURNING 1')


def _unread_at_settle(tenant: Any, monkeypatch: pytest.MonkeyPatch, then: Any = None) -> list[bool]:
    """Whether the tenant's reset was unread when the records step came to read it (after the
    finish); ``then()`` runs at that moment."""
    seen: list[bool] = []
    settle = session.settle_resets

    def spying() -> None:
        seen.append(session.reset_pending(_pooled(tenant)))
        if then is not None:
            then()
        settle()

    monkeypatch.setattr(session, "settle_resets", spying)
    return seen


@pytest.mark.one_slot
def test_the_reset_is_left_unread_and_read_before_the_next_run(tenants, guard_data, monkeypatch):
    t1 = tenants["t1"]
    unread = _unread_at_settle(t1, monkeypatch)
    _run(t1, route_jobs.plant, kind="work_mem")
    planted = support.findings("t1")
    assert planted["after:work_mem"] == "77MB"  # calibration: the state was there in the run
    # The reset went out, the finish was written without waiting for its reply, then it was read.
    assert unread == [True]
    assert not session.reset_pending(_pooled(t1))
    _clear_findings("t1")
    connects = tenant_connections.connects()

    _run(t1, route_jobs.observe)

    seen = support.findings("t1")
    assert seen["pid"] == planted["pid"]  # the same session, kept: the reset worked
    assert tenant_connections.connects() == connects
    assert seen["work_mem"] != "77MB"
    assert seen["time_zone"] == "UTC"
    assert "t1" in seen["search_path"]  # the kept path, set again by the reset


@pytest.mark.one_slot
def test_a_reset_that_failed_closes_the_session_before_the_next_run(
    tenants, guard_data, monkeypatch
):
    t1 = tenants["t1"]
    original = session.reset_statement

    def failing(conn: Any, kept_path: list[str] | None = None) -> str:
        # Fails at its first statement: PostgreSQL skips the rest, nothing is reset.
        return "SELECT 1/0; " + original(conn, kept_path)

    monkeypatch.setattr(session, "reset_statement", failing)
    _run(t1, route_jobs.plant, kind="work_mem")  # the run itself never waited for the reset
    monkeypatch.setattr(session, "reset_statement", original)
    planted = support.findings("t1")
    assert planted["after:work_mem"] == "77MB"
    _clear_findings("t1")
    connects = tenant_connections.connects()

    _run(t1, route_jobs.observe)

    seen = support.findings("t1")
    # The failed reset was found before the next run, and its session closed: a new login.
    assert seen["pid"] != planted["pid"]
    assert tenant_connections.connects() == connects + 1
    assert seen["work_mem"] != "77MB"


@pytest.mark.one_slot
def test_a_session_ended_while_its_reset_is_unread_gives_the_next_run_a_new_one(
    tenants, guard_data, observer, monkeypatch
):
    t1 = tenants["t1"]

    def terminate() -> None:
        pid = _pooled(t1).connection.info.backend_pid
        observer.rows("SELECT pg_terminate_backend(%s, 5000)", (pid,))

    unread = _unread_at_settle(t1, monkeypatch, then=terminate)
    _run(t1, route_jobs.plant, kind="work_mem")
    assert unread == [True]
    planted = support.findings("t1")
    _clear_findings("t1")

    _run(t1, route_jobs.observe)

    seen = support.findings("t1")
    assert seen["pid"] != planted["pid"]
    assert seen["work_mem"] != "77MB"
