"""Settings for ``tests/unit`` alone: the test project, and no service needed to start.

``tests/settings.py`` (the whole suite) makes sure of PostgreSQL and Redis first, claims a Redis
database and a test database of its own, then uses these settings. The unit tests use neither
service, so ``scripts/test tests/unit`` selects this module (``DJANGO_SETTINGS_MODULE``), and
they start and pass with both unreachable: CI runs them so, before the full suite (.ci/run).
A unit test that reaches for the database is refused by pytest-django (no ``django_db`` mark);
one that reaches for Redis fails on the unreachable ``REDIS_URL``.
"""

from __future__ import annotations

import os

from example_project.settings import *  # noqa: F403
from example_project.settings import INSTALLED_APPS, SHARED_APPS, TENANT_APPS

# tests.guardapp.shared: a shared app (public only) with an upper-case db_table (issue 22).
SHARED_APPS = [*SHARED_APPS, "tests.guardapp.shared"]
TENANT_APPS = [*TENANT_APPS, "tests.testapp", "tests.guardapp"]
INSTALLED_APPS = [*INSTALLED_APPS, "tests.testapp", "tests.guardapp", "tests.guardapp.shared"]
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
# PUSH_FAILURE_PAUSE is per process: a test that stops Redis must not leave the next test's
# enqueues to the relay. test_outages turns it on where it is the subject.
# DB_ROLES: tenant job bodies log in as their tenant's role (docs/guard.md, "Two walls").
KUMIKO_JOBS = {
    "DB_GUARD": "enforce",
    "DEFAULT_RETRIES": 0,
    "PUSH_FAILURE_PAUSE": 0,
    "DB_ROLES": os.environ.get("KUMIKO_TEST_DB_ROLES", "1") == "1",
}
