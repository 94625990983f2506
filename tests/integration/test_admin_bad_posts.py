"""An action's POST with a ticked id that is not one is answered 400, never a 500, on every kumiko
list that has actions, for a tenant's member and for an operator; and ``?_facets=1`` counts
nothing (Django's facets count every row a list could show, once per filter choice, outside the
bounded paginator). Found by a reviewer's attack: both were a 500 / full-history counts.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration.audiences import OPERATOR_PERMS, TENANT_OPERATOR_PERMS, make_history
from tests.integration.test_admin import client_for, make_user

pytestmark = pytest.mark.usefixtures("live_db")

RUNS = "/admin/kumiko_jobs/jobrun/"


def _member() -> Any:
    user = make_user("t1", "alpha-operator", perms=TENANT_OPERATOR_PERMS)
    return client_for("t1.localhost", "t1", user)


def _operator() -> Any:
    return client_for("localhost", "public", make_user("public", "ops", perms=OPERATOR_PERMS))


@pytest.mark.parametrize(
    ("who", "url", "action"),
    [
        ("member", RUNS, "cancel_selected"),
        ("operator", RUNS, "cancel_selected"),
        ("operator", "/admin/kumiko_jobs/workflow/", "cancel_selected"),
        ("operator", "/admin/kumiko_jobs/bulkoperation/", "stop_selected"),
    ],
)
@pytest.mark.parametrize("bad", ["not-a-uuid", "1' OR '1'='1", "x" * 2000])
def test_an_action_on_an_id_that_is_not_one_is_a_400(
    tenants: dict[str, Any], who: str, url: str, action: str, bad: str
) -> None:
    history = make_history()
    client = _member() if who == "member" else _operator()
    good = history.runs["t1_waiting"].pk.hex if url == RUNS else None
    selected = [bad] if good is None else [good, bad]
    response = client.post(url, {"action": action, "index": 0, "_selected_action": selected})
    assert response.status_code == 400, response.status_code
    assert "not an id of this list" in response.content.decode()


def test_a_well_formed_action_post_still_acts(tenants: dict[str, Any]) -> None:
    """The allowed path: the same POST with real ids is served (a redirect back to the list)."""
    history = make_history()
    run = history.runs["t1_waiting"]
    response = _member().post(
        RUNS, {"action": "cancel_selected", "index": 0, "_selected_action": [run.pk.hex]}
    )
    assert response.status_code == 302


@pytest.mark.parametrize("who", ["member", "operator"])
def test_facets_are_not_counted(tenants: dict[str, Any], who: str) -> None:
    make_history()
    client = _member() if who == "member" else _operator()
    response = client.get(RUNS, {"_facets": "1"})
    assert response.status_code == 200
    assert response.context["cl"].add_facets is False
