"""PostgreSQL ends every worker session under load (issue 28): nothing lost, stuck or doubled.

Two real workers (their tenant bodies log in as the tenant roles: the suite runs with DB_ROLES)
and a real ``rqscheduler`` drain plain and atomic soak runs while this test, from a connection
of its own, calls ``pg_terminate_backend`` on every other session of this suite's test database,
over and over: what a PostgreSQL restart does to each session (the server says FATAL and hangs
up), without restarting the shared server other suites use. Sessions die idle, mid-body,
mid-commit and mid-sweep. Afterwards: every committed run succeeded (none lost, none stuck),
each atomic run's effect exists exactly once, every effect is in its run's tenant schema, and
the same worker and scheduler processes are still running (they recovered without a restart).
Full server restarts are tests/integration/test_outages.py's (a cluster of the test's own).
"""

from __future__ import annotations

import io
import random
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.core.management import call_command
from django.db import connection, connections

from bench import soak
from kumiko_jobs.models import JobRun, RunStatus
from tests.chaos.workers import Processes
from tests.integration.test_outages import OwnPostgres, clone_test_database, default_connection_on
from tests.integration.test_reliability import effects
from tests.testapp import jobs

pytestmark = pytest.mark.usefixtures("live_db")

SCHEMAS = ("t1", "t2", "t3")
RUNS = 60  # per variant


def _admin() -> psycopg.Connection[Any]:
    s = connection.settings_dict
    return psycopg.connect(
        host=s["HOST"],
        port=s["PORT"],
        user=s["USER"],
        password=s["PASSWORD"] or "",
        dbname=s["NAME"],
        autocommit=True,
    )


class Terminator(threading.Thread):
    """Every few hundred ms, ``pg_terminate_backend`` of every session of the test database but
    its own (and, while it enqueues, the test's: a refused enqueue is not a committed one)."""

    def __init__(self, spare: set[int]) -> None:
        super().__init__(name="chaos-terminator", daemon=True)
        self.spare = spare
        self.stop = threading.Event()
        self.killed = 0
        self.rounds = 0

    def run(self) -> None:
        rng = random.Random(28)
        with _admin() as admin:
            own = admin.info.backend_pid
            while not self.stop.wait(rng.uniform(0.2, 0.8)):
                rows = admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> ALL(%s)",
                    [[own, *self.spare]],
                ).fetchall()
                self.killed += sum(1 for (done,) in rows if done)
                self.rounds += 1


def _enqueue(job_name: str, start: int) -> list[str]:
    return soak._enqueue_batch(SCHEMAS, range(start, start + 10), job_name)


def _unfinished(run_ids: list[str]) -> int:
    return JobRun.objects.filter(pk__in=run_ids).exclude(status=RunStatus.SUCCEEDED).count()


def test_every_session_terminated_over_and_over_under_load(tenants, procs: Processes):
    workers = [procs.start() for _ in range(2)]
    scheduler = procs.start("rqscheduler", "--interval", "1")
    procs.wait_ready(2, scheduler=True)
    connection.ensure_connection()
    terminator = Terminator(spare={connection.connection.info.backend_pid})
    terminator.start()
    plain: list[str] = []
    atomic: list[str] = []
    try:
        for start in range(0, RUNS, 10):
            connection.ensure_connection()
            terminator.spare = {connection.connection.info.backend_pid}
            plain += _enqueue("soak.work", start)
            atomic += _enqueue(soak.ATOMIC_JOB, start)
            time.sleep(1.0)  # let the terminations land among running bodies
        time.sleep(5.0)  # and among the retries, the sweep and the relay
    finally:
        terminator.stop.set()
        terminator.join()
    assert terminator.killed > 20, terminator.killed  # the chaos did happen
    connections["default"].close()
    runs = plain + atomic
    procs.wait_for("every run to succeed", lambda: _unfinished(runs) == 0, deadline=180)

    _check_effects(plain, atomic)
    assert all(w.poll() is None for w in workers), procs.logs()
    assert scheduler.poll() is None, procs.logs()


def _check_effects(plain: list[str], atomic: list[str]) -> None:
    rows = [row for schema in SCHEMAS for row in _effects(schema)]
    counted = Counter(run_id for run_id, _schema, _where in rows)
    assert {r.replace("-", "") for r in plain} <= set(counted), "a plain run lost its effect"
    assert all(counted[r.replace("-", "")] == 1 for r in atomic), "an atomic run ran twice"
    assert all(schema == where for _run, schema, where in rows), "an effect in another schema"


def _effects(schema: str) -> list[tuple[str, str, str]]:
    """(run id hex, its tenant schema, the schema the effect was written in) per effect row."""
    out = []
    for message in effects(schema, "soak"):
        run_id, _attempt, where = message.split()
        out.append((run_id.replace("-", ""), schema, where))
    return out


# --------------------------------------------------------------------------- full restarts


@pytest.fixture
def own_server(tmp_path: Path, tenants: dict[str, Any]) -> Iterator[tuple[OwnPostgres, str]]:
    server = OwnPostgres(tmp_path)
    try:
        clone_test_database(server, "kumiko_chaos")
        yield server, "kumiko_chaos"
    finally:
        connections["default"].close()
        server.close()


def _restart(server: OwnPostgres, mode: str) -> None:
    """``pg_ctl restart -m MODE``, as stop then start (the same port and options)."""
    connections["default"].close()
    server._pg_ctl("-m", mode, "-w", "stop")
    server.start()


# In CI again: its flake (pg_ctl exiting 1) was the cluster's data directory under pytest's base
# temp, which other pytest sessions on the machine reset to 0700 (OwnPostgres now keeps its own).
def test_fast_and_immediate_restarts_under_load(own_server, procs: Processes):
    """``pg_ctl`` fast and immediate restarts while two workers and rqscheduler drain plain and
    atomic runs; then one more (immediate) while they idle with pooled tenant logins: the next
    run of every tenant succeeds on its first attempt (the logins reconnect, none fails once)."""
    server, name = own_server
    env = {"DATABASE_URL": server.url(name)}
    with default_connection_on(server, name):
        call_command("kumiko_jobs", "roles", stdout=io.StringIO())  # roles are cluster-wide
        workers = [procs.start(env=env) for _ in range(2)]
        scheduler = procs.start("rqscheduler", "--interval", "1", env=env)
        procs.wait_ready(2, scheduler=True)
        plain: list[str] = []
        atomic: list[str] = []
        for batch, mode in enumerate(("fast", "immediate", None)):
            plain += _enqueue("soak.work", batch * 10)
            atomic += _enqueue(soak.ATOMIC_JOB, batch * 10)
            time.sleep(1.0)  # bodies, retries and the relay are busy when it goes down
            if mode:
                _restart(server, mode)
        runs = plain + atomic
        procs.wait_for("every run to succeed", lambda: _unfinished(runs) == 0, deadline=180)
        _check_effects(plain, atomic)

        _restart(server, "immediate")  # the workers idle, their tenant logins pooled
        after = [jobs.probe.enqueue(tenant=schema, tag="after").run_id for schema in SCHEMAS]
        procs.wait_for("the runs after", lambda: _unfinished(after) == 0, deadline=120)
        assert list(JobRun.objects.filter(pk__in=after).values_list("attempts", flat=True)) == [
            1,
            1,
            1,
        ], procs.logs()
        assert all(w.poll() is None for w in workers), procs.logs()
        assert scheduler.poll() is None, procs.logs()
