"""Reads of public are free only for truly shared tables (issue 22), in both DB_ROLES modes.

django.contrib.auth, sessions, admin and contenttypes are in SHARED_APPS *and* TENANT_APPS (the
example project, as django-tenants documents it): every tenant has its own copy, which its
code uses through unqualified names, and the copy in public is the operators' own. A tenant
run reads the operators' copies in neither mode (the classifier refuses them; the tenant roles
hold no privilege on them, and the roles command revokes one granted by hand), while Django's
own lookups in tenant code keep working. A shared table whose ``db_table`` has upper-case
letters is matched as PostgreSQL spells it: writing it needs ``global_writes``, and the tenant
roles' grants cover it. Victims are planted, and effects read, on the test's second connection
(support.Observer). The calibrated attack suite (test_guard_attacks.py, class 8) runs the
attacks on the operators' copies behind all three walls.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings

from kumiko_jobs.guard.roles import names as role_names
from kumiko_jobs.guard.roles import sync as role_sync
from kumiko_jobs.models import JobRun, RunStatus
from tests.guardapp import public_jobs, support
from tests.guardapp.attacks_base import CANARY

pytestmark = pytest.mark.usefixtures("live_db")

ROLES_OFF = {**settings.KUMIKO_JOBS, "DB_GUARD": "enforce", "DB_ROLES": False}
ROLES_ON = {**settings.KUMIKO_JOBS, "DB_GUARD": "enforce", "DB_ROLES": True}
# PostgreSQL's wall alone: the classifier only logs what it would deny.
ROLES_ONLY = {**settings.KUMIKO_JOBS, "DB_GUARD": "log", "DB_ROLES": True}
MODES = {"roles_off": ROLES_OFF, "roles_on": ROLES_ON}


@pytest.fixture
def operators(observer: support.Observer) -> Iterator[support.Observer]:
    """The operators' rows in public (a session, a user, an admin log entry), each holding
    the canary."""
    support.plant_operators_copies(observer)
    try:
        yield observer
    finally:
        support.unplant_operators_copies(observer)


def _finding(observer: support.Observer, key: str) -> Any:
    value = observer.value("SELECT value FROM t1.guardapp_finding WHERE key = %s", (key,))
    return None if value is None else json.loads(value)


def _denied(run: JobRun, *fragments: str) -> None:
    assert run.status == RunStatus.FAILED, (run.status, run.error_type, run.error_message)
    assert run.error_type == "DatabaseAccessDenied", run.error_message
    assert run.attempts == 1
    for fragment in fragments:
        assert fragment in run.error_message, run.error_message
    assert CANARY not in run.error_message


@pytest.mark.parametrize("mode", sorted(MODES))
def test_tenant_code_uses_its_own_copies(tenants, guard_data, operators, mode):
    """ContentType, Permission, Session, User and LogEntry lookups in a tenant job go to the
    tenant's own tables: the job succeeds and sees none of the operators' rows in public."""
    run = support.run_for(tenants["t1"], public_jobs.own_copies, MODES[mode])
    assert run.status == RunStatus.SUCCEEDED, (run.error_type, run.error_message)
    seen = _finding(operators, "own_copies")
    assert seen["content_type"] == "guardapp.secret"
    assert seen["permissions"] == operators.value(
        "SELECT count(*) FROM t1.auth_permission p JOIN t1.django_content_type c "
        "ON c.id = p.content_type_id WHERE c.app_label = 'guardapp' AND c.model = 'secret'"
    )
    assert seen["users"] == operators.value("SELECT count(*) FROM t1.auth_user")
    own = [r[0] for r in operators.rows("SELECT session_key FROM t1.django_session ORDER BY 1")]
    assert f"own{run.run_id.hex[:20]}" in own
    assert seen["sessions"] == own  # t1's own, never the operators'
    assert seen["admin_log"] == 0
    assert (
        operators.value("SELECT count(*) FROM public.django_session WHERE session_key LIKE 'own%%'")
        == 0
    )


@pytest.mark.parametrize("mode", ["roles_off", "roles_on", "roles_only"])
def test_the_operators_sessions_are_refused(tenants, guard_data, operators, mode):
    """``SELECT session_key FROM public.django_session`` fails the run in every wall: the
    classifier's rule (no grant), or PostgreSQL's (the tenant role holds no privilege)."""
    walls = {**MODES, "roles_only": ROLES_ONLY}[mode]
    run = support.run_for(tenants["t1"], public_jobs.operators_sessions, walls)
    if mode == "roles_only":
        _denied(run, "denied by PostgreSQL: permission denied for table django_session")
    else:
        _denied(run, "public.django_session: the operators' own table", "No grant allows this")
    assert _finding(operators, "operators_sessions") is None


@pytest.mark.parametrize("mode", sorted(MODES))
def test_a_shared_table_with_an_upper_case_name_needs_global_writes(
    tenants, guard_data, observer, mode
):
    """``GuardShared_Notice`` (Django quotes its db_table): an honest ORM write without the
    grant is refused before PostgreSQL in both modes; its read is allowed (with roles, through
    the group's grant on it); with ``global_writes`` the write lands in public (with roles,
    through the writers' grant)."""
    run = support.run_for(tenants["t1"], public_jobs.notice_without_grant, MODES[mode])
    _denied(run, "INSERT on shared table 'GuardShared_Notice' needs the global_writes grant")
    assert _finding(observer, "notices") == 0  # the read before it went through
    assert observer.value('SELECT count(*) FROM public."GuardShared_Notice"') == 0

    run = support.run_for(tenants["t1"], public_jobs.notice_with_grant, MODES[mode], text=mode)
    assert run.status == RunStatus.SUCCEEDED, (run.error_type, run.error_message)
    assert observer.rows('SELECT text FROM public."GuardShared_Notice"') == [(mode,)]


def test_a_hand_grant_on_the_operators_tables_is_flagged_and_revoked(
    tenants, guard_data, operators
):
    """A privilege on an operators' table given by hand to the tenants' group, or to PUBLIC
    (every role is a member), lets every tenant role read it: E012 names the table, and the
    roles command revokes it (checked by PostgreSQL's wall alone, before and after)."""
    group, writers = role_names.group_name(), role_names.writers_group_name()
    log_sequence = "public.django_admin_log_id_seq"
    try:
        operators.rows(f'GRANT SELECT ON public.django_session TO "{group}"')
        operators.rows("GRANT SELECT ON public.auth_user TO PUBLIC")
        # The shared writers (an escape hatch's login) and an id sequence count too: a
        # setval() on the admin log's would make every later admin save a duplicate key.
        operators.rows(f'GRANT SELECT ON public.django_admin_log TO "{writers}"')
        operators.rows(f'GRANT USAGE, SELECT, UPDATE ON SEQUENCE {log_sequence} TO "{writers}"')
        stale = role_sync.out_of_date()
        assert "table public.django_session (tenant roles may read it)" in stale
        assert "table public.auth_user (tenant roles may read it)" in stale
        assert "table public.django_admin_log (tenant roles may read it)" in stale
        assert f"sequence {log_sequence} (tenant roles may use it)" in stale
        # Calibration: with the hand grant, the tenant role reads the operators' sessions.
        run = support.run_for(tenants["t1"], public_jobs.operators_sessions, ROLES_ONLY)
        assert run.status == RunStatus.SUCCEEDED, (run.error_type, run.error_message)
        assert f"{CANARY}sess" in _finding(operators, "operators_sessions")
        operators.rows("DELETE FROM t1.guardapp_finding")

        support.discard_worker_connections()
        role_sync.sync_all()
        left = role_sync.out_of_date()
        assert not [s for s in left if s.startswith(("table public.", "sequence public."))]
        held = f"has_sequence_privilege('{writers}', '{log_sequence}', 'USAGE, SELECT, UPDATE')"
        assert operators.value(f"SELECT {held}") is False
        run = support.run_for(tenants["t1"], public_jobs.operators_sessions, ROLES_ONLY)
        _denied(run, "denied by PostgreSQL: permission denied for table django_session")
        assert _finding(operators, "operators_sessions") is None
    finally:
        operators.rows(f'REVOKE ALL ON public.django_session FROM "{group}"')
        operators.rows("REVOKE ALL ON public.auth_user FROM PUBLIC")
        operators.rows(f'REVOKE ALL ON public.django_admin_log FROM "{writers}"')
        operators.rows(f'REVOKE ALL ON SEQUENCE {log_sequence} FROM "{writers}"')


@pytest.mark.parametrize("mode", sorted(MODES))
def test_cross_tenant_reads_of_the_public_tenant_reads_nothing(
    tenants, guard_data, operators, mode
):
    """The public schema is no tenant: inside ``cross_tenant_reads(<public tenant>)`` the
    unqualified ``django_session`` would be the operators'. The classifier refuses it (roles
    off); with roles the public tenant has no reader login either. Nothing is read."""
    run = support.run_for(tenants["t1"], public_jobs.read_public_as_a_tenant, MODES[mode])
    assert run.status == RunStatus.FAILED, (run.status, run.error_type, run.error_message)
    assert run.attempts == 1
    assert CANARY not in run.error_message
    if mode == "roles_off":
        _denied(run, "cross_tenant_reads of the public schema")
    assert _finding(operators, "operators_sessions") is None
