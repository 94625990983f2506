"""Settings for the test suite: the example project plus the test-only tenant apps.

Services are made sure of here, before Django reads DATABASE_URL/REDIS_URL, so that the suite
(and the worker processes it starts, which import this module too) runs against the machine's
PostgreSQL and Redis, or embedded ones where none answer. The settings themselves are
``tests/settings_unit.py``'s, which ``tests/unit`` uses alone (no service needed).
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

# KUMIKO_TEST_PROJECT_USER=1: the suite connects as a non-superuser project user holding only
# the privileges docs/guard.md lists for DB_ROLES (LOGIN, CREATEDB for the test database it
# then owns, CREATEROLE), as a production project user would; created here once, by the
# configured (superuser) user. Worker processes inherit the rewritten DATABASE_URL.
PROJECT_USER = "kj_test_project_user"
if os.environ.get("KUMIKO_TEST_PROJECT_USER") == "1" and "@" in os.environ["DATABASE_URL"]:
    from urllib.parse import urlparse

    import psycopg

    _url = urlparse(os.environ["DATABASE_URL"])
    if _url.username != PROJECT_USER:
        with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as _admin:
            if not _admin.execute(
                "SELECT 1 FROM pg_roles WHERE rolname = %s", [PROJECT_USER]
            ).fetchone():
                _admin.execute(
                    f'CREATE ROLE "{PROJECT_USER}" LOGIN CREATEDB CREATEROLE '
                    "NOSUPERUSER NOREPLICATION NOBYPASSRLS PASSWORD 'kumiko-test-only'"
                )
        _netloc = f"{PROJECT_USER}:kumiko-test-only@{_url.hostname}:{_url.port or 5432}"
        # The suites' observer (a second connection that plants victims and reads effects,
        # tests/guardapp/support.py) keeps the administrator's credentials: it is the
        # test's eye, not the system under test.
        os.environ["KUMIKO_TEST_ADMIN_DATABASE_URL"] = os.environ["DATABASE_URL"]
        os.environ["DATABASE_URL"] = _url._replace(netloc=_netloc).geturl()

# Everything else is the unit tests' settings (tests/settings_unit.py), one definition for both.
from tests.settings_unit import *  # noqa: E402,F403
