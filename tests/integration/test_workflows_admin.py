"""Who sees which workflows in the admin (as tests/integration/test_admin_audiences.py does for
runs): two tenants' workflows planted through real workers; a tenant's staff sees its own,
with its steps' states and progress and no operator's column, and nothing of the other's;
operators see both and may cancel; a user of one tenant sees nothing elsewhere."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test import Client

import kumiko_jobs
from kumiko_jobs.models import RunStatus, Workflow
from tests.conftest import work
from tests.integration.audiences import OPERATOR_PERMS, TENANT_STAFF_PERMS
from tests.integration.test_admin import client_for, make_user
from tests.pages import without_csrf_tokens
from tests.testapp import workflow_jobs as wf

pytestmark = pytest.mark.usefixtures("live_db", "clean_workflows")

WORKFLOWS = "/admin/kumiko_jobs/workflow/"
STAFF_PERMS = (*TENANT_STAFF_PERMS, "view_workflow")


@pytest.fixture
def clean_workflows(live_db: None) -> None:
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE kumiko_jobs_workflowstep, kumiko_jobs_workflow")


def _finished(schema: str) -> Any:
    """A workflow whose step reports progress, then one that fails; names and keys carry the
    schema so that a leak is visible in the HTML."""
    return kumiko_jobs.workflow(
        kumiko_jobs.chain(
            wf.progressing.step(tag="p", reports=2, key=f"rows-of-{schema}"),
            wf.unrecoverable.step(tag="u", key=f"broken-of-{schema}"),
        ),
        name=f"import-of-{schema}",
    ).enqueue(tenant=schema)


def _waiting(schema: str) -> Any:
    return kumiko_jobs.workflow(
        wf.record.step(tag="w", key=f"waiting-of-{schema}"), name=f"later-of-{schema}"
    ).enqueue(tenant=schema)


@pytest.fixture
def planted(tenants: Any) -> dict[str, Any]:
    """Per tenant: a finished workflow and a waiting one (no worker runs after it)."""
    finished = {schema: _finished(schema) for schema in ("t1", "t2")}
    work()
    return {schema: (finished[schema], _waiting(schema)) for schema in ("t1", "t2")}


def _staff(schema: str) -> Client:
    user = make_user(schema, f"wf-staff-{schema}", perms=STAFF_PERMS)
    return client_for(f"{schema}.localhost", schema, user)


def test_a_tenants_staff_sees_its_own_workflows_and_steps_only(planted: dict[str, Any]) -> None:
    client = _staff("t1")
    listing = client.get(WORKFLOWS)
    assert listing.status_code == 200
    listed = {str(w.pk) for w in listing.context["cl"].result_list}
    assert listed == {planted["t1"][0].workflow_id, planted["t1"][1].workflow_id}
    # Nothing names t2, the CSRF tokens aside (random letters and digits, "t2" among them by
    # chance in about one page of 60).
    html = without_csrf_tokens(listing.content.decode())
    assert "import-of-t1" in html and "t2" not in html.replace("t1", "")
    page = client.get(f"{WORKFLOWS}{planted['t1'][0].workflow_id}/change/")
    assert page.status_code == 200
    text = without_csrf_tokens(page.content.decode())
    # The tree: each step's key, state and progress; a failed step stays visible as failed.
    assert "rows-of-t1" in text and "100 % · row 2 of 2" in text
    assert "broken-of-t1" in text and "failed" in text
    # ... and its edges: the chain's first step leads to the second, in the order built.
    assert "→ broken-of-t1" in text
    assert text.index("rows-of-t1") < text.index("→ broken-of-t1")
    # No operator's column: no reason, no run id, no tenant's schema column, no cancel action.
    assert "cancel_selected" not in html
    assert "Reason" not in text and "Run id" not in text


def test_another_tenants_workflow_is_not_found(planted: dict[str, Any]) -> None:
    client = _staff("t1")
    for handle in planted["t2"]:
        response = client.get(f"{WORKFLOWS}{handle.workflow_id}/change/")
        assert response.status_code == 302  # the admin's "not found": back to the index
        assert "/kumiko_jobs/" not in response["Location"].split("?")[0]
        followed = client.get(response["Location"]).content.decode()
        assert "of-t2" not in followed
    searched = client.get(WORKFLOWS, {"q": "import-of-t2"})
    assert searched.status_code == 200 and not list(searched.context["cl"].result_list)
    # A lookup the tenant's list does not offer is not honoured (no probing hidden fields).
    probed = client.get(WORKFLOWS, {"schema_name": "t2"})
    assert probed.status_code in (200, 302, 400)  # refused, or ignored
    if probed.status_code == 200:
        assert "of-t2" not in probed.content.decode()


def test_a_tenants_staff_cannot_cancel(planted: dict[str, Any]) -> None:
    client = _staff("t1")
    waiting = planted["t1"][1]
    client.post(WORKFLOWS, {"action": "cancel_selected", "_selected_action": [waiting.workflow_id]})
    assert Workflow.objects.get(pk=waiting.workflow_id).status == RunStatus.RUNNING


@pytest.mark.parametrize("host", ["t2.localhost", "localhost"])
def test_a_user_of_t1_sees_no_workflow_on_another_domain(
    planted: dict[str, Any], host: str
) -> None:
    client = _staff("t1")
    client.defaults["HTTP_HOST"] = host
    for url in [WORKFLOWS, *(f"{WORKFLOWS}{h.workflow_id}/change/" for h in planted["t2"])]:
        response = client.get(url)
        assert response.status_code in (302, 403), (url, response.status_code)
        assert "of-t" not in response.content.decode()


def test_an_operator_sees_every_tenants_workflows_and_may_cancel(
    planted: dict[str, Any],
) -> None:
    operator = make_user("public", "wf-operator", perms=(*OPERATOR_PERMS, "view_workflow"))
    client = client_for("localhost", "public", operator)
    listing = client.get(WORKFLOWS)
    assert listing.status_code == 200
    assert {str(w.pk) for w in listing.context["cl"].result_list} == {
        h.workflow_id for pair in planted.values() for h in pair
    }
    page = client.get(f"{WORKFLOWS}{planted['t2'][0].workflow_id}/change/").content.decode()
    assert "broken-of-t2" in page and "Reason" in page
    assert "→ broken-of-t2" in page  # the operator's steps show the edges too
    waiting = planted["t2"][1]
    client.post(WORKFLOWS, {"action": "cancel_selected", "_selected_action": [waiting.workflow_id]})
    assert Workflow.objects.get(pk=waiting.workflow_id).status == RunStatus.CANCELLED
