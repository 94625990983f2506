"""The run's start and finish as prepared statements (kumiko_jobs/history/prepared.py).

Real PostgreSQL, Redis and in-process RQ workers. With ``DB_ROLES`` on (the suite's setting) the
history is written on the project's connection, the test thread's ``connection`` for the
in-process worker: what is prepared there is read from ``pg_prepared_statements`` of that very
session, with PostgreSQL's own counts of the plans it made. Every test has a calibration (the
same run with the mechanism it relies on taken out fails) in the test or beside it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connection, connections, transaction
from django.test import override_settings

from kumiko_jobs.history import prepared
from kumiko_jobs.models import JobRun, RunStatus
from tests.conftest import work
from tests.guardapp import route_jobs, support
from tests.testapp import jobs
from tests.testapp.models import Probe

pytestmark = [pytest.mark.usefixtures("live_db"), pytest.mark.one_slot]

JOB_PREFIX = "prepared"
START, FINISH = "WITH started AS", "WITH attempt AS"


def _settings(**values: Any) -> Any:
    return override_settings(KUMIKO_JOBS={**settings.KUMIKO_JOBS, **values})


def ours() -> dict[str, tuple[int, int]]:
    """The history's statements prepared in the project connection's session: (generic plans,
    custom plans) PostgreSQL made for each, by the statement's opening."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements"
        )
        rows = cursor.fetchall()
    found: dict[str, tuple[int, int]] = {}
    for statement, generic, custom in rows:
        for opening in (START, FINISH):
            if statement.startswith(opening):
                old = found.get(opening, (0, 0))
                found[opening] = (old[0] + generic, old[1] + custom)
    return found


def backend_pid() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return int(cursor.fetchone()[0])


def probe_runs(count: int, tag: str, schema: str = "t1") -> list[str]:
    return [
        str(jobs.probe.enqueue(tenant=schema, tag=f"{tag}{n}").run_id) for n in range(count)
    ]


def statuses(run_ids: list[str]) -> list[str]:
    return [JobRun.objects.get(pk=run_id).status for run_id in run_ids]


def succeeded(run_ids: list[str]) -> bool:
    return statuses(run_ids) == [RunStatus.SUCCEEDED] * len(run_ids)


@pytest.fixture
def fresh_connection() -> Iterator[None]:
    """The project connection opened anew for the test: its psycopg cache and session start
    empty, whatever the tests before left."""
    connection.close()
    yield
    connection.close()


def test_tenant_runs_reuse_one_prepared_start_and_finish(tenants, fresh_connection):
    runs = probe_runs(12, "a", "t1") + probe_runs(12, "b", "t2")
    work()
    assert succeeded(runs)
    seen = ours()
    # One prepared statement each (parsed once), PostgreSQL's generic plan after five custom
    # ones: 24 runs, 24 executions.
    assert set(seen) == {START, FINISH}
    for generic, custom in seen.values():
        assert custom == 5 and generic == 19, seen


def test_the_setting_turns_it_off(tenants, fresh_connection):
    """The calibration of the test above: nothing is prepared."""
    with _settings(HISTORY_PREPARED_STATEMENTS=False):
        runs = probe_runs(6, "off")
        work()
    assert succeeded(runs)
    assert ours() == {}


def test_with_db_roles_off_nothing_is_prepared(tenants, fresh_connection):
    """The body runs on the history's connection, reset after every run: nothing to keep."""
    with _settings(DB_ROLES=False):
        runs = probe_runs(6, "off")
        work()
    assert succeeded(runs)
    assert ours() == {}


def names_prepared(ctx: Any, *, tag: str) -> None:
    """Writes on a Probe row what its session holds: its backend, a tenant's planted statement,
    psycopg's (the history's)."""
    # Past the classifier (a hand-built cursor on the raw connection: DB_ROLES is off here),
    # which refuses reading the names of a catalog of every session.
    with psycopg.ClientCursor(connection.connection) as cursor:
        cursor.execute(
            "SELECT pg_backend_pid(), "
            "(SELECT count(*) FROM pg_prepared_statements WHERE name = 'planted_statement'), "
            "(SELECT count(*) FROM pg_prepared_statements WHERE name LIKE '\\_pg3\\_%')"
        )
        pid, planted, psycopgs = cursor.fetchone()
    Probe.objects.create(
        tag=tag, schema_seen=connection.schema_name, note=f"{pid}:{planted}:{psycopgs}"
    )


def probe_note(schema: str, tag: str) -> str:
    return str(support.observed(f'SELECT note FROM "{schema}".testapp_probe WHERE tag = %s', [tag])[0][0])


def test_db_roles_off_forced_to_prepare_a_tenants_statement_still_never_reaches_the_next_run(
    tenants, fresh_connection, monkeypatch, declare
):
    """What preparing would do with DB_ROLES off (forced): the reset's DEALLOCATE ALL still
    takes a tenant's PREPARE with it, psycopg sees it go and prepares the next start again (no
    "prepared statement does not exist"), but the next body finds kumiko's own statements in
    its session: one more reason it is not done in that mode (history/prepared.py)."""
    observe = declare(
        names_prepared,
    )
    monkeypatch.setattr(prepared, "enabled", lambda: True)
    support.seed()
    try:
        with _settings(DB_ROLES=False):
            planted = route_jobs.plant.enqueue(tenant="t1", kind="prepared")
            observing = observe.enqueue(tenant="t3", tag="seen")
            runs = probe_runs(4, "after")
            work()
        connection.set_schema_to_public()
        finding = dict(support.observed("SELECT key, value FROM t1.guardapp_finding"))
    finally:
        support.clean()
    assert succeeded([str(planted.run_id), str(observing.run_id), *runs])
    assert finding["after:prepared"] == "2"  # A's PREPARE, beside A's own prepared start
    note = probe_note("t3", "seen")
    # The same session; A's statement gone; B's start (prepared before B's body) there.
    pid, planted_left, history = note.split(":")
    assert (pid, planted_left) == (finding["pid"], "0")
    assert int(history) >= 1


def test_db_roles_off_a_tenants_prepare_never_reaches_the_next_run(
    tenants, fresh_connection, declare
):
    """The same, as shipped (nothing of kumiko's is prepared with DB_ROLES off)."""
    observe = declare(
        names_prepared,
    )
    support.seed()
    try:
        with _settings(DB_ROLES=False):
            route_jobs.plant.enqueue(tenant="t1", kind="prepared")
            observe.enqueue(tenant="t3", tag="seen")
            work()
        connection.set_schema_to_public()
        finding = dict(support.observed("SELECT key, value FROM t1.guardapp_finding"))
    finally:
        support.clean()
    assert finding["after:prepared"] == "1"
    note = probe_note("t3", "seen")
    assert note == f"{finding['pid']}:0:0"
