"""Who sees which runs in the admin, with auth a tenant app (layout (a), the example project):
each tenant's users live in its schema, so they are its members; the operators' view takes
``kumiko_jobs.view_all_tenants``, never just ``view_jobrun`` (issue 23).

Every kumiko page, action and the "Run a job…" form are asked (tests/integration/audiences.py);
the same checks run with shared users in tests/shared_auth/.

Calibrated: with ``sees_all_tenants`` answering ``is_operator_request()`` alone (the audience
by domain only, as before), ``test_public_staff_without_view_all_tenants_sees_nothing`` fails:
a public staff user holding ``view_jobrun`` lists every tenant's runs.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.core import checks
from django.test import Client

from tests.integration.audiences import (
    OPERATOR_MODEL_PERMS,
    OPERATOR_PERMS,
    TENANT_OPERATOR_PERMS,
    TENANT_STAFF_PERMS,
    History,
    assert_member_sees_only,
    assert_operator_sees_all,
    assert_sees_nothing,
    make_history,
    snapshot,
    try_to_act,
)
from tests.integration.test_admin import client_for, make_user

pytestmark = pytest.mark.usefixtures("live_db")


@pytest.fixture
def history(tenants: dict[str, Any]) -> History:
    return make_history()


def _alpha_staff() -> Any:
    return make_user("t1", "alpha-staff", perms=TENANT_STAFF_PERMS)


def test_a_member_sees_only_its_tenant(history: History) -> None:
    """A t1 staff user, holding even the change and add permissions, sees t1's runs only, in
    tenant fields, and gets none of the operators' tools."""
    assert_member_sees_only(client_for("t1.localhost", "t1", _alpha_staff()), history, "t1")


def test_a_user_of_alpha_sees_nothing_on_betas_domain(history: History) -> None:
    client = client_for("t1.localhost", "t1", _alpha_staff())
    client.defaults["HTTP_HOST"] = "t2.localhost"
    assert_sees_nothing(client, history)


def test_a_user_of_alpha_sees_nothing_on_the_operators_domain(history: History) -> None:
    client = client_for("t1.localhost", "t1", _alpha_staff())
    client.defaults["HTTP_HOST"] = "localhost"
    assert_sees_nothing(client, history)


def test_public_staff_without_view_all_tenants_sees_nothing(history: History) -> None:
    """Every model permission of kumiko's admin, on the operators' domain, without
    ``view_all_tenants``: no page, no row, no action."""
    staff = make_user("public", "staff-no-operator", perms=OPERATOR_MODEL_PERMS)
    assert_sees_nothing(client_for("localhost", "public", staff), history)


def test_an_operator_with_view_all_tenants_sees_all(history: History) -> None:
    """Not a superuser: the permission and the model permissions are what let it in."""
    operator = make_user("public", "plain-operator", perms=OPERATOR_PERMS)
    assert not operator.is_superuser
    assert_operator_sees_all(client_for("localhost", "public", operator), history)


def test_an_operator_sees_nothing_on_a_tenants_domain(history: History) -> None:
    """An operator's login is the public schema's: unknown on a tenant's domain."""
    client = client_for("localhost", "public", make_user("public", "op", perms=OPERATOR_PERMS))
    client.defaults["HTTP_HOST"] = "t1.localhost"
    assert_sees_nothing(client, history)


def test_a_membership_rule_is_consulted_in_this_layout_too(history: History, settings) -> None:
    """TENANT_MEMBERSHIP, when set, decides in both layouts: a rule that admits nobody shuts a
    tenant's own staff out (membership is implied only while no rule is set)."""
    settings.KUMIKO_JOBS = {**settings.KUMIKO_JOBS, "TENANT_MEMBERSHIP": f"{__name__}.nobody"}
    assert_sees_nothing(client_for("t1.localhost", "t1", _alpha_staff()), history)


def nobody(user: Any, tenant: Any) -> bool:
    return False


def test_users_in_the_tenants_schemas_need_no_membership_rule() -> None:
    ids = {m.id for m in checks.run_checks(tags=[checks.Tags.admin])}
    assert "kumiko_jobs.E014" not in ids and "kumiko_jobs.E015" not in ids


def test_a_tenant_superuser_is_still_a_tenant(history: History) -> None:
    """It holds every permission of its tenant's auth tables, ``operate_tenant_runs`` too: it
    retries and cancels its tenant's runs (never another's), and gets no operators' tool."""
    boss = make_user("t1", "alpha-boss", superuser=True)
    assert_member_sees_only(client_for("t1.localhost", "t1", boss), history, "t1", may_act=True)


def test_a_member_holding_operate_tenant_runs_acts_on_its_tenants_runs_only(
    history: History,
) -> None:
    """Retry and cancel from the list and the run's page, t2's run ids posted to t1's domain
    among them: t1's runs change, t2's do not; the operators' tools stay refused."""
    user = make_user("t1", "alpha-operator", perms=TENANT_OPERATOR_PERMS)
    assert_member_sees_only(client_for("t1.localhost", "t1", user), history, "t1", may_act=True)


def test_a_member_holding_operate_tenant_runs_acts_on_nothing_elsewhere(
    history: History,
) -> None:
    """t1's user with the permission, its session sent to t2's domain and to the operators':
    unknown there (each schema its own users), nothing changes."""
    user = make_user("t1", "alpha-op", perms=TENANT_OPERATOR_PERMS)
    client = client_for("t1.localhost", "t1", user)
    for host in ("t2.localhost", "localhost"):
        client.defaults["HTTP_HOST"] = host
        assert_sees_nothing(client, history)


def test_operate_tenant_runs_is_no_operators_permission(history: History) -> None:
    """On the operators' domain acting takes ``change_jobrun``: an operator holding
    ``operate_tenant_runs`` instead (and no ``add_jobrun``: "Run a job…" would add a run)
    sees every run and acts on none."""
    unused = ("change_jobrun", "add_jobrun")
    perms = (*(p for p in OPERATOR_PERMS if p not in unused), "operate_tenant_runs")
    client = client_for("localhost", "public", make_user("public", "op-no-change", perms=perms))
    assert client.get("/admin/kumiko_jobs/jobrun/").status_code == 200
    before = snapshot()
    try_to_act(client, history)
    assert snapshot() == before


def test_anonymous_visitors_see_nothing(history: History) -> None:
    for host in ("localhost", "t1.localhost"):
        assert_sees_nothing(Client(HTTP_HOST=host), history)


def test_the_scheduler_banner_is_for_operators_only(tenants: dict[str, Any], redis_conn) -> None:
    """The run list adds its banner before Django's permission check, into the session's
    messages: public staff without ``view_all_tenants`` must not read it on the next page.
    Calibrated: gated by the domain alone, the refused list's banner shows on the index."""
    from tests.integration.test_scheduler_liveness import overdue_retry

    overdue_retry(redis_conn)
    staff = client_for(
        "localhost", "public", make_user("public", "staff-no-operator", perms=OPERATOR_MODEL_PERMS)
    )
    assert staff.get("/admin/kumiko_jobs/jobrun/").status_code == 403
    assert "Scheduler:" not in staff.get("/admin/").content.decode()
    operator = client_for("localhost", "public", make_user("public", "op", perms=OPERATOR_PERMS))
    assert "Scheduler:" in operator.get("/admin/kumiko_jobs/jobrun/").content.decode()
