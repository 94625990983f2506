"""A tenant role's connection sets its ``search_path`` once, and again whenever it may be lost.

With ``DB_ROLES`` each tenant's runs use a pooled connection of its own, so the path
django-tenants sets for the body is the same run after run: it is kept (guard/roles/search_path.py).
Each test counts the ``SET search_path`` statements sent on the tenant role's sessions, and
checks where the body's unqualified names went (its own secret, read through the ORM): a path
kept when it was in fact lost would send the body to the role's default path, where its
tables are not, and fail the run.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from django.conf import settings
from django.db import connection

from kumiko_jobs.guard.roles import connections as tenant_connections
from kumiko_jobs.guard.roles import names as role_names
from kumiko_jobs.models import JobRun, RunStatus
from tests.guardapp import role_jobs, route_jobs, support

pytestmark = pytest.mark.usefixtures("cold_pool", "live_db")

ROLES_ENFORCE = {**settings.KUMIKO_JOBS, "DB_GUARD": "enforce", "DB_ROLES": True}


def _run(tenant: Any, job: Any, mode: dict[str, Any] = ROLES_ENFORCE, **kwargs: Any) -> JobRun:
    run: JobRun = support.run_for(tenant, job, mode, **kwargs)
    return run


def _sets_of(
    role: str, tenant: Any, job: Any, mode: dict[str, Any] = ROLES_ENFORCE, **kwargs: Any
) -> tuple[JobRun, list[str]]:
    """Run ``job`` and return its run and the ``SET search_path`` statements sent on ``role``'s
    sessions meanwhile (psycopg's cursor: every route, Django's or not)."""
    sent: list[str] = []
    original = psycopg.Cursor.execute

    def counting(self: Any, query: Any, *args: Any, **kw: Any) -> Any:
        text = str(query)
        if self.connection.info.user == role and text.startswith("SET search_path"):
            sent.append(text)
        return original(self, query, *args, **kw)

    psycopg.Cursor.execute = counting  # type: ignore[method-assign]
    try:
        run = _run(tenant, job, mode, **kwargs)
    finally:
        psycopg.Cursor.execute = original  # type: ignore[method-assign]
    return run, sent


def _clean_findings(schema: str) -> None:
    connection.set_schema_to_public()
    with connection.cursor() as cursor:
        cursor.execute(f'TRUNCATE "{schema}".guardapp_finding')


def _succeeded_in_own_schema(run: JobRun, schema: str) -> None:
    assert run.status == RunStatus.SUCCEEDED, (run.error_type, run.error_message)
    # Secret.objects (unqualified) read the run's own tenant table, and only it.
    assert support.findings(schema)["secrets"] == f"{schema}-value"


def _warm(tenant: Any) -> list[str]:
    """A first run on a new session: django-tenants sets the path (returned: the counter sees
    it); the reset after the run (core/session.py) sets it again, and it is kept from then on."""
    role = role_names.role_name(tenant.pk)
    run, sent = _sets_of(role, tenant, role_jobs.role_whoami)
    _succeeded_in_own_schema(run, tenant.schema_name)
    _clean_findings(tenant.schema_name)
    return sent


@pytest.mark.parametrize(
    "job", [role_jobs.role_whoami, role_jobs.role_whoami_atomic], ids=["plain", "atomic"]
)
def test_a_warm_tenant_connection_sets_its_search_path_once(tenants, guard_data, job):
    role = role_names.role_name(tenants["t1"].pk)
    assert _warm(tenants["t1"]) == ['SET search_path = "t1","public"']  # the counter sees it
    connects = tenant_connections.connects()
    for _ in range(2):
        run, kept = _sets_of(role, tenants["t1"], job)
        _succeeded_in_own_schema(run, "t1")
        _clean_findings("t1")
        assert kept == []
    assert tenant_connections.connects() == connects  # the same session throughout


def test_the_path_is_set_again_after_a_run_changed_it(tenants, guard_data):
    """A run moves its session's path under ``unsafe_raw``; the tenancy step resets the session
    (``DISCARD ALL``) and sets the kept path again in the same round trip: the next run on it
    starts in its tenant's path, and sends no ``SET``."""
    role = role_names.role_name(tenants["t1"].pk)
    _warm(tenants["t1"])
    planted, _ = _sets_of(role, tenants["t1"], route_jobs.plant, kind="search_path")
    assert planted.status == RunStatus.SUCCEEDED, (planted.error_type, planted.error_message)
    # Calibration: the planted path was there in the planting run's session.
    assert support.findings("t1")["after:search_path"] == "t2"
    pid = support.findings("t1")["pid"]
    _clean_findings("t1")
    observing, sent = _sets_of(role, tenants["t1"], route_jobs.observe)
    assert observing.status == RunStatus.SUCCEEDED, (observing.error_type, observing.error_message)
    seen = support.findings("t1")
    assert seen["pid"] == pid  # the same session, whose path the plant had moved
    # Read on the raw driver before the run's first ORM query: the path the reset set again.
    assert seen["search_path"] == "t1, public"
    # ... and the findings themselves, written through the ORM, landed in t1 without a SET.
    assert sent == []


def test_a_path_set_in_a_transaction_the_job_rolled_back_is_set_again(tenants, guard_data):
    """django-tenants' ``SET`` went out inside a transaction that a raw ``ROLLBACK`` undid: a
    path set inside a transaction is never kept, so the next run sets it again. (On a new
    session: a warm one keeps its path, and the job's transaction sends none.)"""
    role = role_names.role_name(tenants["t1"].pk)
    rolled, first = _sets_of(role, tenants["t1"], role_jobs.roll_back_under_the_path)
    assert rolled.status == RunStatus.SUCCEEDED, (rolled.error_type, rolled.error_message)
    assert first == ['SET search_path = "t1","public"']
    connects = tenant_connections.connects()
    run, sent = _sets_of(role, tenants["t1"], role_jobs.role_whoami)
    _succeeded_in_own_schema(run, "t1")
    assert tenant_connections.connects() == connects  # the same session as the rollback's
    assert sent == ['SET search_path = "t1","public"']


def test_a_new_session_behind_the_same_wrapper_sets_the_path_again(tenants, guard_data):
    """The pooled wrapper's psycopg connection replaced without Django's ``close()`` (as the
    guard drops a connection it refuses) and connected again before the next run: the kept
    path belonged to the old session."""
    role = role_names.role_name(tenants["t1"].pk)
    assert _warm(tenants["t1"]) == ['SET search_path = "t1","public"']
    run, first = _sets_of(role, tenants["t1"], role_jobs.role_whoami)
    _succeeded_in_own_schema(run, "t1")
    assert first == []  # kept
    _clean_findings("t1")
    wrapper = tenant_connections.wrapper_for("default", tenants["t1"].pk)
    connects = tenant_connections.connects()
    raw, wrapper.connection = wrapper.connection, None
    raw.close()
    wrapper.ensure_connection()  # the new session exists before the run sets its tenant
    run, sent = _sets_of(role, tenants["t1"], role_jobs.role_whoami)
    _succeeded_in_own_schema(run, "t1")
    assert tenant_connections.connects() == connects + 1
    assert sent == ['SET search_path = "t1","public"']


def test_behind_a_transaction_pooler_the_path_is_set_for_every_run(tenants, guard_data):
    """``DB_POOLER = "transaction"``: the next transaction may get another server session."""
    role = role_names.role_name(tenants["t1"].pk)
    pooled = {**ROLES_ENFORCE, "DB_POOLER": "transaction"}
    _warm(tenants["t1"])
    for _ in range(2):
        run, sent = _sets_of(role, tenants["t1"], role_jobs.role_whoami, pooled)
        _succeeded_in_own_schema(run, "t1")
        assert sent == ['SET search_path = "t1","public"']
        _clean_findings("t1")
