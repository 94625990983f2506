"""The admin's audiences with users shared by every tenant (tests/shared_auth/), in a pytest
process of its own: ``AUTH_USER_MODEL`` and the apps of the tenants' schemas are fixed for a
process, so that layout cannot run beside this suite's. Its own test database (and roles,
dropped at its end as this suite's are); this suite's Redis database, which this test leaves
alone while the other process uses it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

from tests.conftest import ROOT

SUITE = "tests/shared_auth"
SETTINGS = "tests.shared_auth.settings"


def test_the_shared_users_layout_suite_passes() -> None:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": SETTINGS,
        # Its own test database: this suite's is in use.
        "KUMIKO_TEST_DATABASE": f"test_kumiko_{os.getpid()}_shared_auth",
        "PYTHONPATH": str(ROOT),
    }
    env.pop("PYTEST_ADDOPTS", None)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", SUITE, "--ds", SETTINGS, "-q", "-p", "no:randomly"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    output = result.stdout[-20_000:] + result.stderr[-5_000:]
    assert result.returncode == 0, output
    summary = re.search(r"(\d+) passed", result.stdout)
    assert summary and int(summary.group(1)) >= 10, output  # it ran, and every test of it
    assert " failed" not in result.stdout.splitlines()[-1], output
