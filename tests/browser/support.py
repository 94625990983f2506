"""What the browser tests share: Debian's headless Chromium, where screenshots go, logging in.

The served project is ``server`` (tests/browser/conftest.py). Each file's ``browser`` fixture
starts Chromium with ``chromium()`` after the fixtures that write its data: Playwright's sync API
runs an event loop in the test's thread, and Django refuses database calls under a running loop,
so every query of a test happens before Chromium starts.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_admin import PASSWORD

CHROMIUM = Path("/usr/bin/chromium")
SCREENSHOTS = Path("/tmp")

# Every browser test file's pytestmark.
NEEDS_CHROMIUM = [
    pytest.mark.browser,
    pytest.mark.skipif(
        not CHROMIUM.exists(),
        reason="needs Debian's chromium at /usr/bin/chromium (apt-get install chromium)",
    ),
]


@contextmanager
def chromium() -> Iterator[Any]:
    """Debian's Chromium, headless, through Playwright; closed on the way out."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(CHROMIUM),
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
            ],
        )
        try:
            yield browser
        finally:
            browser.close()


def log_in(page: Any, base: str, username: str) -> None:
    """Log ``username`` in on the admin at ``base`` (the test users' one password)."""
    page.goto(f"{base}/admin/login/?next=/admin/kumiko_jobs/jobrun/")
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url(f"{base}/admin/kumiko_jobs/jobrun/")
