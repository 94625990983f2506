"""The metrics page with ``METRICS_TOKEN``: a scraper's bearer token instead of a session.

Through the real admin URLs (django-tenants' hosts: ``localhost`` public, ``t1.localhost``
tenant t1) with real Redis behind the page. Without a token configured, nothing changes: the
page is the operators' (tests/integration/test_dashboard.py).
"""

from __future__ import annotations

from typing import Any

import pytest
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import Client, override_settings

from tests.integration.test_dashboard import METRICS, client_for, make_user
from tests.testapp import jobs

pytestmark = pytest.mark.usefixtures("live_db")

TOKEN = "s3cr3t-metrics-token-0123456789abcdef"


def with_token(token: Any) -> Any:
    return override_settings(KUMIKO_JOBS={**settings.KUMIKO_JOBS, "METRICS_TOKEN": token})


def scrape(host: str = "localhost", authorization: str | None = None) -> Any:
    headers = {} if authorization is None else {"HTTP_AUTHORIZATION": authorization}
    return Client(HTTP_HOST=host).get(METRICS, **headers)


def test_the_right_token_reads_the_metrics_without_a_session() -> None:
    jobs.probe.enqueue(tenant="t1", tag="waiting")
    with with_token(TOKEN):
        response = scrape(authorization=f"Bearer {TOKEN}")
        assert response.status_code == 200
        assert 'kumiko_jobs_queue_depth{queue="default"} 1' in response.content.decode()
        assert "no-cache" in response["Cache-Control"]
        # The scheme is case-insensitive (RFC 7235).
        assert scrape(authorization=f"bearer {TOKEN}").status_code == 200


@pytest.mark.parametrize(
    "authorization",
    [
        f"Bearer {TOKEN}x",
        f"Bearer {TOKEN[:-1]}",
        "Bearer ",
        f"Bearer {TOKEN.upper()}",
    ],
)
def test_a_wrong_token_is_401_not_the_login_page(authorization: str) -> None:
    with with_token(TOKEN):
        response = scrape(authorization=authorization)
    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")
    assert b"kumiko_jobs_queue_depth" not in response.content


def test_without_a_token_configured_a_bearer_opens_nothing() -> None:
    response = scrape(authorization=f"Bearer {TOKEN}")
    assert response.status_code == 401
    assert b"kumiko_jobs_queue_depth" not in response.content


def test_the_token_opens_nothing_on_a_tenants_domain() -> None:
    with with_token(TOKEN):
        response = scrape("t1.localhost", authorization=f"Bearer {TOKEN}")
    assert response.status_code == 401


def test_the_token_opens_only_the_metrics_page() -> None:
    with with_token(TOKEN):
        dashboard = Client(HTTP_HOST="localhost").get(
            METRICS.replace("metrics/", "data/"), HTTP_AUTHORIZATION=f"Bearer {TOKEN}"
        )
    assert dashboard.status_code == 302 and "/login/" in dashboard["Location"]


def test_sessions_still_decide_without_a_bearer_header() -> None:
    """With a token configured: an operator's session still reads the page; a tenant's staff and
    anonymous users still do not."""
    operator = client_for(
        "localhost", "public", make_user("public", "ops", ("view_all_tenants", "view_jobrun"))
    )
    clerk = client_for("t1.localhost", "t1", make_user("t1", "clerk", ("view_jobrun",)))
    with with_token(TOKEN):
        assert operator.get(METRICS).status_code == 200
        assert clerk.get(METRICS).status_code == 403
        anonymous = scrape()
        assert anonymous.status_code == 302 and "/login/" in anonymous["Location"]


def test_a_short_token_fails_the_system_check() -> None:
    with with_token("too-short"), pytest.raises(SystemCheckError, match="E016"):
        call_command("check")
    with with_token(TOKEN):
        call_command("check")  # a long one passes


@pytest.mark.parametrize("token", ["", " padded-token-0123456789abcdefghijkl ", 42])
def test_a_token_that_is_not_a_clean_string_is_refused_at_load(token: Any) -> None:
    with with_token(token), pytest.raises(SystemCheckError, match="METRICS_TOKEN"):
        call_command("check")
