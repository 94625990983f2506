"""Settings for the test suite: the example project plus a test-only tenant app.

Services are made sure of here, before Django reads DATABASE_URL/REDIS_URL, so that the suite
(and the worker processes it starts, which import this module too) runs against the machine's
PostgreSQL and Redis, or embedded ones where none answer.
"""

from __future__ import annotations

import os

from example_project.devservices import ensure_services

ensure_services(create_database=False)


def _claim_redis_db() -> str:
    """A Redis database of our own: the suite flushes it, so two suites must not share one.

    The claim is a key in database 0 that expires; worker processes inherit the choice through
    KUMIKO_TEST_REDIS_DB. The demo uses database 1 and the benchmarks their own below 9.
    """
    import redis

    base = os.environ["REDIS_URL"].rsplit("/", 1)[0]
    client = redis.Redis.from_url(f"{base}/0")
    for db in range(15, 8, -1):
        key = f"kumiko_jobs:test-suite-owns-db:{db}"
        if not client.set(key, os.getpid(), nx=True, ex=3 * 3600):
            continue
        import atexit

        atexit.register(client.delete, key)
        return str(db)
    raise RuntimeError("Redis databases 9-15 are all claimed by running test suites")


if "KUMIKO_TEST_REDIS_DB" not in os.environ:
    os.environ["KUMIKO_TEST_REDIS_DB"] = _claim_redis_db()
    # One test database per suite, for the same reason.
    os.environ.setdefault("KUMIKO_TEST_DATABASE", f"test_kumiko_{os.getpid()}")
os.environ["REDIS_URL"] = (
    f"{os.environ['REDIS_URL'].rsplit('/', 1)[0]}/{os.environ['KUMIKO_TEST_REDIS_DB']}"
)

from example_project.settings import *  # noqa: E402,F403
from example_project.settings import INSTALLED_APPS, TENANT_APPS  # noqa: E402

TENANT_APPS = [*TENANT_APPS, "tests.testapp", "tests.guardapp"]
INSTALLED_APPS = [*INSTALLED_APPS, "tests.testapp", "tests.guardapp"]
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
