"""The operators' pauses page (admin/pauses.py): adding a row pauses, deleting it resumes,
through worker.pauses; a tenant's domain has no such page, even for a tenant superuser."""

from __future__ import annotations

import pytest

from kumiko_jobs.models import FlowPause, JobRun, RunStatus
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
