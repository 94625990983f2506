"""The operators' pauses page (admin/pauses.py): adding a row pauses, deleting it resumes,
through worker.pauses; a tenant's domain has no such page, even for a tenant superuser."""

from __future__ import annotations

import pytest

from kumiko_jobs.models import FlowPause, JobRun, RunStatus
from kumiko_jobs.worker import pauses
from tests.conftest import work
from tests.integration.test_admin import client_for, make_user
from tests.integration.test_admin import operator as operator  # fixture
from tests.integration.test_admin import operator_user as operator_user  # fixture
from tests.testapp import jobs

pytestmark = pytest.mark.usefixtures("live_db")
PAGE = "/admin/kumiko_jobs/flowpause/"


def test_an_operator_pauses_and_resumes_a_tenant_from_the_admin(operator, tenants):
    response = operator.post(PAGE + "add/", {"queue": "", "job_name": "", "schema_name": "t1"})
    assert response.status_code == 302, response.content[:2000]
    pause = FlowPause.objects.get()
    assert (pause.schema_name, pause.paused_by) == ("t1", "operator")
    handle = jobs.probe.enqueue(tenant="t1", tag="held")
    work()
    assert JobRun.objects.get(pk=handle.run_id).status == RunStatus.QUEUED
    runs = operator.get("/admin/kumiko_jobs/jobrun/").content.decode()
    assert "paused (tenant t1)" in runs
    # In German the whole phrase is German (the rule's words were English inside it).
    german = operator.get("/admin/kumiko_jobs/jobrun/", HTTP_ACCEPT_LANGUAGE="de")
    assert "pausiert (Mandant t1)" in german.content.decode()

    response = operator.post(f"{PAGE}{pause.pk}/delete/", {"post": "yes"})
    assert response.status_code == 302
    assert not FlowPause.objects.exists()
    work()
    assert JobRun.objects.get(pk=handle.run_id).status == RunStatus.SUCCEEDED


def test_the_form_refuses_what_names_nothing_real(operator, tenants):
    for data, message in (
        ({"queue": "nosuch"}, "no queue"),
        ({"queue": "default", "job_name": "testapp.probe"}, "pause a queue on its own"),
        ({"schema_name": "nosuch"}, "no tenant with schema"),
        ({}, "name what to pause"),
    ):
        form = {"queue": "", "job_name": "", "schema_name": "", **data}
        response = operator.post(PAGE + "add/", form)
        assert response.status_code == 200 and message in response.content.decode(), data
    assert not FlowPause.objects.exists()


def test_a_tenant_superuser_cannot_pause_or_see_pauses(tenants):
    boss = client_for("t1.localhost", "t1", make_user("t1", "boss", superuser=True))
    assert boss.get(PAGE).status_code in (403, 404)
    response = boss.post(PAGE + "add/", {"queue": "default", "job_name": "", "schema_name": ""})
    assert response.status_code in (403, 404)
    assert not FlowPause.objects.exists()


def test_staff_of_the_operators_domain_without_view_all_tenants_cannot_pause_or_resume(tenants):
    """Operators are those holding ``view_all_tenants`` (core/audience.py), not whoever signs in
    on the public schema's domain: with users shared by every tenant (layout (b)), a tenant's
    staff user signs in there too, and the pause permissions may reach it through a group.
    Holding ``add_``, ``delete_`` and ``view_flowpause`` without ``view_all_tenants`` it may
    neither pause another tenant (or a whole queue) nor resume an operator's pause.

    Calibrated: with ``has_add_permission`` asking ``is_operator_request()`` only (as before),
    the POST pauses t2 (the assertion on ``FlowPause`` fails)."""
    staff = client_for(
        "localhost",
        "public",
        make_user(
            "public", "pauser", perms=("add_flowpause", "delete_flowpause", "view_flowpause")
        ),
    )
    assert staff.get(PAGE + "add/").status_code == 403
    response = staff.post(PAGE + "add/", {"queue": "", "job_name": "", "schema_name": "t2"})
    assert response.status_code == 403
    assert not FlowPause.objects.exists()
    handle = jobs.probe.enqueue(tenant="t2", tag="not-held")
    work()
    assert JobRun.objects.get(pk=handle.run_id).status == RunStatus.SUCCEEDED

    pauses.pause("", "", "t1", by="operator")
    pause = FlowPause.objects.get()
    staff.post(f"{PAGE}{pause.pk}/delete/", {"post": "yes"})
    staff.post(PAGE, {"action": "resume_selected", "index": 0, "_selected_action": [pause.pk]})
    assert FlowPause.objects.filter(pk=pause.pk).exists()
    held = jobs.probe.enqueue(tenant="t1", tag="held")
    work()
    assert JobRun.objects.get(pk=held.run_id).status == RunStatus.QUEUED
    pauses.resume("", "", "t1")
