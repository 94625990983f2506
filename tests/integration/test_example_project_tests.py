"""The example project's own tests run as a project's would: their own pytest session, with
only ``kumiko_jobs.testing`` and pytest-django (example_project/conftest.py), and nothing of
this repository's suite. Under ``DB_ROLES`` their tenants get database roles, server-wide; the
plugin must drop them when the session's test database goes.

Proven able to fail: with the plugin's ``pytest_fixture_post_finalizer`` removed, the roles
of the example's test database stay behind and the last assertion fails.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

from django.db import connection

from kumiko_jobs.guard.roles import names as role_names
from tests.conftest import ROOT
from tests.guardapp.support import Observer


def test_the_example_projects_tests_pass_with_the_plugin_alone_and_leave_no_roles(
    live_db: None, tmp_path: Path
) -> None:
    database = f"test_kumiko_example_{os.getpid()}"
    witness = tmp_path / "roles"
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env.update(
        KUMIKO_TEST_DATABASE=database,
        KUMIKO_ROLES_WITNESS=str(witness),
        PYTHONPATH=str(ROOT),
    )
    observer = Observer()
    try:
        ran = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "example_project",
                "--ds",
                "example_project.settings",
                "-p",
                "tests.integration.roles_witness",
                "-p",
                "no:cacheprovider",
                "-q",
            ],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
        assert " passed" in ran.stdout and "failed" not in ran.stdout
        # During the session, the test database's tenant had its roles (so "none left" counts).
        name, count = witness.read_text().split()
        assert name == database and int(count) == 3 + 2  # t1's three logins, the two groups
        gone = "SELECT count(*) = 0 FROM pg_database WHERE datname = %s"
        assert observer.value(gone, [database])
        left = observer.rows(
            "SELECT rolname FROM pg_roles WHERE rolname LIKE %s",
            [role_names.prefix_of(database) + r"\_%"],
        )
        assert left == [], f"the session left its roles behind: {left}"
    finally:
        with contextlib.suppress(Exception), observer.conn.cursor() as cursor:
            role_names.drop_roles_of_dropped_database(cursor, database)  # what a failure left
        observer.close()
    assert connection.settings_dict["NAME"] != database  # this suite's database is its own
