"""A pytest plugin for tests/integration/test_example_project_tests.py only: during the first
test of the session it runs in, it writes how many roles the test database has on the server
(``KUMIKO_ROLES_WITNESS``, a file), so that "no roles left afterwards" is not vacuous."""

from __future__ import annotations

import os
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: Any) -> Generator[None, Any, Any]:
    path = Path(os.environ["KUMIKO_ROLES_WITNESS"])
    if not path.exists():
        from django.db import connection

        from kumiko_jobs.guard.roles import names as role_names

        with connection.cursor() as cursor:  # inside a django_db test: access is allowed
            cursor.execute(
                "SELECT count(*) FROM pg_roles WHERE rolname LIKE %s",
                [role_names.prefix() + r"\_%"],
            )
            path.write_text(f"{connection.settings_dict['NAME']} {cursor.fetchone()[0]}")
    return (yield)
