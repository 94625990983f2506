"""The dashboard in a real browser (Debian's headless Chromium): its charts draw the history's
numbers, and a tenant's console draws only that tenant's.

Runs are executed by a real RQ worker before the browser starts; the charts' drawn data
(``data-points`` on each chart, kept by charts.js) is compared with the history. Screenshots
go to /tmp (``kumiko_dashboard_*.png``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from kumiko_jobs.models import JobRun, RunStatus
from tests.browser.support import NEEDS_CHROMIUM, SCREENSHOTS, chromium, log_in
from tests.conftest import start_rqworker, work
from tests.integration.test_dashboard import make_user
from tests.testapp import jobs

pytestmark = NEEDS_CHROMIUM

DASHBOARD = "/admin/kumiko_jobs/jobrun/dashboard/"
CONSOLE = "/admin/kumiko_jobs/jobrun/console/"


@pytest.fixture
def history(tenants: dict[str, Any]) -> dict[str, int]:
    """Three succeeded runs in t1, one failed for good in t2; an operator and a t1 clerk."""
    from django.core.cache import cache

    cache.clear()
    for n in range(3):
        jobs.probe.enqueue(tenant="t1", tag=f"ok-{n}")
    jobs.flaky.enqueue(tenant="t2", tag="bad", fail_times=99)
    work(scheduler_rounds=8)
    make_user("public", "operator", ("view_all_tenants", "view_jobrun"))
    make_user("public", "actor", ("view_all_tenants", "view_jobrun", "change_jobrun"))
    make_user("t1", "clerk", ("view_jobrun",))
    runs = JobRun.objects.all()
    return {
        "succeeded": runs.filter(status=RunStatus.SUCCEEDED).count(),
        "failed": runs.filter(status=RunStatus.FAILED).count(),
        "t1_runs": runs.filter(schema_name="t1").count(),
    }


@pytest.fixture
def browser(history: dict[str, int], server: int) -> Iterator[Any]:
    """Chromium, started after the data exists (tests/browser/support.py)."""
    with chromium() as launched:
        yield launched


def drawn(page: Any, chart: str) -> dict[str, list[float | None]]:
    """The series a chart drew, by name (charts.js keeps them on the element)."""
    locator = page.locator(f'[data-chart="{chart}"]')
    locator.locator("svg").first.wait_for()
    points = json.loads(locator.get_attribute("data-points"))
    return {s["name"]: s["values"] for s in points["series"]}


def test_charts_draw_the_history(server: int, browser: Any, history: dict[str, int]) -> None:
    context = browser.new_context(viewport={"width": 1280, "height": 1100})
    page = context.new_page()
    base = f"http://localhost:{server}"
    log_in(page, base, "operator")
    page.goto(base + DASHBOARD)
    throughput = drawn(page, "throughput")
    assert sum(v or 0 for v in throughput["succeeded"]) == history["succeeded"] == 3
    assert sum(v or 0 for v in throughput["failed"]) == history["failed"] == 1
    assert any(v for v in drawn(page, "duration")["p95"])
    assert page.locator('[data-table="failures"] a', has_text=jobs.flaky.name).count() == 1
    page.screenshot(path=str(SCREENSHOTS / "kumiko_dashboard_operator.png"), full_page=True)
    context.close()

    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    tenant = f"http://t1.localhost:{server}"
    log_in(page, tenant, "clerk")
    page.goto(tenant + CONSOLE)
    days = drawn(page, "days")
    assert sum(v or 0 for v in days["runs"]) == history["t1_runs"] == 3
    assert sum(v or 0 for v in days["failed"]) == 0  # t2's failure is not t1's
    assert jobs.flaky.name not in page.content()
    page.screenshot(path=str(SCREENSHOTS / "kumiko_dashboard_tenant.png"), full_page=True)
    context.close()


def test_retry_all_of_a_failure_group_from_the_dashboard(
    server: int, browser: Any, history: dict[str, int]
) -> None:
    """The failure group's "retry all…" link, the confirmation page's count, the confirm button,
    the operation's progress page; the batch runs in a real ``rqworker --burst`` process."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    base = f"http://localhost:{server}"
    log_in(page, base, "actor")
    page.goto(base + DASHBOARD)
    page.locator('[data-table="failures"] a', has_text="retry all").click()
    page.wait_for_selector(".kj-bulk-count")
    assert page.locator("#content-main").get_attribute("data-count") == str(history["failed"])
    assert "1 run matches. Retry it?" in page.locator(".kj-bulk-count").inner_text()
    page.screenshot(path=str(SCREENSHOTS / "kumiko_bulk_confirm.png"), full_page=True)
    page.locator(".kj-bulk-confirm").click()
    page.wait_for_url("**/kumiko_jobs/bulkoperation/*/change/")
    assert "Started: retry of 1 run" in page.locator(".messagelist").inner_text()

    worker = start_rqworker("default", "--burst")
    output, _ = worker.communicate(timeout=120)
    assert worker.returncode == 0, output[-2000:]
    page.reload()
    fields = page.locator("fieldset").inner_text()
    assert page.locator(".fieldBox.field-state .readonly").inner_text().strip() == "done", fields
    assert page.locator(".fieldBox.field-done .readonly").inner_text().strip() == "1", fields
    page.goto(base + "/admin/kumiko_jobs/bulkoperation/")
    assert "1 / 1" in page.locator("#result_list").inner_text()
    page.screenshot(path=str(SCREENSHOTS / "kumiko_bulk_operations.png"), full_page=True)

    # An operator who may not act on runs sees no such link.
    other = browser.new_context().new_page()
    log_in(other, base, "operator")
    other.goto(base + DASHBOARD)
    other.locator('[data-table="failures"] a').first.wait_for()
    assert other.locator('[data-table="failures"] a', has_text="retry all").count() == 0
    context.close()


@pytest.fixture
def paused(history: dict[str, int]) -> None:
    """Tenant t2 paused, and an operator who may pause and resume (before the browser starts:
    no query once Playwright's loop runs)."""
    from kumiko_jobs.worker import pauses

    pauses.pause(tenant="t2", by="ops")
    make_user(
        "public",
        "pauser",
        ("view_all_tenants", "view_jobrun", "add_flowpause", "delete_flowpause"),
    )


def test_pause_and_resume_from_the_dashboard(paused: None, server: int, browser: Any) -> None:
    """A pause in force is listed with its "resume…" link; a queue's "pause…" link opens the
    pauses' form filled in, whose save pauses it; "resume…" and the delete confirmation resume
    it. An operator without the pauses' permissions sees neither link."""
    context = browser.new_context(viewport={"width": 1280, "height": 1100})
    page = context.new_page()
    base = f"http://localhost:{server}"
    log_in(page, base, "pauser")
    page.goto(base + DASHBOARD)
    paused_table = page.locator('[data-table="pauses"]')
    paused_table.locator("a", has_text="resume…").wait_for()
    assert "t2" in paused_table.inner_text()
    queue = page.locator('[data-table="queues"] tbody tr', has_text="default")
    queue.locator("a", has_text="pause…").click()
    page.wait_for_url("**/kumiko_jobs/flowpause/add/?queue=default")
    assert page.locator("#id_queue").input_value() == "default"
    page.locator('input[name="_save"]').click()
    # The admin's message (the pauser may not view the pauses' list: it lands on the index).
    page.locator(".messagelist", has_text="queue default").wait_for()

    page.goto(base + DASHBOARD)
    queue = page.locator('[data-table="queues"] tbody tr', has_text="default")
    queue.locator("td", has_text="paused").wait_for()
    page.screenshot(path=str(SCREENSHOTS / "kumiko_dashboard_pauses.png"), full_page=True)
    t2 = page.locator('[data-table="pauses"] tbody tr', has_text="t2")
    t2.locator("a", has_text="resume…").click()
    page.locator('#content input[type="submit"]').click()
    page.locator(".messagelist", has_text="deleted").wait_for()
    page.goto(base + DASHBOARD)
    page.locator('[data-table="pauses"] tbody tr', has_text="default").wait_for()
    assert "t2" not in page.locator('[data-table="pauses"]').inner_text()

    other = browser.new_context().new_page()
    log_in(other, base, "operator")
    other.goto(base + DASHBOARD)
    other.locator('[data-table="pauses"] tbody tr', has_text="default").wait_for()
    assert other.locator('[data-table="pauses"] a').count() == 0
    assert other.locator('[data-table="queues"] a').count() == 0
    context.close()
