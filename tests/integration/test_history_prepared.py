"""The run's start and finish as prepared statements (kumiko_jobs/history/prepared.py).

Real PostgreSQL, Redis and in-process RQ workers. With ``DB_ROLES`` on (the suite's setting) the
history is written on the project's connection, the test thread's ``connection`` for the
in-process worker: what is prepared there is read from ``pg_prepared_statements`` of that very
session, with PostgreSQL's own counts of the plans it made. Every test has a calibration (the
same run with the mechanism it relies on taken out fails) in the test or beside it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.conf import settings
from django.db import connection, transaction
from django.test import override_settings

from kumiko_jobs.history import prepared
from kumiko_jobs.models import JobRun, RunStatus
from tests.conftest import work
from tests.guardapp import route_jobs, support
from tests.testapp import jobs
from tests.testapp.models import Probe

pytestmark = [pytest.mark.usefixtures("live_db"), pytest.mark.one_slot]

JOB_PREFIX = "prepared"
START, FINISH = "WITH started AS", "WITH run AS"


def _settings(**values: Any) -> Any:
    return override_settings(KUMIKO_JOBS={**settings.KUMIKO_JOBS, **values})


def ours() -> dict[str, tuple[int, int]]:
    """The history's statements prepared in the project connection's session: (generic plans,
    custom plans) PostgreSQL made for each, by the statement's opening."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements")
        rows = cursor.fetchall()
    found: dict[str, tuple[int, int]] = {}
    for statement, generic, custom in rows:
        for opening in (START, FINISH):
            if statement.startswith(opening):
                old = found.get(opening, (0, 0))
                found[opening] = (old[0] + generic, old[1] + custom)
    return found


def elsewhere(statement: str) -> None:
    """A statement from another session (a migration, an operator), committed at once."""
    with support.second_connection() as conn:
        conn.execute(statement)


def backend_pid() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return int(cursor.fetchone()[0])


def probe_runs(count: int, tag: str, schema: str = "t1") -> list[str]:
    return [str(jobs.probe.enqueue(tenant=schema, tag=f"{tag}{n}").run_id) for n in range(count)]


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
    return str(
        support.observed(f'SELECT note FROM "{schema}".testapp_probe WHERE tag = %s', [tag])[0][0]
    )


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


def forges_the_history(ctx: Any, *, tag: str) -> None:
    """A tenant body's attack on the history's prepared statements, past the classifier (a
    hand-built cursor on the raw connection, as a job's own driver code would): it looks for
    psycopg's statements, drops every prepared statement of its session and plants its own
    under psycopg's names, so that a later start or finish sent by name would run its SQL."""
    connection.ensure_connection()
    with psycopg.ClientCursor(connection.connection) as cursor:
        cursor.execute(
            "SELECT pg_backend_pid(), "
            "(SELECT count(*) FROM pg_prepared_statements WHERE name LIKE '\\_pg3\\_%')"
        )
        pid, found = cursor.fetchone()
        cursor.execute("DEALLOCATE ALL")
        for n in range(16):
            cursor.execute(f"PREPARE _pg3_{n} AS SELECT 1 WHERE false")
    Probe.objects.create(tag=tag, schema_seen=connection.schema_name, note=f"{pid}:{found}")


def test_a_tenant_body_cannot_reach_the_historys_prepared_statements(
    tenants, fresh_connection, declare
):
    """With DB_ROLES on the body runs on its tenant's login, another session: it finds none of
    the history's statements, and its DEALLOCATE ALL and statements planted under psycopg's
    names (``_pg3_<n>``) change nothing of the history's. Its own run and the next runs, of
    another tenant, start and finish on the statements prepared before, in the same session
    (no "does not exist" to repair, no result of the forged statements taken for a start).

    Calibrated: forced to prepare with DB_ROLES off (the body on the history's connection),
    the body runs in the history's own session (the same backend pid), and the assertion on
    the note fails (there the session reset's DEALLOCATE ALL after the run is what takes the
    planted statements away)."""
    forger = declare(forges_the_history)
    before = probe_runs(6, "before", "t2")
    work()
    pid = backend_pid()
    forged = str(forger.enqueue(tenant="t1", tag="forger").run_id)
    after = probe_runs(6, "after", "t2")
    work()
    assert succeeded([*before, forged, *after])
    body_pid, found = probe_note("t1", "forger").split(":")
    assert body_pid != str(pid) and found == "0"
    assert backend_pid() == pid  # the history's session kept: nothing went stale
    # One preparation of the start, used by all thirteen runs (five custom plans, then generic).
    assert ours()[START] == (8, 5)
    assert support.observed("SELECT count(*) FROM t2.testapp_probe WHERE tag LIKE 'after%%'") == [
        (6,)
    ]


# --- the project's connection reset, rolled back, lost ------------------------------------------


def _blind_psycopg(monkeypatch: pytest.MonkeyPatch) -> None:
    """Calibration: psycopg does not see the session reset's DEALLOCATE ALL go through (its
    bookkeeping off while the reset runs), so its cache names statements the server dropped."""
    from kumiko_jobs.core import session

    discard = session.discard

    def blind(conn: Any, *, raw: bool = False) -> None:
        psycopg_conn = conn.connection
        threshold = psycopg_conn.prepare_threshold
        psycopg_conn.prepare_threshold = None
        try:
            discard(conn, raw=raw)
        finally:
            psycopg_conn.prepare_threshold = threshold

    monkeypatch.setattr(session, "discard", blind)


def _no_repair(monkeypatch: pytest.MonkeyPatch) -> None:
    """Calibration: a stale prepared statement's error is raised, not repaired."""
    monkeypatch.setattr(prepared, "_stale", lambda exc: False)


@pytest.mark.parametrize("calibration", ["none", "psycopg_blind", "blind_and_no_repair"])
def test_a_system_run_resets_the_project_connection_and_the_next_start_prepares_again(
    tenants, fresh_connection, monkeypatch, calibration
):
    """A system run's body uses the project's connection (no tenant login), so the session reset
    after it (DEALLOCATE ALL) drops the history's statements; psycopg sees it, and the next
    start is prepared again on the same session."""
    before = probe_runs(6, "before")
    work()
    pid = backend_pid()
    if calibration != "none":
        _blind_psycopg(monkeypatch)
    if calibration == "blind_and_no_repair":
        _no_repair(monkeypatch)
    tick = str(jobs.system_tick.enqueue(tag="tick").run_id)
    work()
    after = probe_runs(6, "after")
    work()
    if calibration == "blind_and_no_repair":
        # "prepared statement ... does not exist": the first start after the reset fails.
        assert not succeeded(after)
        return
    assert succeeded([*before, tick, *after])
    if calibration == "psycopg_blind":
        # Repaired: the stale statement failed at Bind, the connection was opened anew.
        assert backend_pid() != pid
        return
    assert backend_pid() == pid  # the same session throughout: nothing reopened
    # Prepared again after the reset: six starts, and the finishes of the system run (its own
    # parameter types, so a statement of its own) and of the six.
    seen = ours()
    assert seen[START] == (1, 5)
    assert sum(seen[FINISH]) == 7


def rolls_back(ctx: Any, *, tag: str) -> None:
    with transaction.atomic():
        Probe.objects.create(tag=tag, schema_seen=connection.schema_name)
        transaction.set_rollback(True)


@pytest.mark.parametrize("db_roles", [True, False])
def test_jobs_that_roll_back_or_fail_leave_the_next_starts_working(
    tenants, fresh_connection, monkeypatch, declare, db_roles
):
    """With DB_ROLES their rollbacks happen on the tenant's login: the history's statements stay
    prepared. Forced to prepare with DB_ROLES off, the rollback is on the history's connection:
    psycopg forgets its statements on ROLLBACK and prepares them again."""
    rolling = declare(rolls_back)
    if not db_roles:
        monkeypatch.setattr(prepared, "enabled", lambda: True)
    with _settings(DB_ROLES=db_roles):
        first = probe_runs(3, "first")
        work()
        troubled = [
            str(rolling.enqueue(tenant="t1", tag="rolled").run_id),
            str(jobs.gives_up.enqueue(tenant="t1", tag="gave-up").run_id),
            str(jobs.crashes_connection.enqueue(tenant="t2", tag="crashed").run_id),
        ]
        work()
        later = probe_runs(3, "later")
        work()
    assert succeeded([*first, *later])
    assert statuses(troubled) == [RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.FAILED]
    assert support.observed("SELECT count(*) FROM t1.testapp_probe WHERE tag = 'rolled'") == [(0,)]
    if db_roles:  # one session, one preparation of each: nine starts in a row
        generic, custom = ours()[START]
        assert (generic, custom) == (4, 5)


def test_a_lost_project_connection_is_opened_again_and_prepares_anew(tenants, fresh_connection):
    first = probe_runs(3, "first")
    work()
    pid = backend_pid()
    later = probe_runs(3, "later")
    elsewhere(f"SELECT pg_terminate_backend({pid})")  # while the worker's connection idles
    work()
    assert succeeded([*first, *later])
    assert backend_pid() != pid
    assert ours()[START] == (0, 3)  # prepared in the new session, three starts


# --- a migration while workers run --------------------------------------------------------------


def test_a_column_added_to_the_run_table_between_runs_is_planned_again(tenants, fresh_connection):
    first = probe_runs(6, "first")  # past the five custom plans: the generic one is in use
    work()
    pid = backend_pid()
    elsewhere("ALTER TABLE public.kumiko_jobs_jobrun ADD COLUMN prepared_probe integer")
    try:
        later = probe_runs(3, "later")
        work()
    finally:
        elsewhere("ALTER TABLE public.kumiko_jobs_jobrun DROP COLUMN prepared_probe")
    assert succeeded([*first, *later])
    assert backend_pid() == pid  # PostgreSQL planned it again; nothing to repair


@pytest.mark.parametrize("repair", [True, False])
def test_a_column_the_start_returns_changing_type_is_repaired(
    tenants, fresh_connection, monkeypatch, repair
):
    """``cached plan must not change result type``: the start returns the tenant's columns, and
    a migration changed one of them while the worker ran. The start fails at Bind (nothing
    executed); the connection is opened anew and the start prepared again."""
    first = probe_runs(3, "first")
    work()
    pid = backend_pid()
    if not repair:
        _no_repair(monkeypatch)
    elsewhere("ALTER TABLE public.customers_client ALTER COLUMN name TYPE text")
    try:
        later = probe_runs(3, "later")
        work()
    finally:
        elsewhere("ALTER TABLE public.customers_client ALTER COLUMN name TYPE varchar(100)")
    assert succeeded(first)
    if not repair:  # the calibration: every later start fails the same way
        assert not succeeded(later)
        return
    assert succeeded(later)
    assert backend_pid() != pid


# --- worker slots -------------------------------------------------------------------------------


def test_each_worker_slot_prepares_on_its_own_connection(tenants, monkeypatch):
    """WORKER_CONCURRENCY through the suites' slot harness (tests/slot_harness.py): the suite's
    runs on one sibling slot, a mixed-tenant neighbour on the other. Every start is read back
    on the connection that sent it: prepared there, in that slot's own session."""
    from tests import slot_harness

    monkeypatch.setenv(slot_harness.SLOTS_ENV, "2")
    seen: list[tuple[int, int, int]] = []
    send = prepared._send_prepared

    def spy(public_cursor: Any, sql: str, params: Any, fetch: bool) -> Any:
        row = send(public_cursor, sql, params, fetch)
        if sql.startswith(START):
            with public_cursor() as cursor:
                cursor.execute(
                    "SELECT pg_backend_pid(), count(*) FROM pg_prepared_statements "
                    "WHERE statement LIKE 'WITH started AS%%'"
                )
                pid, count = cursor.fetchone()
            seen.append((threading.get_ident(), pid, count))
        return row

    monkeypatch.setattr(prepared, "_send_prepared", spy)
    runs = probe_runs(4, "a", "t1") + probe_runs(4, "b", "t2")
    work()
    assert succeeded(runs)
    slots = {thread: {pid for t, pid, _ in seen if t == thread} for thread, _, _ in seen}
    assert len(slots) == 2, slots  # both slots started runs (the suite's, the neighbour's)
    assert all(len(pids) == 1 for pids in slots.values())  # one session each, kept
    assert len(set.union(*slots.values())) == 2  # not shared
    assert all(count >= 1 for _, _, count in seen)  # prepared in the session that ran it
