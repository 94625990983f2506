"""Red team, round 4 (tests/integration/test_red_team_round4.py has the runs' table): a
tenant's staff user, on its own domain, after the other tenant's runs, through every admin URL
an attacker can write (lookups and searches the list may not offer, the autocomplete view, t2's
object ids in change, history and view-on-site URLs, "Run a job..." naming t2).

Calibrated: ``test_calibration_the_probes_see_t2_without_the_tenant_filter`` (the list filtered
on the wrong schema shows t2's runs to the member, and the needles find them).
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection

from kumiko_jobs.models import JobRun

pytestmark = pytest.mark.usefixtures("live_db")


# --- 5. a tenant's staff, on its own domain, after the other tenant's runs ----------------------

RUNS = "/admin/kumiko_jobs/jobrun/"


@pytest.fixture
def member_and_history(tenants: dict[str, Any]) -> tuple[Any, Any]:
    from tests.integration.audiences import TENANT_STAFF_PERMS, make_history
    from tests.integration.test_admin import client_for, make_user

    history = make_history()
    user = make_user("t1", "gx-alpha-staff", perms=TENANT_STAFF_PERMS)
    return client_for("t1.localhost", "t1", user), history


def _t2_ids(history: Any) -> list[str]:
    return [r.pk.hex for r in history.runs.values() if r.schema_name == "t2"] + [
        str(r.pk) for r in history.runs.values() if r.schema_name == "t2"
    ]


def _leaks(text: str, history: Any, url: str = "") -> list[str]:
    """t2's run ids, secret and tags in the answer, but for what the attacker wrote in the URL (the
    admin echoes a search term, and names an id it did not find)."""
    from tests.integration.audiences import SECRETS

    needles = [*_t2_ids(history), SECRETS["t2"], "tag=t2-"]
    return [n for n in needles if n in text and n not in url]


ADMIN_PROBES = [
    pytest.param(lambda h: f"{RUNS}?schema_name=t2", id="list-filtered-to-t2"),
    pytest.param(lambda h: f"{RUNS}?schema_name__exact=t2", id="list-lookup-exact-t2"),
    pytest.param(lambda h: f"{RUNS}?schema_name__in=t1,t2", id="list-lookup-in"),
    pytest.param(lambda h: f"{RUNS}?q={h.runs['t2_ok'].pk.hex}", id="search-by-t2-run-id"),
    pytest.param(lambda h: f"{RUNS}?q=s3cr3t-of-t2", id="search-by-t2-payload"),
    pytest.param(lambda h: f"{RUNS}?run_id={h.runs['t2_ok'].pk}", id="list-lookup-run-id"),
    pytest.param(lambda h: f"{RUNS}?payload__secret=s3cr3t-of-t2", id="list-lookup-json-path"),
    pytest.param(
        lambda h: (
            "/admin/autocomplete/?app_label=kumiko_jobs&model_name=jobattempt&field_name=run&term="
        ),
        id="autocomplete-attempt-run",
    ),
    pytest.param(lambda h: f"{RUNS}{h.runs['t2_ok'].pk}/change/", id="t2-run-change"),
    pytest.param(
        lambda h: f"{RUNS}{h.runs['t2_ok'].pk}/history/?_changelist_filters=schema_name%3Dt2",
        id="t2-run-history",
    ),
    pytest.param(
        lambda h: f"/admin/r/{_content_type_id()}/{h.runs['t2_ok'].pk}/", id="view-on-site"
    ),
]


def _content_type_id() -> int:
    from django.contrib.contenttypes.models import ContentType

    return int(ContentType.objects.get_for_model(JobRun).pk)


@pytest.mark.parametrize("url", ADMIN_PROBES)
def test_a_tenant_member_sees_nothing_of_the_other_tenant_through_any_admin_url(
    member_and_history, url
):
    client, history = member_and_history
    address = url(history)
    response = client.get(address, follow=True)
    text = response.content.decode(errors="replace")
    assert _leaks(text, history, address) == [], (response.status_code, text[:500])
    changelist = (response.context or {}).get("cl")
    if changelist is not None:
        assert {r.schema_name for r in changelist.result_list} <= {"t1"}


def test_calibration_the_admin_shows_t2_when_the_member_is_an_operator(member_and_history):
    """The same probe on the operators' domain, by an operator: t2's run is on the page (the
    needles and the page are right)."""
    from tests.integration.test_admin import client_for, make_user

    _, history = member_and_history
    operator = client_for("localhost", "public", make_user("public", "gx-op", superuser=True))
    text = operator.get(f"{RUNS}?q={history.runs['t2_ok'].pk.hex}").content.decode()
    assert _leaks(text, history)


def test_a_tenant_member_cannot_run_a_job_in_the_other_tenant(member_and_history):
    from tests.integration.audiences import MANUAL, RUN_JOB

    client, _ = member_and_history
    connection.set_schema_to_public()
    before = JobRun.objects.filter(schema_name="t2", job_name=MANUAL["job"]).count()
    client.post(RUN_JOB, {**MANUAL, "tenant": "t2"})
    client.post(RUN_JOB, {**MANUAL, "tenant": "t2", "schema_name": "t2"})
    connection.set_schema_to_public()
    assert JobRun.objects.filter(schema_name="t2", job_name=MANUAL["job"]).count() == before


def test_calibration_the_probes_see_t2_without_the_tenant_filter(member_and_history, monkeypatch):
    """``get_queryset`` filtering on the wrong schema (t2's, not the domain's): the list probe
    and the change page of t2's run show t2's run to the member."""
    from kumiko_jobs.admin import audiences

    monkeypatch.setattr(audiences, "tenant_schema", lambda: "t2")
    client, history = member_and_history
    listed = client.get(RUNS)
    assert listed.status_code == 200, (listed.status_code, listed.get("Location"))
    assert {r.schema_name for r in listed.context["cl"].result_list} == {"t2"}
    page = client.get(f"{RUNS}{history.runs['t2_ok'].pk}/change/").content.decode()
    assert _leaks(page, history, f"{RUNS}{history.runs['t2_ok'].pk}/change/")
