"""Nothing outlives a run on the worker's connection.

Run A (``guardapp.plant``, tenant t1, under ``unsafe_raw``) leaves one kind of session state
behind; run B (``guardapp.observe``, another tenant) runs next on the same in-process worker,
on the same PostgreSQL session (their ``pg_backend_pid()`` is compared, so the state would
still be there had nothing reset it), and reports what it sees. Locks and committed rows are
checked through a second connection.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from django.conf import settings
from django.db import connection
from django.test import override_settings
from django_tenants.utils import tenant_context

from example_project.customers.models import Client
from kumiko_jobs import transport
from kumiko_jobs.core.session import DISCARD_ALL as DISCARD
from kumiko_jobs.models import JobRun, RunStatus
from tests.conftest import work
from tests.guardapp import jobs, route_jobs, support

pytestmark = pytest.mark.usefixtures("live_db")


@pytest.fixture(autouse=True)
def _first_wall_only() -> Iterator[None]:
    """The classifier (the first wall) on its own: every run of this module shares the test's
    connection, as with DB_ROLES off. With DB_ROLES each tenant has connections of its own; their
    hygiene is tested in test_db_roles.py."""
    with override_settings(KUMIKO_JOBS={**settings.KUMIKO_JOBS, "DB_ROLES": False}):
        yield


@pytest.fixture
def guard_data(live_db: None) -> Iterator[None]:
    support.seed()
    yield
    support.clean()


observed = support.observed


def findings(schema: str) -> dict[str, str]:
    rows = observed(f'SELECT key, value FROM "{schema}".guardapp_finding ORDER BY id')
    return {key: value for key, value in rows}


def status_seen_elsewhere(run_id: str) -> str:
    return str(
        observed("SELECT status FROM public.kumiko_jobs_jobrun WHERE run_id = %s", [run_id])[0][0]
    )


def _tenant(schema: str) -> Client:
    return Client.objects.get(schema_name=schema)


def plant_then_observe(kind: str, observer: str = "t3") -> tuple[JobRun, JobRun]:
    with tenant_context(_tenant("t1")):
        planted = route_jobs.plant.enqueue(kind=kind)
    with tenant_context(_tenant(observer)):
        observing = route_jobs.observe.enqueue()
    work()
    connection.set_schema_to_public()
    return JobRun.objects.get(pk=planted.run_id), JobRun.objects.get(pk=observing.run_id)


def _defaults() -> dict[str, str]:
    rows = observed("SELECT current_setting('work_mem'), current_setting('statement_timeout')")
    return {"work_mem": rows[0][0], "statement_timeout": rows[0][1]}


def _advisory_locks() -> int:
    rows = observed(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = %s",
        [route_jobs.ADVISORY_KEY],
    )
    return int(rows[0][0])


SESSION_STATE = sorted(route_jobs.PLANTS)
# kind -> (observation, value) that run A sees right after planting (the calibration)
PLANTED: dict[str, tuple[str, str]] = {
    "work_mem": ("work_mem", "77MB"),
    "search_path": ("search_path", "t2"),
    "pg_settings": ("statement_timeout", "4242ms"),
    "advisory_lock": ("advisory_lock", "1"),
    "prepared": ("prepared", "1"),
    "listen": ("listen", "1"),
    "temp_table": ("temp_table", "1"),
    "held_cursor": ("held_cursor", "1"),
}


@pytest.mark.parametrize("kind", SESSION_STATE)
def test_session_state_of_one_run_never_reaches_the_next(tenants, guard_data, kind):
    defaults = _defaults()
    planted, observing = plant_then_observe(kind)
    if kind == "pg_settings" and planted.status == RunStatus.FAILED:
        # The pglast classifier refuses writes to pg_catalog under any grant.
        assert planted.error_type == "DatabaseAccessDenied", planted.error_message
    else:
        assert planted.status == RunStatus.SUCCEEDED, (planted.error_type, planted.error_message)
        # Calibration: the state is there in A's session at the end of A's body.
        observation, value = PLANTED[kind]
        assert findings("t1")[f"after:{observation}"] == value
    assert observing.status == RunStatus.SUCCEEDED, (observing.error_type, observing.error_message)
    seen = findings("t3")
    # The same session: what A left would still be there had nothing reset it.
    assert findings("t1")["pid"] == seen["pid"]
    assert seen["advisory_lock"] == "0"
    assert seen["work_mem"] == defaults["work_mem"]
    assert seen["statement_timeout"] == defaults["statement_timeout"]
    assert "t2" not in seen["search_path"]
    assert seen["prepared"] == "0"
    assert seen["listen"] == "0"
    assert seen["temp_table"] == "0"
    assert seen["held_cursor"] == "0"
    assert seen["time_zone"] == "UTC"  # Django's, set again after RESET ALL reset it
    assert _advisory_locks() == 0
    assert findings("t2") == {}  # nothing of B landed in t2 through a planted search_path


@pytest.mark.one_slot
def test_a_session_advisory_lock_is_held_until_the_run_ends_calibration(tenants, guard_data):
    """The lock really is a session lock: held after the statement, inside the run."""
    seen: list[int] = []

    def spy(execute: Callable[..., Any], sql: Any, params: Any, many: bool, ctx: Any) -> Any:
        result = execute(sql, params, many, ctx)
        if "pg_advisory_lock" in str(sql):
            seen.append(_advisory_locks())
        return result

    with tenant_context(_tenant("t1")):
        route_jobs.plant.enqueue(kind="advisory_lock")
    with connection.execute_wrapper(spy):
        work()
    assert seen == [1]
    assert _advisory_locks() == 0


@pytest.mark.parametrize("kind", ["raw_begin", "atomic_never_left"])
@pytest.mark.parametrize("observer", ["t1", "t3"])
def test_a_run_that_leaves_a_transaction_open_fails_and_the_next_commits(
    tenants, guard_data, kind, observer
):
    planted, observing = plant_then_observe(kind, observer)
    assert planted.status == RunStatus.FAILED
    assert planted.error_type == "Unrecoverable"
    assert "left a transaction open on database alias 'default'" in planted.error_message
    assert planted.attempts == 1
    # Both outcomes are committed: another connection sees them.
    assert status_seen_elsewhere(str(planted.run_id)) == RunStatus.FAILED
    assert status_seen_elsewhere(str(observing.run_id)) == RunStatus.SUCCEEDED
    # What A wrote inside its transaction was rolled back; B's own write is committed.
    assert observed("SELECT label FROM t1.guardapp_secret WHERE label LIKE 'in-leaked%'") == []
    assert ("observed", observer) in observed(
        f'SELECT label, value FROM "{observer}".guardapp_secret'
    )
    assert findings(observer)["transaction"] == "True"  # B's statements were not in A's tx
    assert not connection.in_atomic_block
    assert connection.connection.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


# --- what it costs --------------------------------------------------------------------------


@contextmanager
def statements_by_job() -> Iterator[dict[str, list[str]]]:
    seen: dict[str, list[str]] = {}

    def record(execute: Callable[..., Any], sql: Any, params: Any, many: bool, ctx: Any) -> Any:
        seen.setdefault(transport.current_job_id(), []).append(" ".join(str(sql).split()))
        return execute(sql, params, many, ctx)

    with connection.execute_wrapper(record):
        yield seen


def _of(seen: dict[str, list[str]], run_id: str) -> list[str]:
    return seen[JobRun.objects.get(pk=run_id).rq_job_id]


@pytest.mark.one_slot
def test_every_run_costs_a_single_reset_after_its_statements(tenants, guard_data):
    """Clean or not, every run is reset once (issue 22: nothing is inferred from the statements
    the guard saw), after the job's statements and before the outcome is written."""
    with tenant_context(_tenant("t1")):
        clean = jobs.rename_people.enqueue(name="x")
        dirty = route_jobs.plant.enqueue(kind="work_mem")
        clean_again = jobs.rename_people.enqueue(name="y")
    with statements_by_job() as seen:
        work()
    for handle in (clean, dirty, clean_again):
        assert JobRun.objects.get(pk=handle.run_id).status == RunStatus.SUCCEEDED
    for handle in (clean, clean_again):
        statements = _of(seen, handle.run_id)
        # start, SET search_path, the UPDATE, the reset, finish
        assert len(statements) == 5, statements
        assert statements[3].startswith(DISCARD), statements
    statements = _of(seen, dirty.run_id)
    resets = [i for i, sql in enumerate(statements) if sql.startswith(DISCARD)]
    assert len(resets) == 1, statements
    # After the job's statements, before the outcome is written (a planted setting such as
    # default_transaction_read_only must not reach the history's own writes).
    history = [i for i, sql in enumerate(statements) if "kumiko_jobs_jobattempt" in sql]
    assert statements.index("SET work_mem = '77MB'") < resets[0] < history[0]


@pytest.mark.one_slot
def test_with_the_guard_off_every_run_is_reset(tenants, guard_data):
    with tenant_context(_tenant("t1")):
        handle = jobs.rename_people.enqueue(name="x")
    with (
        override_settings(
            KUMIKO_JOBS={**settings.KUMIKO_JOBS, "DB_GUARD": "off", "DB_ROLES": False}
        ),
        statements_by_job() as seen,
    ):
        work()
    assert len([sql for sql in _of(seen, handle.run_id) if sql.startswith(DISCARD)]) == 1


@pytest.fixture
def without_tenancy_step() -> Iterator[None]:
    """A pipeline without the tenancy step (a project's own list of steps)."""
    from kumiko_jobs.run import entry as runner
    from kumiko_jobs.run.pipeline import compose
    from kumiko_jobs.run.steps import DEFAULT_STEPS
    from kumiko_jobs.run.steps.tenancy import tenancy

    steps = [step for step in DEFAULT_STEPS if step is not tenancy]
    runner.reset_pipeline(lambda: compose(steps, runner.call_job))
    try:
        yield
    finally:
        runner.reset_pipeline()


@pytest.mark.one_slot
def test_the_outcome_commits_even_when_no_step_ended_the_transaction(
    tenants, guard_data, without_tenancy_step
):
    with tenant_context(_tenant("t1")):
        handle = route_jobs.leave_open.enqueue()
        after = jobs.rename_people.enqueue(name="x")
    work()
    run = JobRun.objects.get(pk=handle.run_id)
    assert run.status == RunStatus.FAILED
    assert run.error_type == "Unrecoverable"
    assert "left a transaction open" in run.error_message
    assert status_seen_elsewhere(str(handle.run_id)) == RunStatus.FAILED
    assert status_seen_elsewhere(str(after.run_id)) in (RunStatus.SUCCEEDED, RunStatus.FAILED)
    assert connection.connection.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
