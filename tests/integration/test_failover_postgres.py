"""PostgreSQL failover under load (issue 28): the replica is promoted, and everything follows.

A primary and an asynchronous streaming replica of Debian's PostgreSQL 15 on ports of their own
(``OwnPostgres.debian()`` and ``.replica()``: ``initdb``, ``pg_basebackup -R``), the primary
holding a copy of this suite's test database. Every process names both hosts, the libpq way:

* the workers, the scheduler and the relay loop get ``DATABASE_URL=postgres://postgres@
  127.0.0.1:P1,127.0.0.1:P2/NAME?target_session_attrs=read-write&connect_timeout=5``, which
  example_project/settings.py turns into ``HOST="127.0.0.1,127.0.0.1"``, ``PORT="P1,P2"``,
  ``OPTIONS={"target_session_attrs": "read-write", "connect_timeout": "5"}``; Django passes
  the three to psycopg as they are, and libpq (psycopg, for each host in turn) takes the first
  host that accepts writes;
* the tenant logins (DB_ROLES) copy the alias's settings (guard/roles/connections.py), hosts and
  options included;
* this process's own ``default`` connection the same way (``default_connection_on``).

Two real workers, an ``rqscheduler`` ringing a one-second cron (tests/chaos/cron_app: every
tick is a run row it writes) and ``manage.py kumiko_jobs relay --loop`` run while a thread of
this test commits plain and atomic soak runs and ``sequential`` ones in batches. Then:

1. the replica is cut off from the primary under load (``primary_conninfo`` emptied and
   reloaded: its WAL receiver ends, as on a broken link) and replays what it received; the test
   reads what it holds, the state the promotion keeps (the replay LSN is checked again after
   it). The primary goes on committing (asynchronous replication does not wait for a
   replica) until it has committed new runs, finished some the replica holds unfinished and
   rung a cron tick;
2. the primary stops, ``immediate`` (its processes die, as in a crash), and nothing takes
   writes for a while (until three of this test's enqueuing transactions have been refused);
3. ``pg_ctl promote``: every process must write to the new primary within ``FOLLOW_WITHIN``
   (30 s), the same processes, none restarted;
4. the load stops; every run the new primary holds must succeed. Then back again, the workers
   idle: a new standby of the new primary takes the old primary's port, the new primary is
   stopped (immediate) and the standby promoted; the next run of each tenant must succeed on
   its first attempt (the workers' kept sessions and pooled tenant logins died while idle);
5. the old primary is started alone on a port nobody else knows, to read what it had
   committed.

What asynchronous replication loses, asserted exactly:

* **runs whose enqueue committed on the old primary but never reached the replica**: gone
  with their rows. Nothing brings them back: a run is never recreated from its message
  (a message of one of them delivered after the promotion is refused and recorded as a
  ``RejectedMessage``), and their effects are gone with them;
* **progress of runs the replica holds**: a start, an attempt's end, a success committed on the
  old primary after the replica's last replayed record. The new primary has these runs
  ``queued``/``deferred`` (their messages finished or failed in Redis: the relay pushes them
  again) or ``running`` under a live worker that no longer executes them (the sweep hands them
  back); either way they run again and succeed, every job of the load having retries left
  (a run held ``running`` on its last attempt fails as ``Abandoned`` instead: the second test,
  which makes both cases certain). An atomic run's effect committed with its
  success, so it was lost with it and is written once more: atomic effects exist exactly once.
  A plain run's effect may have reached the replica without its success: it then exists twice
  (at least once, as with any plain run whose success is lost);
* **cron ticks rung on the old primary only**: gone, and never rung again (the scheduler's
  alarm has moved on).
"""

from __future__ import annotations

import functools
import io
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, LiteralString

import psycopg
import pytest
from django.core.management import call_command
from django.db import DatabaseError, connection, connections, transaction
from django.utils import timezone

from bench import soak
from example_project.devservices import free_port
from kumiko_jobs.core.envelope import tick_run_id
from kumiko_jobs.models import JobAttempt, JobRun, RejectedMessage, RunStatus
from tests.chaos.workers import Processes
from tests.conftest import probes
from tests.integration.test_outages import OwnPostgres, clone_test_database, default_connection_on
from tests.integration.test_reliability import attempts_of, effects
from tests.testapp import jobs

pytestmark = pytest.mark.usefixtures("live_db")

NAME = "kumiko_failover"
SCHEMAS = ("t1", "t2", "t3")
# concurrency="sequential" (a slot per job and tenant), with retries as the soak's jobs: a run
# the new primary holds ``running`` is handed back by the sweep, and only a run with an attempt
# left runs again (one_at_a_time, retries=0, failed so in CI: the second test).
SEQUENTIAL = "testapp.sequential_sleeper"
JOBS = ("soak.work", soak.ATOMIC_JOB, SEQUENTIAL)
CRON_JOB = "chaos_cron.every_second"  # registered in the scheduler process only
CRON_ENV = {"DJANGO_SETTINGS_MODULE": "tests.chaos.settings", "KUMIKO_CHAOS_EVERY_SECOND": "1"}
FOLLOW_WITHIN = 30.0  # the bound for workers, scheduler and relay (a generous deadline)
BATCH = 6  # soak runs per enqueuing transaction, half plain, half atomic; and one sequential


@pytest.fixture
def pair(tenants: dict[str, Any]) -> Iterator[tuple[OwnPostgres, OwnPostgres]]:
    primary = OwnPostgres.debian()
    replica: OwnPostgres | None = None
    try:
        clone_test_database(primary, NAME)
        replica = primary.replica()
        yield primary, replica
    finally:
        connections["default"].close()
        for server in (replica, primary):
            if server is not None:
                server.close()


def _raw(server: OwnPostgres, port: int | None = None) -> psycopg.Connection[Any]:
    """A connection of the test's own to one server (not through the failover pair)."""
    return psycopg.connect(
        host="127.0.0.1", port=port or server.port, user="postgres", dbname=NAME, autocommit=True
    )


def _pair_settings(
    primary: OwnPostgres, replica: OwnPostgres
) -> tuple[dict[str, Any], dict[str, str]]:
    """This process's ``default`` settings for the pair, and the processes' environment."""
    # connect_timeout bounds each host's attempt (psycopg's default: 130 s), for a dead host
    # that drops packets instead of refusing (docs/reliability.md).
    default = {
        "HOST": "127.0.0.1,127.0.0.1",
        "PORT": f"{primary.port},{replica.port}",
        "OPTIONS": {"target_session_attrs": "read-write", "connect_timeout": 5},
    }
    url = (
        f"postgres://postgres@127.0.0.1:{primary.port},127.0.0.1:{replica.port}/{NAME}"
        "?target_session_attrs=read-write&connect_timeout=5"
    )
    return default, {"DATABASE_URL": url}


def _cut_off(replica: OwnPostgres) -> None:
    """The replica's link to its primary breaks (``primary_conninfo`` emptied and reloaded: its
    WAL receiver ends, as on a broken link); it replays what it received, then nothing more."""
    with _raw(replica) as conn:
        conn.execute("ALTER SYSTEM SET primary_conninfo TO ''")
        conn.execute("SELECT pg_reload_conf()")


def _one(conn: psycopg.Connection[Any], query: LiteralString, params: Sequence[Any] = ()) -> Any:
    """The first column of the one row ``query`` returns."""
    row = conn.execute(query, params).fetchone()
    assert row is not None
    return row[0]


def _succeeded(server: OwnPostgres) -> int:
    with _raw(server) as conn:
        return int(_one(conn, "SELECT count(*) FROM kumiko_jobs_jobrun WHERE status = 'succeeded'"))


class Load(threading.Thread):
    """Commits soak runs, ``BATCH`` per transaction, until stopped, through the pair (this
    process's ``default`` settings). A batch whose commit raised is *uncertain*: the server may
    have committed it and died before answering."""

    def __init__(self) -> None:
        super().__init__(name="failover-load", daemon=True)
        self.committed: dict[str, float] = {}  # run id -> when its commit returned (monotonic)
        self.tags: dict[str, str] = {}  # sequential run id -> its probe's tag
        self.uncertain: set[str] = set()
        self.errors = 0
        self.stop = threading.Event()

    def count(self, since: float = 0.0) -> int:
        return sum(1 for at in list(self.committed.values()) if at >= since)

    def run(self) -> None:
        n = 0
        try:
            while not self.stop.wait(0.15):
                ids: list[str] = []
                try:
                    with transaction.atomic():
                        for i in range(n, n + BATCH):
                            handle = soak.job(JOBS[i % 2]).enqueue(
                                tenant=SCHEMAS[i % len(SCHEMAS)],
                                n=i,
                                # one body in twelve long enough to be cut by the stop
                                sleep_ms=600 if i % 12 == 0 else (i * 7919) % 31,
                                fail_first=i % 10 == 3,
                                defer_first=i % 25 == 11,
                            )
                            ids.append(uuid.UUID(str(handle.run_id)).hex)
                        tenant = SCHEMAS[(n // BATCH) % len(SCHEMAS)]
                        handle = jobs.sequential_sleeper.enqueue(tenant=tenant, tag=f"seq-{n}")
                        ids.append(uuid.UUID(str(handle.run_id)).hex)
                        self.tags[ids[-1]] = f"seq-{n}"
                except Exception:  # no primary, or it died under us: nothing, or uncertain
                    self.uncertain.update(ids)
                    self.errors += 1
                    connection.close()
                    time.sleep(0.2)
                else:
                    now = time.monotonic()
                    self.committed.update(dict.fromkeys(ids, now))
                n += BATCH
        finally:
            connection.close()


def _wait(
    what: str,
    check: Callable[[], object],
    deadline: float,
    explain: Callable[[], str] | None = None,
) -> float:
    """Until ``check()``; the seconds it took (a deadline, not a measurement to assert)."""
    start = time.monotonic()
    while not _answers(check):
        if time.monotonic() - start > deadline:
            detail = f"\n{explain()}" if explain is not None else ""
            pytest.fail(f"gave up waiting for {what} after {deadline:.0f} s{detail}")
        time.sleep(0.1)
    return time.monotonic() - start


def _answers(check: Callable[[], object]) -> bool:
    try:
        return bool(check())
    except DatabaseError:  # this process's connection died with the old primary: anew next time
        connections["default"].close()
        return False


def _lsn(value: str) -> int:
    high, low = value.split("/")
    return (int(high, 16) << 32) + int(low, 16)


def _caught_up(replica: OwnPostgres) -> bool:
    """The replica's WAL receiver has ended and everything it received is replayed: nothing
    more can reach it before the promotion."""
    with _raw(replica) as conn:
        streaming = _one(
            conn, "SELECT count(*) FROM pg_stat_wal_receiver WHERE status = 'streaming'"
        )
        received = _one(conn, "SELECT pg_last_wal_receive_lsn()::text")
        replayed = _one(conn, "SELECT pg_last_wal_replay_lsn()::text")
    return bool(streaming == 0 and _lsn(replayed) >= _lsn(received))


def _caught_up_to(standby: OwnPostgres, lsn: str) -> bool:
    with _raw(standby) as conn:
        replayed = _one(conn, "SELECT pg_last_wal_replay_lsn()::text")
    return replayed is not None and _lsn(replayed) >= _lsn(lsn)


def _runs(conn: psycopg.Connection[Any]) -> dict[str, tuple[str, str]]:
    """(status, job) of every soak run on one server."""
    rows = conn.execute(
        "SELECT run_id::text, status, job_name FROM kumiko_jobs_jobrun WHERE job_name = ANY(%s)",
        [list(JOBS)],
    ).fetchall()
    return {uuid.UUID(run).hex: (status, job) for run, status, job in rows}


def _ticks(conn: psycopg.Connection[Any]) -> set[str]:
    """Run ids of the one-second cron's ticks on one server."""
    rows = conn.execute("SELECT run_id FROM kumiko_jobs_jobrun WHERE job_name = %s", [CRON_JOB])
    return {uuid.UUID(str(run)).hex for (run,) in rows.fetchall()}


def _due_ticks(start: datetime, end: datetime) -> dict[str, datetime]:
    first = start.replace(microsecond=0) + timedelta(seconds=1)
    seconds = int((end - first).total_seconds())
    ticks = [first + timedelta(seconds=i) for i in range(seconds + 1)]
    return {tick_run_id(CRON_JOB, tick): tick for tick in ticks}


def _effects() -> list[tuple[str, str, str]]:
    """(run id hex, tenant schema, schema written in) of every soak effect on the new primary."""
    out = []
    for schema in SCHEMAS:
        for message in effects(schema, soak.EFFECT):
            run_id, _attempt, where = message.split()
            out.append((uuid.UUID(run_id).hex, schema, where))
    return out


def test_primary_fails_and_the_promoted_replica_takes_over_under_load(
    pair: tuple[OwnPostgres, OwnPostgres], procs: Processes
) -> None:
    primary, replica = pair
    default, env = _pair_settings(primary, replica)
    with default_connection_on(primary, NAME, **default):
        call_command("kumiko_jobs", "roles", stdout=io.StringIO())  # roles are cluster-wide
        workers = [procs.start(env=env) for _ in range(2)]
        scheduler = procs.start("rqscheduler", "--interval", "1", env={**env, **CRON_ENV})
        relay = procs.start("kumiko_jobs", "relay", "--loop", "--interval", "1", env=env)
        procs.wait_ready(2, scheduler=True)

        def why() -> str:
            return f"{procs.logs()}\n--- primary\n{primary.log()}\n--- replica\n{replica.log()}"

        load = Load()
        load.start()
        ticks_from = timezone.now()
        try:
            _wait("runs before the failure", lambda: load.count() >= 30, 60, why)
            _wait("successes before the failure", lambda: _succeeded(primary) >= 10, 60, why)

            # 1. The replica is cut off; what it holds then is what the promotion keeps.
            _cut_off(replica)
            _wait("the replica to replay what reached it", lambda: _caught_up(replica), 60, why)
            cut = time.monotonic()
            with _raw(replica) as conn:
                at_promotion = _runs(conn)
                ticks_there = _ticks(conn)
                replayed = _one(conn, "SELECT pg_last_wal_replay_lsn()::text")
            unfinished_there = [r for r, (st, _job) in at_promotion.items() if st != "succeeded"]

            def progressed() -> bool:
                with _raw(primary) as conn:
                    done = _one(
                        conn,
                        "SELECT count(*) FROM kumiko_jobs_jobrun "
                        "WHERE status = 'succeeded' AND run_id = ANY(%s)",
                        [[uuid.UUID(r) for r in unfinished_there]],
                    )
                    ticked = _ticks(conn) - ticks_there
                return load.count(since=cut) >= 2 * BATCH and done >= 3 and bool(ticked)

            _wait("commits and successes the replica does not get", progressed, 60, why)
            # 2. The primary dies.
            connections["default"].close()
            primary.stop("immediate")
            # A while with no primary, as failover tooling takes to decide: the workers
            # take messages they cannot start, this process's enqueues are refused.
            errors = load.errors
            _wait("enqueues refused with no primary", lambda: load.errors >= errors + 3, 60, why)

            # 3. The promotion; everything must follow within FOLLOW_WITHIN.
            promoted_wall = timezone.now()
            relay_log = len(procs.log_of(relay))
            replica.promote()
            promoted = time.monotonic()
            with _raw(replica) as conn:
                kept = _one(conn, "SELECT pg_last_wal_replay_lsn()::text")
            assert kept == replayed, "the promotion replayed more than the test read"

            followed: dict[str, float] = {}

            def follow(what: str, check: Callable[[], object]) -> None:
                left = FOLLOW_WITHIN - (time.monotonic() - promoted)
                _wait(
                    f"{what} on the new primary, {FOLLOW_WITHIN:.0f} s after the promotion",
                    check,
                    left,
                    why,
                )
                followed[what] = round(time.monotonic() - promoted, 1)

            def workers_writing() -> bool:
                names = JobAttempt.objects.filter(started_at__gt=promoted_wall).values_list(
                    "worker", flat=True
                )
                return len(set(names)) >= len(workers)

            follow("this process's enqueues", lambda: load.count(since=promoted) >= BATCH)
            follow("both workers", workers_writing)
            follow(
                "rqscheduler (cron ticks)",
                lambda: JobRun.objects.filter(
                    job_name=CRON_JOB, queued_at__gt=promoted_wall
                ).exists(),
            )
            follow(
                "the relay loop",
                lambda: "checked" in procs.log_of(relay)[relay_log:],
            )
            _wait("runs after the promotion", lambda: load.count(since=promoted) >= 30, 60, why)
        finally:
            load.stop.set()
            load.join(60)

        committed = set(load.committed)
        before = {r for r, at in load.committed.items() if at < promoted}
        with _raw(replica) as conn:
            on_new = _runs(conn)
        ours = [r for r in on_new if r in committed or r in load.uncertain]

        def unfinished() -> Any:
            return JobRun.objects.filter(pk__in=ours).exclude(status=RunStatus.SUCCEEDED)

        procs.wait_for(
            "every run the new primary holds to succeed",
            lambda: not unfinished().exists(),
            deadline=150,
            explain=lambda: str(list(unfinished().values_list("pk", "status", "attempts")[:20])),
        )
        # The same processes all along: they followed the promotion without a restart.
        assert all(w.poll() is None for w in workers), procs.logs()
        assert scheduler.poll() is None and relay.poll() is None, procs.logs()
        with _raw(replica) as conn:
            final = _runs(conn)
            ticks_new = _ticks(conn)
        ticks_to = timezone.now() - timedelta(seconds=3)
        rejected = list(RejectedMessage.objects.values_list("rq_job_id", "reason"))
        found = _effects()
        probed = {
            (p.tag, schema): p.schema_seen
            for schema in SCHEMAS
            for p in probes(schema)
            if p.tag.startswith("seq-")
        }

        # 4. Back again, with the workers idle: the old primary's place (its port) is taken by
        # a new standby of the new primary, which is stopped and the standby promoted. The
        # workers' kept sessions, tenant logins included, died while idle: the next run of
        # every tenant must succeed on its first attempt (core.idle_connections).
        back = replica.replica("back", port=primary.port)
        try:
            with _raw(replica) as conn:
                target = _one(conn, "SELECT pg_current_wal_lsn()::text")
            _wait(
                "the new standby to catch up",
                lambda: _caught_up_to(back, target),
                60,
                why,
            )
            connections["default"].close()
            replica.stop("immediate")
            back.promote()
            promoted_back = time.monotonic()
            idle_after: list[str] = []

            def enqueued(schema: str) -> bool:
                idle_after.append(str(jobs.probe.enqueue(tenant=schema, tag="back").run_id))
                return True

            for schema in SCHEMAS:
                _wait(
                    f"an enqueue for {schema} after failing back",
                    functools.partial(enqueued, schema),
                    FOLLOW_WITHIN,
                    why,
                )

            def back_done() -> bool:
                waiting = (RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.DEFERRED)
                return not JobRun.objects.filter(pk__in=idle_after, status__in=waiting).exists()

            _wait("the runs after failing back", back_done, FOLLOW_WITHIN, why)
            followed["failing back (idle): a run of each tenant done"] = round(
                time.monotonic() - promoted_back, 1
            )
            after_back = list(
                JobRun.objects.filter(pk__in=idle_after).values_list("status", "attempts")
            )
            assert after_back == [(RunStatus.SUCCEEDED, 1)] * len(SCHEMAS), (
                after_back,
                procs.logs(),
            )
            assert all(w.poll() is None for w in workers), procs.logs()
            assert scheduler.poll() is None and relay.poll() is None, procs.logs()
        finally:
            connections["default"].close()
            back.close()

    procs.stop_all()
    # 5. What the old primary had committed: itself, started alone on a port of its own.
    primary.port = free_port()
    primary.start()
    with _raw(primary) as conn:
        on_old = _runs(conn)
        ticks_old = _ticks(conn)
        old_end = _one(conn, "SELECT redo_lsn::text FROM pg_control_checkpoint()")
    primary.stop("fast")

    lacked = set(on_old) - set(at_promotion)  # committed there, never replayed here
    lost = committed - set(final)
    # Runs the replica had, unfinished, that had succeeded on the old primary: run again.
    behind = {
        run
        for run, (status, _job) in at_promotion.items()
        if status != RunStatus.SUCCEEDED and on_old[run][0] == RunStatus.SUCCEEDED
    }
    due = _due_ticks(ticks_from, ticks_to)
    missing = set(due) - ticks_new
    lost_ticks = ticks_old - ticks_there  # rung on the old primary after the cut
    print(
        f"\ncron: {len(due)} due ticks, {len(missing)} missing on the new primary "
        f"({len(lost_ticks)} rung on the old primary only: "
        f"{sorted(due[t].strftime('%X') for t in lost_ticks if t in due)}; never written: "
        f"{sorted(due[t].strftime('%X') for t in missing - lost_ticks)})"
    )
    print(
        f"\nfailover: {len(committed)} runs committed ({len(load.uncertain)} uncertain, "
        f"{load.errors} batches refused); the replica lacked {len(lacked)} runs at promotion "
        f"({_lsn(old_end) - _lsn(replayed)} bytes of WAL, {len(lost)} of them committed by "
        f"this test); {len(behind)} runs it had were behind their success on the old primary "
        f"({dict(Counter(at_promotion[r][0] for r in behind))} there; run again); "
        f"{len(rejected)} messages of lost runs refused; plain effects twice: "
        f"{sum(1 for r, n in Counter(x for x, _s, _w in found).items() if n > 1)}; followed after "
        f"{followed} s (of {FOLLOW_WITHIN:.0f})"
    )

    # Every commit this test saw is on the old primary (synchronous_commit on, locally), and
    # what the new primary lacks is exactly what the replica had not replayed.
    assert before <= set(on_old)
    assert lost == lacked & committed
    assert _lsn(old_end) > _lsn(replayed), "the old primary wrote WAL the replica never got"
    assert lost, "the replica fell behind: some committed runs must be missing"
    assert behind, "the replica fell behind: some successes must be missing"
    # Cron ticks written on the old primary only are lost too: the scheduler's alarm has moved
    # on, and none of them rings again on the new primary.
    assert lost_ticks, "the primary rang a tick after the cut"
    assert lost_ticks <= missing and not lost_ticks & ticks_new
    # Lost runs are not recreated: no row, no effect; their messages are refused.
    lost_hex = lost
    assert not lost_hex & {run for run, _schema, _where in found}, "a lost run ran again"
    refused = {job_id.split("-")[1] for job_id, _reason in rejected}
    assert refused <= lost_hex, rejected
    assert all("history row is gone" in reason for _job, reason in rejected), rejected
    # Everything else the new primary holds succeeded: no run stuck in running or waiting.
    assert {final[r][0] for r in ours} == {RunStatus.SUCCEEDED}
    assert not JobRun.objects.filter(status=RunStatus.RUNNING).exists()
    # Effects: atomic ones exactly once, plain ones at least once, each in its tenant's schema.
    counted = Counter(run for run, _schema, _where in found)
    atomic = {r for r in ours if final[r][1] == soak.ATOMIC_JOB}
    assert all(counted[r] == 1 for r in atomic), "an atomic run's effect twice (or never)"
    plain = {r for r in ours if final[r][1] == "soak.work"}
    assert all(counted[r] >= 1 for r in plain), "a plain run without its effect"
    assert all(schema == where for _run, schema, where in found), "an effect in another schema"
    # The sequential runs too (their slot is in Redis; none waits for one a lost run held).
    sequential = {load.tags[r] for r in ours if final[r][1] == SEQUENTIAL}
    assert sequential <= {tag for tag, _schema in probed}, "a sequential run without its effect"
    assert not {load.tags[r] for r in lost if r in load.tags} & {t for t, _s in probed}
    assert all(schema == seen for (_tag, schema), seen in probed.items()), "another schema"
    # Each follow-over within the bound (checked by follow() already; stated for the record).
    assert max(followed.values()) <= FOLLOW_WITHIN, followed


def test_a_success_the_promoted_replica_lacks_is_run_again_or_on_a_last_attempt_abandoned(
    pair: tuple[OwnPostgres, OwnPostgres], procs: Processes, tmp_path: Path
) -> None:
    """A run the new primary holds ``running``, whose success committed on the old primary
    only, made certain: the case the first test meets by chance (and that failed it in CI).

    Two sequential runs start on the primary, and the replica replays their starts; then it is
    cut off, and both succeed on the primary (their bodies wait for the test's signal). The
    primary dies and the replica is promoted: it holds both ``running``, under live workers
    that have moved on. The sweep hands both back (docs/reliability.md, rule 1): the run with
    a retry left runs again and succeeds, its effect once on the new primary; the run on its
    last attempt (``retries=0``) fails as ``Abandoned``, as after any attempt whose end is
    unknown: kumiko cannot tell a success lost with the old primary from an attempt cut off,
    and never runs a job more often than its retries allow. It is not lost (failed, with the
    reason, its effect gone with its success: nothing says it ran), and not stuck. Its slot is
    free: the next run of the job in that tenant succeeds on its first attempt.
    """
    primary, replica = pair
    default, env = _pair_settings(primary, replica)
    gate = tmp_path / "go"  # the bodies' signal to end their first attempt
    with default_connection_on(primary, NAME, **default):
        call_command("kumiko_jobs", "roles", stdout=io.StringIO())
        for _ in range(2):
            procs.start(env=env)
        procs.wait_ready(2)

        retried = jobs.held_retried.enqueue(tenant="t1", tag="retried", gate=str(gate))
        last = jobs.held_once.enqueue(tenant="t2", tag="last", gate=str(gate))
        ids = [retried.run_id, last.run_id]
        runs = JobRun.objects.filter(pk__in=ids)

        def why() -> str:
            state = list(runs.values_list("job_name", "status", "attempts", "error_message"))
            servers = f"--- primary\n{primary.log()}\n--- replica\n{replica.log()}"
            return f"{state}\n{procs.logs()}\n{servers}"

        _wait(
            "both runs to start",
            lambda: runs.filter(status=RunStatus.RUNNING).count() == 2,
            60,
            why,
        )
        with _raw(primary) as conn:
            # The insert position: a start commits asynchronously (history/run_sql.py), so its
            # commit record may not be written yet (pg_current_wal_lsn is the write position).
            started = _one(conn, "SELECT pg_current_wal_insert_lsn()::text")
        _wait("the replica to replay the starts", lambda: _caught_up_to(replica, started), 60, why)
        _cut_off(replica)
        _wait("the replica to replay what reached it", lambda: _caught_up(replica), 60, why)
        gate.touch()
        _wait(
            "both runs to succeed on the primary",
            lambda: runs.filter(status=RunStatus.SUCCEEDED).count() == 2,
            60,
            why,
        )
        # What the replica holds (the promotion keeps it: checked below), read before the
        # promotion: the workers' sweep may hand the runs back the moment it ends.
        with _raw(replica) as conn:
            held = _one(
                conn,
                "SELECT array_agg(status::text) FROM kumiko_jobs_jobrun WHERE run_id = ANY(%s)",
                [[uuid.UUID(str(r)) for r in ids]],
            )
            replayed = _one(conn, "SELECT pg_last_wal_replay_lsn()::text")
        assert held == [RunStatus.RUNNING] * 2, held
        connections["default"].close()
        primary.stop("immediate")
        replica.promote()
        with _raw(replica) as conn:
            kept = _one(conn, "SELECT pg_last_wal_replay_lsn()::text")
        assert kept == replayed, "the promotion replayed more than the test read"

        waiting = (RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.DEFERRED)
        _wait(
            "the sweep to hand both back",
            lambda: not runs.filter(status__in=waiting).exists(),
            60,
            why,
        )
        assert JobRun.objects.get(pk=retried.run_id).status == RunStatus.SUCCEEDED, why()
        assert attempts_of(retried.run_id) == [(1, "failed", "Abandoned"), (2, "succeeded", "")]
        assert [p.attempt for p in probes("t1") if p.tag == "retried"] == [2]
        run = JobRun.objects.get(pk=last.run_id)
        assert (run.status, run.attempts, run.error_type) == (RunStatus.FAILED, 1, "Abandoned")
        assert "is alive but no longer executes it" in run.error_message, run.error_message
        assert attempts_of(last.run_id) == [(1, "failed", "Abandoned")]
        assert not [p for p in probes("t2") if p.tag == "last"], "lost with its success"

        after = jobs.held_once.enqueue(tenant="t2", tag="after", gate=str(gate))
        _wait(
            "the next sequential run of the tenant",
            lambda: not JobRun.objects.filter(pk=after.run_id, status__in=waiting).exists(),
            30,
            why,
        )
        assert JobRun.objects.filter(pk=after.run_id).values_list("status", "attempts").get() == (
            RunStatus.SUCCEEDED,
            1,
        )
        connections["default"].close()
