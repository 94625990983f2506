"""Settings for the test suite: the example project plus a test-only tenant app.

Services are made sure of here, before Django reads DATABASE_URL/REDIS_URL, so that the suite
(and the worker processes it starts, which import this module too) runs against the machine's
PostgreSQL and Redis, or embedded ones where none answer.
"""

from __future__ import annotations

import os

from example_project.devservices import ensure_services

ensure_services(create_database=False)
# Tests own one Redis database and flush it between tests; keep it apart from the demo's.
_redis = os.environ["REDIS_URL"].rsplit("/", 1)
if _redis[-1].isdigit():
    os.environ["REDIS_URL"] = f"{_redis[0]}/{os.environ.get('KUMIKO_TEST_REDIS_DB', '9')}"

from example_project.settings import *  # noqa: E402,F403
from example_project.settings import INSTALLED_APPS, TENANT_APPS  # noqa: E402

TENANT_APPS = [*TENANT_APPS, "tests.testapp"]
INSTALLED_APPS = [*INSTALLED_APPS, "tests.testapp"]
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
KUMIKO_JOBS = {"DB_GUARD": "enforce", "DEFAULT_RETRIES": 0}
