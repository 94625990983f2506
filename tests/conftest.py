"""Fixtures for tests on the real PostgreSQL (django-tenants schemas) and the real Redis.

Integration tests use committed data, because the RQ workers that run their jobs are other
connections (or other processes). The session creates the test database and three tenants
once; ``live_db`` empties the run history, the tenants' tables and the test Redis database
before each test.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest

# The testing plugin, as a project using kumiko_jobs loads it: the kumiko_jobs fixture, and the
# session's clean-up (tenant logins closed, the test database's roles dropped at the end).
pytest_plugins = ["kumiko_jobs.testing"]

ROOT = Path(__file__).resolve().parent.parent
TENANTS = ("t1", "t2", "t3")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under ``KUMIKO_TEST_SLOTS`` (tests/slot_harness.py) the suite's runs are in a sibling
    slot, not on the test's thread, and the neighbours' statements are the process's too: a
    test that watches the worker's connection, pool or counters through its own thread, or
    counts the whole process, is skipped there (``one_slot``)."""
    from tests import slot_harness

    if slot_harness.slots_wanted() <= 1:
        return
    skip = pytest.mark.skip(reason="watches the worker through the test's thread (one_slot)")
    for item in items:
        if item.get_closest_marker("one_slot"):
            item.add_marker(skip)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Before the test's fixtures are torn down (tests/slot_harness.py ``end_test``)."""
    from tests import slot_harness

    slot_harness.end_test()


@pytest.fixture(scope="session", autouse=True)
def _pinned_slot_thread(request: pytest.FixtureRequest) -> Iterator[None]:
    """Under ``KUMIKO_TEST_SLOTS``: the pinned slot's connections closed before the test
    database is dropped (its thread lives for the session, tests/slot_harness.py)."""
    from tests import slot_harness

    if slot_harness.slots_wanted() > 1:
        request.getfixturevalue("django_db_setup")
    yield
    slot_harness.close()
    if slot_harness.slots_wanted() > 1:
        with request.getfixturevalue("django_db_blocker").unblock():
            _end_other_sessions()


def _end_other_sessions() -> None:
    """At four slots, a slot thread of some earlier test's worker can still hold a session on
    the test database when the session ends (test_dead_connections.py then test_async_jobs.py
    show it; which run's session it is, not found yet), and Django's DROP DATABASE then fails
    the last test's teardown. The
    suites' assertions are over by then: end those sessions so the drop can run. Only at
    several slots, so that the one-slot suite still shows any connection a run leaves open."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )


@pytest.fixture(scope="session")
def django_db_setup(django_test_environment: None, django_db_blocker: Any) -> Iterator[None]:
    """Create the test database (always: ``live_db`` tests carry no ``django_db`` mark, so
    pytest-django's own fixture would set up nothing and leave the settings on the real
    database), migrate every schema, and create the public tenant and three tenants."""
    from django.test.utils import setup_databases, teardown_databases

    from example_project.customers.models import Client, Domain

    with django_db_blocker.unblock():
        db_cfg = setup_databases(verbosity=0, interactive=False, aliases={"default"})
        for schema, name, domain in (
            ("public", "Operator", "localhost"),
            *((s, f"Tenant {s.upper()}", f"{s}.localhost") for s in TENANTS),
        ):
            tenant = Client.objects.filter(schema_name=schema).first()
            if tenant is None:
                tenant = Client(schema_name=schema, name=name)
                tenant.save()  # creates and migrates the schema
            Domain.objects.get_or_create(
                domain=domain, defaults={"tenant": tenant, "is_primary": True}
            )
    yield
    # The plugin (kumiko_jobs.testing) closes the tenants' logins before this teardown and
    # drops the database's roles after it, as it does for any project's django_db_setup.
    with django_db_blocker.unblock():
        teardown_databases(db_cfg, verbosity=0)


def _truncate_all() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        # kumiko_jobs_flowpause too: a pause a failed test left would hold later tests' runs.
        cursor.execute(
            "TRUNCATE kumiko_jobs_jobattempt, kumiko_jobs_jobrun, kumiko_jobs_jobfailure, "
            "kumiko_jobs_rejectedmessage, kumiko_jobs_escapehatchuse, kumiko_jobs_bootmarker, "
            "kumiko_jobs_flowpause, kumiko_jobs_runrollup, kumiko_jobs_runrollupmark, "
            "kumiko_jobs_workertimerollup, kumiko_jobs_tenantdayrollup"
        )
        for schema in TENANTS:
            cursor.execute(
                f'TRUNCATE "{schema}".testapp_probe, "{schema}".billing_invoice, '
                f'"{schema}".billing_activitylog'
            )


@pytest.fixture
def redis_conn() -> Any:
    from kumiko_jobs import transport

    return transport.connection_for("default")


def refuse_unless_test_database() -> None:
    """Raise unless the default database is a test database (``test_...``): what empties tables
    (``live_db``, the guard suites' seed) asks first, so that a changed ``django_db_setup``
    that left the settings on a development database fails instead of emptying it."""
    from django.db import connection

    name = str(connection.settings_dict["NAME"])
    if not name.startswith("test_"):
        raise RuntimeError(
            f"refusing to run against {name!r}: not a test database (its name does not start "
            "with test_)"
        )


@pytest.fixture
def live_db(django_db_setup: None, django_db_blocker: Any, redis_conn: Any) -> Iterator[None]:
    """Real commits (no wrapping transaction), clean tables and a flushed test Redis db; on a
    test database only (``refuse_unless_test_database``)."""
    from django.db import connection

    with django_db_blocker.unblock():
        refuse_unless_test_database()
        connection.set_schema_to_public()
        _truncate_all()
        redis_conn.flushdb()
        yield
        connection.set_schema_to_public()


@pytest.fixture
def tenants(live_db: None) -> dict[str, Any]:
    from example_project.customers.models import Client

    return {c.schema_name: c for c in Client.objects.filter(schema_name__in=TENANTS)}


def work(queue: str = "default", *, scheduler_rounds: int = 0) -> int:
    """Run an in-process kumiko worker (a real RQ SimpleWorker) until the queue is empty.

    With ``scheduler_rounds``, also act as ``rqscheduler`` between bursts: move due scheduled
    messages (retries with a delay, deferrals) to the queue, waiting up to ~2 s for each.
    Returns the number of messages the scheduler moved.
    """
    from kumiko_jobs import transport
    from kumiko_jobs.worker import Worker
    from tests import slot_harness

    q = transport.get_queue(queue)
    moved = 0
    slots = slot_harness.slots_wanted()
    for round_ in range(scheduler_rounds + 1):
        if slots > 1:  # KUMIKO_TEST_SLOTS: the suites at several slots (tests/slot_harness.py)
            slot_harness.work_in_slots(queue, slots)
        else:
            Worker([q], connection=q.connection).work(burst=True)
        if round_ == scheduler_rounds:
            break
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            n = transport.move_due_scheduled_jobs(queue)
            if n:
                moved += n
                break
            if not transport.scheduled_job_ids(queue):
                return moved
            time.sleep(0.1)
    return moved


@pytest.fixture
def run_worker() -> Callable[..., int]:
    return work


def worker_env() -> dict[str, str]:
    from django.db import connection

    env = dict(os.environ)
    env["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    url = os.environ["DATABASE_URL"].rsplit("/", 1)[0]
    env["DATABASE_URL"] = f"{url}/{connection.settings_dict['NAME']}"
    env["PYTHONPATH"] = str(ROOT)
    return env


def kumiko_jobs_command(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``python manage.py kumiko_jobs ARGS`` as a user types it: its own process, the test
    database (``worker_env``); returns the finished process (its code is the caller's to read)."""
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "kumiko_jobs", *args],
        cwd=ROOT,
        env=worker_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def start_rqworker(*args: str) -> subprocess.Popen[str]:
    """``manage.py rqworker ARGS`` in its own process, as a user would start it."""
    return subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), "rqworker", *args],
        cwd=ROOT,
        env=worker_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@pytest.fixture
def rqworker_process() -> Callable[..., subprocess.Popen[str]]:
    return start_rqworker


def probes(schema: str) -> list[Any]:
    from django_tenants.utils import schema_context

    from tests.testapp.models import Probe

    with schema_context(schema):
        return list(Probe.objects.order_by("id"))


@contextmanager
def redis_round_trips() -> Iterator[dict[str, int]]:
    """Round trips to Redis from this thread (not a worker's beat or maintenance threads): a
    command, or a whole pipeline, attempts included. Counts the real client; mocks nothing."""
    from redis.client import Pipeline, Redis

    counts = {"trips": 0}
    command, execute = Redis.execute_command, Pipeline.execute
    caller = threading.get_ident()

    def counted_command(self: Any, *args: Any, **kwargs: Any) -> Any:
        counts["trips"] += threading.get_ident() == caller
        return command(self, *args, **kwargs)

    def counted_execute(self: Any, *args: Any, **kwargs: Any) -> Any:
        counts["trips"] += threading.get_ident() == caller
        return execute(self, *args, **kwargs)

    Redis.execute_command = counted_command  # type: ignore[method-assign]
    Pipeline.execute = counted_execute  # type: ignore[method-assign]
    try:
        yield counts
    finally:
        Redis.execute_command = command  # type: ignore[method-assign]
        Pipeline.execute = execute  # type: ignore[method-assign]


@pytest.fixture
def declare(request: pytest.FixtureRequest) -> Iterator[Callable[..., Any]]:
    """Register jobs for one test (the registry is frozen after start-up, on purpose).

    Jobs are named ``<JOB_PREFIX>.<function>``, with the test module's ``JOB_PREFIX``.
    """
    from kumiko_jobs.definition.registry import registry
    from kumiko_jobs.enqueueing.api import define

    prefix = getattr(request.module, "JOB_PREFIX", "test")

    with ExitStack() as declared:

        def add(func: Any, **options: Any) -> Any:
            definition = define(func, {"name": f"{prefix}.{func.__name__}", **options})
            declared.enter_context(registry.override(definition))
            return definition

        yield add
