"""A tenant's member retries and cancels its own runs in a real browser (Debian's headless
Chromium): from the console's failed count to the run list's retry action, and a run page's
Cancel button; a real ``rqworker --burst`` process then runs the retry in the tenant's schema.

Screenshots go to /tmp (``kumiko_tenant_*.png``): docs/images/dashboard_tenant.png is the
console's (a failed count, linked), docs/images/tenant_run_controls.png the run page's,
docs/images/tenant_run_refused.png a run page without the button (``tenant_operable=False``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest

from kumiko_jobs.models import RunStatus
from tests.browser.support import NEEDS_CHROMIUM, SCREENSHOTS, chromium, log_in
from tests.conftest import start_rqworker, work
from tests.integration.seed_runs import plant
from tests.integration.test_dashboard import make_user
from tests.testapp import jobs

pytestmark = NEEDS_CHROMIUM

RUNS = "/admin/kumiko_jobs/jobrun/"
CONSOLE = f"{RUNS}console/"


@pytest.fixture
def history(tenants: dict[str, Any]) -> dict[str, str]:
    """In t1: two succeeded runs, a failed one (a retry can run it again) and a queued one; in
    t2 a failed one. A t1 member who may act, and one who may only look."""
    from django.core.cache import cache

    cache.clear()
    for n in range(2):
        jobs.probe.enqueue(tenant="t1", tag=f"ok-{n}")
    work()
    failed, queued = plant("t1", [RunStatus.FAILED, RunStatus.QUEUED])
    (other,) = plant("t2", [RunStatus.FAILED])
    make_user("t1", "t1-operator", ("view_jobrun", "operate_tenant_runs"))
    make_user("t1", "clerk", ("view_jobrun",))
    return {"failed": str(failed.pk), "queued": str(queued.pk), "other": str(other.pk)}


@pytest.fixture
def browser(history: dict[str, str], server: int) -> Iterator[Any]:
    """Chromium, started after the data exists (tests/browser/support.py)."""
    with chromium() as launched:
        yield launched


def test_a_member_retries_from_the_console_and_cancels_from_the_run_page(
    server: int,
    browser: Any,
    history: dict[str, str],
) -> None:
    context = browser.new_context(locale="en-US", viewport={"width": 1280, "height": 900})
    page = context.new_page()
    base = f"http://t1.localhost:{server}"
    log_in(page, base, "t1-operator")

    # The console: the job's failed count links to its failed runs.
    page.goto(base + CONSOLE)
    row = page.locator('[data-table="jobs"] tbody tr', has_text=jobs.probe.name)
    row.locator("a").wait_for()
    assert row.locator("a").inner_text() == "1"
    page.screenshot(path=str(SCREENSHOTS / "kumiko_tenant_console_failures.png"), full_page=True)
    row.locator("a").click()
    page.wait_for_url(re.compile(r".*/kumiko_jobs/jobrun/\?.*status__exact=failed.*"))
    checkboxes = page.locator("input.action-select")
    assert checkboxes.count() == 1  # t1's failed run; t2's is not listed
    assert checkboxes.first.get_attribute("value") == history["failed"]
    checkboxes.first.check()
    page.select_option("select[name=action]", "retry_selected")
    page.click("button[name=index]")
    assert "1 run retried." in page.inner_text("ul.messagelist")

    # The queued run's page: Cancel, and no Retry (it has not failed).
    page.goto(f"{base}{RUNS}{history['queued']}/change/")
    assert page.locator("button.kj-run-retry").count() == 0
    page.screenshot(path=str(SCREENSHOTS / "kumiko_tenant_run_controls.png"), full_page=True)
    with page.expect_navigation():
        page.locator("button.kj-run-cancel").click()
    assert page.url == f"{base}{RUNS}{history['queued']}/change/"
    assert "1 run cancelled." in page.inner_text("ul.messagelist")
    assert page.locator("button.kj-run-cancel").count() == 0  # nothing left to cancel

    # A real worker process runs the retry, in t1's schema.
    worker = start_rqworker("default", "--burst")
    output, _ = worker.communicate(timeout=120)
    assert worker.returncode == 0, output[-2000:]
    page.goto(f"{base}{RUNS}?status__exact=succeeded")
    assert page.locator("input.action-select").count() == 3  # two earlier runs and the retry
    # t2's failed run by URL, and its act URL by hand: not this domain's.
    page.goto(f"{base}{RUNS}{history['other']}/change/")
    assert page.url == f"{base}/admin/"
    context.close()

    # A member who may only look gets neither the actions nor the buttons.
    context = browser.new_context(locale="en-US")
    page = context.new_page()
    log_in(page, base, "clerk")
    assert page.locator("select[name=action]").count() == 0
    page.goto(f"{base}{RUNS}{history['failed']}/change/")
    assert page.locator("form.kj-run-control").count() == 0
    context.close()


@pytest.fixture
def operators_only(history: dict[str, str]) -> str:
    """t1's failed run made a run of ``operators_only`` (``tenant_operable=False``), and an
    operator who may act; before Chromium starts (no database access beside its loop)."""
    from kumiko_jobs.models import JobRun

    JobRun.objects.filter(pk=history["failed"]).update(job_name=jobs.operators_only.name)
    make_user("public", "ops", ("view_all_tenants", "view_jobrun", "change_jobrun"))
    return history["failed"]


def test_a_run_of_an_operators_only_job_says_why_it_has_no_button(
    server: int,
    operators_only: str,
    browser: Any,
) -> None:
    """``@job(tenant_operable=False)``: the member's page of its failed run shows the sentence
    (in the browser's language) where the Retry button would be; the operators' shows the
    button."""
    context = browser.new_context(locale="de-DE")
    page = context.new_page()
    base = f"http://t1.localhost:{server}"
    log_in(page, base, "t1-operator")
    page.goto(f"{base}{RUNS}{operators_only}/change/")
    assert page.locator("form.kj-run-control").count() == 0
    assert page.inner_text("p.kj-run-refused-retry") == (
        "Nur die Betreiber wiederholen oder brechen die Läufe dieses Auftrags ab."
    )
    page.screenshot(path=str(SCREENSHOTS / "kumiko_tenant_run_refused.png"), full_page=True)
    context.close()

    context = browser.new_context(locale="en-US")
    page = context.new_page()
    base = f"http://localhost:{server}"
    log_in(page, base, "ops")
    page.goto(f"{base}{RUNS}{operators_only}/change/")
    assert page.locator("button.kj-run-retry").count() == 1
    assert page.locator("p.kj-run-refused-retry").count() == 0
    context.close()
