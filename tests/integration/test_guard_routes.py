"""Every route: ways a tenant job's database access could go around the execute wrapper.

Each case is a real run of ``guardapp.route`` (tenant t1, no grants) through a real RQ worker
(in this process, so ``override_settings`` reaches it). Each is calibrated: with
``DB_GUARD = "off"`` the route reaches t2 or the public schema (the effect is seen through a
second connection); with ``"enforce"`` the run fails with the expected error and the effect is
absent, checked through that second connection, not only by the error.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connection, connections
from django.test import override_settings
from django_tenants.utils import tenant_context

from kumiko_jobs import InvalidJob, signals
from kumiko_jobs.definition.options import build_definition
from kumiko_jobs.guard.wrapper import GuardWrapper
from kumiko_jobs.models import JobRun, RunStatus
from tests import slot_harness
from tests.conftest import work
from tests.guardapp import jobs, route_jobs, support

pytestmark = pytest.mark.usefixtures("live_db")


@pytest.fixture(autouse=True)
def _first_wall_only() -> Iterator[None]:
    """The classifier (the first wall) on its own: every run of this module shares the test's
    connection, as with DB_ROLES off. The second wall has its own suites (test_db_roles.py and
    the calibrated attack suite)."""
    with override_settings(KUMIKO_JOBS=FIRST_WALL):
        yield


# The classifier (the first wall) on its own, as with DB_ROLES off: these runs share the
# test's connection. The routes also run with the roles on, in the calibrated attack suite.
FIRST_WALL = {**settings.KUMIKO_JOBS, "DB_ROLES": False}
OFF = {**FIRST_WALL, "DB_GUARD": "off"}


@pytest.fixture
def guard_data(live_db: None) -> Iterator[None]:
    support.seed()
    original = connections["default"]
    yield
    if connections["default"] is not original:
        # replaced_default_shared_write dropped the thread's wrapper; pytest-django's teardown
        # closes the one it set up, so that one must be the default again.
        connections["default"].close()
        connections["default"] = original
    # A connection the async ORM opened in asgiref's executor thread (guard off) must not
    # outlive the test: the next one expects that thread to connect during its run.
    asyncio.run(sync_to_async(connections.close_all)())
    if route_jobs.NEW_ALIAS in connections.settings:
        connections[route_jobs.NEW_ALIAS].close()
        del connections[route_jobs.NEW_ALIAS]
        del connections.settings[route_jobs.NEW_ALIAS]
    support.clean()


observed = support.observed


def plan_exists(name: str) -> bool:
    return bool(observed("SELECT 1 FROM public.catalog_plan WHERE name = %s", [name]))


def leaked_into_t1() -> bool:
    rows = observed("SELECT value FROM t1.guardapp_finding WHERE key = 'leaked'")
    return any("t2-value" in row[0] for row in rows)


def t2_secrets() -> list[tuple[Any, ...]]:
    return observed("SELECT label, value FROM t2.guardapp_secret ORDER BY id")


@dataclass(frozen=True)
class Route:
    reached: Callable[[], bool]  # the route's effect, seen through a second connection
    error_type: str  # of the run that is stopped
    says: str  # part of its error message


ROUTES: dict[str, Route] = {
    "callproc": Route(leaked_into_t1, "DatabaseAccessDenied", "call_function"),
    "executemany": Route(lambda: len(t2_secrets()) > 1, "DatabaseAccessDenied", "insert"),
    "copy": Route(leaked_into_t1, "DatabaseAccessDenied", "copy"),
    "stream": Route(leaked_into_t1, "DatabaseAccessDenied", "cross_tenant_reads"),
    "new_alias_shared_write": Route(
        lambda: plan_exists("via-new-alias"), "DatabaseAccessDenied", "shared table"
    ),
    "replaced_default_shared_write": Route(
        lambda: plan_exists("via-fresh-wrapper"), "DatabaseAccessDenied", "shared table"
    ),
    "async_orm": Route(lambda: plan_exists("via-async-orm"), "DatabaseAccessDenied", "async ORM"),
    "async_to_sync": Route(
        lambda: plan_exists("via-async-to-sync"), "DatabaseAccessDenied", "shared table"
    ),
    "exception_str": Route(
        lambda: plan_exists("via-exception-str"), "HostileError", "could not be rendered"
    ),
    "exception_cause": Route(
        lambda: plan_exists("via-exception-str"), "RuntimeError", "the outer error"
    ),
    "exception_group": Route(lambda: plan_exists("via-exception-str"), "ExceptionGroup", "several"),
    "dbshell": Route(lambda: t2_secrets() == [], "DatabaseAccessDenied", "dbshell"),
}


def _run_route(case: str) -> JobRun:
    with tenant_context(_t1()):
        handle = route_jobs.route.enqueue(case=case)
    work()
    connection.set_schema_to_public()
    return JobRun.objects.get(pk=handle.run_id)


def _t1() -> Any:
    from example_project.customers.models import Client

    return Client.objects.get(schema_name="t1")


@pytest.mark.parametrize("case", sorted(ROUTES))
def test_route_reaches_other_data_with_the_guard_off(tenants, guard_data, case):
    with override_settings(KUMIKO_JOBS=OFF):
        run = _run_route(case)
    if case in slot_harness.MAIN_THREAD_ONLY and slot_harness.slots_wanted() > 1:
        # No such route in a sibling slot: Python refuses it (slot_harness.py).
        assert (run.status, run.error_type) == (RunStatus.FAILED, "ValueError"), run.error_message
        return
    assert ROUTES[case].reached(), f"{case}: the calibration did not reach t2 or public"


@pytest.mark.parametrize("case", sorted(ROUTES))
def test_route_is_stopped_by_the_guard(tenants, guard_data, case):
    route = ROUTES[case]
    run = _run_route(case)
    assert run.status == RunStatus.FAILED, (case, run.status, run.error_message)
    assert run.error_type == route.error_type, (run.error_type, run.error_message)
    assert route.says in run.error_message + run.attempt_set.get().traceback
    assert run.attempts == 1
    assert not route.reached(), f"{case} reached t2 or public with the guard on"
    assert t2_secrets() == [("t2-secret", "t2-value")]
    assert observed("SELECT name FROM public.catalog_plan ORDER BY name") == [("basic",), ("pro",)]


def test_the_exception_is_rendered_in_the_runs_own_tenant(tenants, guard_data):
    """Rendered in public (where the history is written), this __str__ would find no table."""
    run = _run_route("exception_reads_own")
    assert run.status == RunStatus.FAILED
    assert run.error_type == "ReadingError"
    assert run.error_message == "own secrets: t1-value"
    assert "ReadingError: own secrets: t1-value" in run.attempt_set.get().traceback


def test_a_connection_made_during_the_run_is_in_its_schema_and_guarded_only_meanwhile(
    tenants, guard_data
):
    run = _run_route("new_alias_reads_own")
    assert run.status == RunStatus.SUCCEEDED, run.error_message
    assert observed("SELECT value FROM t1.guardapp_finding WHERE key = 'new_alias'") == [
        ("t1-value",)
    ]
    new = connections[route_jobs.NEW_ALIAS]
    assert not any(isinstance(w, GuardWrapper) for w in new.execute_wrappers)
    assert new.schema_name == "public"  # type: ignore[attr-defined]


def test_callproc_of_an_allowed_function_still_works(tenants, guard_data):
    with tenant_context(_t1()), connection.cursor() as cursor:
        cursor.callproc("lower", ["ABC"])  # outside a run: Django's own callproc
        assert cursor.fetchone() == ("abc",)


# --- receivers and system follow-ups: refused whatever the guard's mode ----------------------


def test_a_receiver_runs_after_the_run_in_public_calibration(tenants, guard_data):
    """Why a job must not connect one: it runs after the run, unguarded, in public."""
    signals.job_succeeded.connect(route_jobs._receiver_writes_plan, weak=False)
    try:
        with tenant_context(_t1()):
            jobs.rename_people.enqueue(name="x")
        work()
    finally:
        signals.job_succeeded.disconnect(route_jobs._receiver_writes_plan)
    assert plan_exists("via-receiver")


@pytest.mark.parametrize("mode", [OFF, FIRST_WALL])
def test_a_job_cannot_connect_a_receiver(tenants, guard_data, mode):
    with override_settings(KUMIKO_JOBS=mode):
        run = _run_route("connect_receiver")
        with tenant_context(_t1()):
            later = jobs.rename_people.enqueue(name="x")
        work()
    assert run.status == RunStatus.FAILED
    assert run.error_type == "InvalidJob"
    assert "AppConfig.ready()" in run.error_message
    assert JobRun.objects.get(pk=later.run_id).status == RunStatus.SUCCEEDED
    assert route_jobs._receiver_writes_plan not in [r[1] for r in signals.job_succeeded.receivers]
    assert not plan_exists("via-receiver")


def test_a_system_job_that_allows_it_runs_with_the_tenants_arguments_calibration(
    tenants, guard_data
):
    run = _run_route("system_followup_allowed")
    assert run.status == RunStatus.SUCCEEDED, run.error_message
    work()  # the follow-up
    assert plan_exists("via-system-followup")


@pytest.mark.parametrize("case", ["system_followup", "system_followup_by_api"])
def test_a_tenant_run_cannot_start_a_system_job_that_does_not_allow_it(tenants, guard_data, case):
    run = _run_route(case)
    work()
    assert run.status == RunStatus.FAILED
    assert run.error_type == "InvalidJob"
    assert "tenant_may_start=True" in run.error_message
    assert "'guardapp.route_system_closed'" in run.error_message
    assert not JobRun.objects.filter(job_name="guardapp.route_system_closed").exists()
    assert not plan_exists("via-system-followup")


def test_tenant_may_start_is_for_system_jobs_only():
    def tenant_job(ctx: Any) -> None: ...

    with pytest.raises(InvalidJob, match="tenant_may_start=True lets tenant runs start a system"):
        build_definition(tenant_job, {"tenant_may_start": True})
    with pytest.raises(InvalidJob, match="tenant_may_start must be True or False"):
        build_definition(tenant_job, {"system": True, "tenant_may_start": "yes"})
    assert build_definition(tenant_job, {"system": True, "tenant_may_start": True}).tenant_may_start


def test_log_mode_only_logs_a_refused_route(tenants, guard_data, caplog):
    with override_settings(KUMIKO_JOBS={**FIRST_WALL, "DB_GUARD": "log"}):
        run = _run_route("async_orm")
    assert run.status == RunStatus.SUCCEEDED, run.error_message
    assert "DB guard (log mode) would deny" in caplog.text
    assert "another thread" in caplog.text
    assert plan_exists("via-async-orm")  # the route was taken, as log mode promises
