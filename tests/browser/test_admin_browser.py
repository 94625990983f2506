"""The operator and a tenant use the admin in a real browser (Debian's headless Chromium).

The app is served by a real threaded WSGI server on 127.0.0.1; Chromium resolves
``*.localhost`` to the loopback address by itself, so ``localhost`` reaches the public schema
(operators) and ``t1.localhost`` tenant t1, exactly as django-tenants routes production hosts.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest

from kumiko_jobs.models import JobRun, RunStatus
from tests.browser.support import NEEDS_CHROMIUM, SCREENSHOTS, chromium, log_in
from tests.conftest import work
from tests.integration.test_admin import make_user
from tests.testapp import jobs

T1_SECRET = "s3cr3t-browser-t1"
T2_SECRET = "s3cr3t-browser-t2"
GERMAN_FAILURE = "Der Testauftrag ist wiederholt fehlgeschlagen und wurde aufgegeben."

pytestmark = NEEDS_CHROMIUM


# The django_db mark makes pytest-django create the test database even when this file runs
# alone: the browser test only uses live_db, which does not ask for one.
@pytest.mark.django_db
def test_admin_assets_are_found_for_the_test_server():
    from django.contrib.staticfiles import finders

    assert finders.find("admin/css/base.css")


@pytest.fixture
def runs(tenants: dict[str, Any]) -> dict[str, JobRun]:
    """Real runs in t1 and t2 (succeeded, failed for good, queued), and the two users."""
    handles = {
        "t1_ok": jobs.probe.enqueue(tenant="t1", tag="t1-ok", payload={"secret": T1_SECRET}),
        "t2_ok": jobs.probe.enqueue(tenant="t2", tag="t2-ok", payload={"secret": T2_SECRET}),
        "t1_bad": jobs.flaky.enqueue(tenant="t1", tag="t1-bad", fail_times=99),
    }
    work(scheduler_rounds=3)
    handles["t1_waiting"] = jobs.probe.enqueue(tenant="t1", tag="t1-waiting")
    found = {name: JobRun.objects.get(pk=h.run_id) for name, h in handles.items()}
    assert found["t1_bad"].status == RunStatus.FAILED
    make_user("public", "operator", superuser=True)
    make_user("t1", "clerk", perms=("view_jobrun", "view_jobfailure"))
    return found


@pytest.fixture
def browser(runs: dict[str, JobRun], server: int) -> Iterator[Any]:
    """Chromium, started after the data exists (tests/browser/support.py)."""
    with chromium() as launched:
        yield launched


def column(page: Any, name: str) -> list[str]:
    return [
        cell.strip() for cell in page.locator(f"#result_list td.field-{name}").all_inner_texts()
    ]


def test_operator_and_tenant_admin_in_chromium(server, browser, runs):
    operator_base = f"http://localhost:{server}"
    tenant_base = f"http://t1.localhost:{server}"

    # --- the operator: every tenant, payloads, and the retry action -------------------------
    context = browser.new_context(locale="en-US", viewport={"width": 1280, "height": 800})
    page = context.new_page()
    log_in(page, operator_base, "operator")
    assert sorted(column(page, "tenant")) == ["t1", "t1", "t1", "t2"]
    assert "tag=t2-ok" in column(page, "subject_cell")
    assert page.get_by_role("link", name="Run a job…").is_visible()
    page.screenshot(path=str(SCREENSHOTS / "kumiko_admin_operator_runs.png"), full_page=True)

    page.locator("#result_list tr", has_text="tag=t1-ok").get_by_role("link").first.click()
    page.wait_for_url(re.compile(r".*/jobrun/[0-9a-f-]{36}/change/$"))
    assert T1_SECRET in page.inner_text("#content")
    page.screenshot(path=str(SCREENSHOTS / "kumiko_admin_operator_run.png"), full_page=True)

    page.goto(f"{operator_base}/admin/kumiko_jobs/jobrun/")
    page.locator("#result_list tr", has_text="tag=t1-bad").locator("input.action-select").check()
    page.select_option("select[name=action]", "retry_selected")
    page.click("button[name=index]")
    assert "1 run retried." in page.inner_text("ul.messagelist")
    assert sorted(column(page, "status_label")).count("queued") == 2  # the retry is queued
    context.close()

    # --- the tenant, reading German: its own runs, in its words, nothing else ---------------
    context = browser.new_context(locale="de-DE", viewport={"width": 1280, "height": 800})
    page = context.new_page()
    log_in(page, tenant_base, "clerk")
    html = page.content()
    subjects = column(page, "subject_cell")
    assert sorted(subjects) == ["tag=t1-bad", "tag=t1-bad", "tag=t1-ok", "tag=t1-waiting"]
    assert any(GERMAN_FAILURE in cell for cell in column(page, "status_and_problem"))
    for hidden in (T1_SECRET, T2_SECRET, "t2-ok", "boom on attempt", "RuntimeError", "Traceback"):
        assert hidden not in html, hidden
    # No actions for a member without operate_tenant_runs (test_tenant_operate_browser.py: with)
    assert page.locator("input.action-select").count() == 0
    page.screenshot(path=str(SCREENSHOTS / "kumiko_admin_tenant_runs_de.png"), full_page=True)

    page.goto(f"{tenant_base}/admin/kumiko_jobs/jobfailure/")
    assert column(page, "message") == [GERMAN_FAILURE]
    page.screenshot(path=str(SCREENSHOTS / "kumiko_admin_tenant_failures_de.png"), full_page=True)

    page.goto(f"{tenant_base}/admin/kumiko_jobs/jobrun/{runs['t1_ok'].run_id}/change/")
    content = page.inner_text("#content")
    assert "tag=t1-ok" in content and T1_SECRET not in page.content()
    page.screenshot(path=str(SCREENSHOTS / "kumiko_admin_tenant_run_de.png"), full_page=True)

    # Another tenant's run by URL: the admin answers as if it did not exist.
    page.goto(f"{tenant_base}/admin/kumiko_jobs/jobrun/{runs['t2_ok'].run_id}/change/")
    assert page.url == f"{tenant_base}/admin/"
    assert "t2-ok" not in page.content() and T2_SECRET not in page.content()

    # The tenant's login means nothing on the operator's host (sessions live per schema).
    page.goto(f"{operator_base}/admin/kumiko_jobs/jobrun/")
    assert page.url.startswith(f"{operator_base}/admin/login/")
    context.close()
