"""Who sees which runs in the admin with users shared by every tenant (layout (b): auth in
SHARED_APPS only, django-tenant-users' ``tenants`` link, its rule in TENANT_MEMBERSHIP).

Here a staff user holding ``view_jobrun`` holds it on every domain, so the domain alone decided
nothing: before issue 23 a user of alpha read beta's runs on beta's domain and every tenant's
on the operators' domain. Every kumiko page, action and the "Run a job…" form are asked
(tests/integration/audiences.py, the same checks as layout (a)'s).

Runs in its own pytest process (the user model is fixed per process), started by
tests/integration/test_admin_shared_auth.py. Calibrated: with ``is_tenant_member`` answering
True on any tenant's domain and ``sees_all_tenants`` answering ``is_operator_request()`` (the
audience by domain alone, as before), the alpha-on-beta, alpha-on-operators, no-rule and
operator-on-a-tenant tests fail.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.core import checks
from django.test import Client

from example_project.customers.models import Client as Tenant
from tests.integration.audiences import (
    OPERATOR_PERMS,
    TENANT_OPERATOR_PERMS,
    TENANT_STAFF_PERMS,
    History,
    assert_acts_only_on,
    assert_member_sees_only,
    assert_operator_sees_all,
    assert_sees_nothing,
    make_history,
)

pytestmark = pytest.mark.usefixtures("live_db")


@pytest.fixture
def history(tenants: dict[str, Any]) -> History:
    return make_history()


def member(
    username: str, *, of: tuple[str, ...] = (), perms: tuple[str, ...] = (), superuser: bool = False
) -> Any:
    """A staff user of the shared user table, linked to the tenants ``of`` (its memberships)."""
    user_model = get_user_model()
    user = user_model.objects.filter(username=username).first() or user_model(username=username)
    user.is_staff, user.is_superuser = True, superuser
    user.save()
    found = list(
        Permission.objects.filter(content_type__app_label="kumiko_jobs", codename__in=perms)
    )
    assert len(found) == len(perms), perms
    user.user_permissions.set(found)
    user.tenants.set(Tenant.objects.filter(schema_name__in=of))
    return user


def signed_in(user: Any, host: str) -> Client:
    client = Client(HTTP_HOST=host)
    client.force_login(user)  # one session table, the public schema's, for every domain
    return client


@pytest.fixture
def alpha_staff() -> Any:
    return member("alpha-staff", of=("t1",), perms=TENANT_STAFF_PERMS)


def test_users_are_shared_in_this_layout() -> None:
    from kumiko_jobs.core import audience

    assert not audience.users_live_in_tenants()
    assert audience.tenant_users_field() is not None


def test_a_member_sees_only_its_tenant(history: History, alpha_staff: Any) -> None:
    assert_member_sees_only(signed_in(alpha_staff, "t1.localhost"), history, "t1")


def test_a_user_of_alpha_sees_nothing_on_betas_domain(history: History, alpha_staff: Any) -> None:
    assert_sees_nothing(signed_in(alpha_staff, "t2.localhost"), history)


def test_a_user_of_alpha_sees_nothing_on_the_operators_domain(
    history: History, alpha_staff: Any
) -> None:
    assert_sees_nothing(signed_in(alpha_staff, "localhost"), history)


def test_an_operator_with_view_all_tenants_sees_all(history: History) -> None:
    operator = member("operator", perms=OPERATOR_PERMS)
    assert_operator_sees_all(signed_in(operator, "localhost"), history)


def test_an_operator_is_no_member_of_a_tenant(history: History) -> None:
    """An operator who belongs to no tenant sees nothing on a tenant's domain: the operators'
    view is on the operators' domain."""
    operator = member("operator", perms=OPERATOR_PERMS)
    assert_sees_nothing(signed_in(operator, "t1.localhost"), history)


def test_a_superuser_sees_a_tenant_only_as_its_member(history: History) -> None:
    """A superuser holds every permission, ``operate_tenant_runs`` too, yet on t2's domain gets
    t2's view and acts on t2's runs only (t1's ids posted there change nothing), and on t1's
    domain, not being t1's member, sees and changes nothing."""
    root = member("root", superuser=True, of=("t2",))
    assert_member_sees_only(signed_in(root, "t2.localhost"), history, "t2", may_act=True)
    assert_sees_nothing(signed_in(root, "t1.localhost"), history)


def test_a_superuser_sees_all_as_operator(history: History) -> None:
    root = member("root", superuser=True, of=("t2",))
    assert_operator_sees_all(signed_in(root, "localhost"), history)


def test_a_member_holding_operate_tenant_runs_acts_on_its_tenants_runs_only(
    history: History,
) -> None:
    """One user table: the permission holds on every domain, so membership and the run's schema
    are all that keep alpha's user off beta's runs. On t1's domain it retries and cancels t1's
    runs (t2's ids posted there change nothing); on t2's domain and the operators' it sees and
    changes nothing."""
    user = member("alpha-operator", of=("t1",), perms=TENANT_OPERATOR_PERMS)
    assert_member_sees_only(signed_in(user, "t1.localhost"), history, "t1", may_act=True)
    for host in ("t2.localhost", "localhost"):
        assert_sees_nothing(signed_in(user, host), history)


def test_a_member_of_both_tenants_acts_on_each_only_on_its_domain(history: History) -> None:
    """Member of t1 and t2 with the permission: on t1's domain, t2's run ids (the list's actions,
    t2's run pages) change nothing of t2's, and the other way round."""
    user = member("both-operator", of=("t1", "t2"), perms=TENANT_OPERATOR_PERMS)
    assert_acts_only_on(signed_in(user, "t1.localhost"), history, "t1")
    assert_acts_only_on(signed_in(user, "t2.localhost"), history, "t2")


def test_without_a_rule_a_tenants_domain_shows_nothing_and_check_says_why(
    history: History, alpha_staff: Any, settings: Any
) -> None:
    settings.KUMIKO_JOBS = {**settings.KUMIKO_JOBS, "TENANT_MEMBERSHIP": None}
    assert_sees_nothing(signed_in(alpha_staff, "t1.localhost"), history)
    found = [m for m in checks.run_checks(tags=[checks.Tags.admin]) if m.id == "kumiko_jobs.E014"]
    assert len(found) == 1 and found[0].is_serious()
    assert "'kumiko_jobs.core.audience.django_tenant_users'" in (found[0].hint or "")
    # The operators' view does not depend on the rule.
    operator = member("operator", perms=OPERATOR_PERMS)
    assert_operator_sees_all(signed_in(operator, "localhost"), history)


def test_a_rule_of_the_projects_own_decides(history: History, settings: Any) -> None:
    """A callable of the project's (here: the user's last name is the tenant's schema) is what
    decides, not the ``tenants`` link."""
    settings.KUMIKO_JOBS = {**settings.KUMIKO_JOBS, "TENANT_MEMBERSHIP": f"{__name__}.by_name"}
    user = member("named", of=("t1",), perms=TENANT_STAFF_PERMS)
    user.last_name = "t2"
    user.save()
    assert_member_sees_only(signed_in(user, "t2.localhost"), history, "t2")
    assert_sees_nothing(signed_in(user, "t1.localhost"), history)


def by_name(user: Any, tenant: Any) -> bool:
    return bool(user.last_name == tenant.schema_name)


def test_a_rule_that_cannot_work_is_a_check_error(settings: Any) -> None:
    for path, says in (
        ("tests.shared_auth.no_such_module.rule", "cannot be imported"),
        (f"{__name__}.SETTINGS_NOT_A_FUNCTION", "not callable"),
    ):
        settings.KUMIKO_JOBS = {**settings.KUMIKO_JOBS, "TENANT_MEMBERSHIP": path}
        found = [
            m for m in checks.run_checks(tags=[checks.Tags.admin]) if m.id.startswith("kumiko")
        ]
        assert [m.id for m in found] == ["kumiko_jobs.E015"], found
        assert says in found[0].msg


SETTINGS_NOT_A_FUNCTION = "a string"


def test_a_tenants_staff_holding_the_pause_permissions_cannot_pause_on_the_operators_domain(
    tenants: dict[str, Any],
) -> None:
    """One user table: alpha's staff user signs in on the operators' domain too, and a project
    that hands its tenants' staff every kumiko permission (a group, say) gives it
    ``add_flowpause`` and ``delete_flowpause``. Without ``view_all_tenants`` it may not pause
    beta, nor a whole queue (admin/pauses.py). Calibrated: with the pauses' permission asking
    for the public domain only, as before, the POST paused t2."""
    from kumiko_jobs.models import FlowPause

    user = member(
        "alpha-pauser",
        of=("t1",),
        perms=(*TENANT_OPERATOR_PERMS, "add_flowpause", "delete_flowpause", "view_flowpause"),
    )
    client = signed_in(user, "localhost")
    page = "/admin/kumiko_jobs/flowpause/add/"
    assert client.get(page).status_code == 403
    for form in ({"schema_name": "t2"}, {"queue": "default"}):
        data = {"queue": "", "job_name": "", "schema_name": "", **form}
        assert client.post(page, data).status_code == 403
    assert not FlowPause.objects.exists()
