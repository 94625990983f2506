"""Redis behind Sentinel: the primary fails under load, and nothing committed is lost.

Each test starts a Redis primary, one replica and three Sentinels of its own on free ports
(``redis-server <conf> --sentinel``), points this process and the real ``manage.py rqworker``
and ``manage.py rqscheduler`` processes it starts at them through django-rq's ``SENTINELS``
configuration (example_project/settings.py reads ``REDIS_SENTINELS``), keeps enqueuing while
the primary fails, and checks the run rows in PostgreSQL at the end: every committed run
succeeded, its effect happened once, no run is left ``running``.

The primary fails three ways:

* ``kill``: SIGKILL; the Sentinels promote the replica after ``down-after-milliseconds``.
* ``freeze``: SIGSTOP, the harder case for clients: the TCP connections stay open and nothing
  answers, so only a socket timeout gets a client off it. After the promotion it gets SIGCONT
  and comes back as a replica of the new primary; whatever it accepted meanwhile is dropped.
* ``failover``: ``SENTINEL FAILOVER`` while the old primary stays up: clients that keep talking
  to it get ``READONLY`` (writes) or ``UNBLOCKED`` (a blocking dequeue) once it is a replica.

Replication is asynchronous, so keys written just before the failure may be missing on the
new primary. After the promotion the test deletes kumiko's cron entries there (what a primary
that failed right after the scheduler registered them would leave) and checks that the
running scheduler puts them back.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from django.conf import settings
from django.db import connection
from django.test import override_settings

from bench import soak
from kumiko_jobs import transport
from kumiko_jobs.definition.registry import registry
from kumiko_jobs.enqueueing.schedules import schedule_id
from kumiko_jobs.models import JobRun, RunStatus
from kumiko_jobs.transport import keys as transport_keys
from tests.conftest import TENANTS, probes
from tests.integration.test_outages import _start_scheduler
from tests.integration.test_reliability import Workers, fast_settings
from tests.testapp import jobs

pytestmark = pytest.mark.usefixtures("live_db")

MASTER = "kumiko"
DEADLINE = 60.0  # a safety net for each wait, not a measurement
SOCKET_TIMEOUT = 1.0


def _free_port() -> int:
    from example_project.devservices import free_port

    return int(free_port())


def _wait(what: str, check: Callable[[], bool], deadline: float = DEADLINE, why: Any = "") -> None:
    start = time.monotonic()
    end = start + deadline
    while True:
        try:
            if check():
                if os.environ.get("KUMIKO_FAILOVER_TRACE"):  # where the test's time goes
                    print(f"[{time.strftime('%X')}] {time.monotonic() - start:5.1f} s: {what}")
                return
        except redis.RedisError:
            pass  # a server that is being failed over; the deadline bounds it
        if time.monotonic() > end:
            detail = why() if callable(why) else why
            pytest.fail(f"gave up waiting for {what} after {deadline:.0f} s\n{detail}")
        time.sleep(0.1)


class SentinelCluster:
    """A primary, a replica and three Sentinels, all on free ports of 127.0.0.1."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.primary = _free_port()
        self.replica = _free_port()
        self.sentinels: list[int] = []

    # --- processes

    def _spawn(self, port: int, *args: str) -> None:
        work = self.base / f"redis-{port}"
        work.mkdir(parents=True, exist_ok=True)
        with (work / "log").open("ab") as log:
            self.procs[port] = subprocess.Popen(
                [soak.OwnRedis.executable(), *args],
                cwd=work,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def _data_node(self, port: int, *extra: str) -> None:
        self._spawn(
            port,
            *("--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"),
            *("--dir", str(self.base / f"redis-{port}")),
            # A new replica's first sync waits 5 s by default for more replicas to join it.
            *("--repl-diskless-sync-delay", "0"),
            *extra,
        )

    def _sentinel(self) -> None:
        port = _free_port()
        conf = self.base / f"sentinel-{port}.conf"
        conf.write_text(
            f"port {port}\n"
            "bind 127.0.0.1\n"
            f"dir {self.base}\n"
            f"sentinel monitor {MASTER} 127.0.0.1 {self.primary} 2\n"
            # Fast enough for a test; production values are seconds to tens of seconds.
            f"sentinel down-after-milliseconds {MASTER} 1000\n"
            f"sentinel failover-timeout {MASTER} 3000\n"
            f"sentinel parallel-syncs {MASTER} 1\n"
        )
        self._spawn(port, str(conf), "--sentinel")
        self.sentinels.append(port)

    def start(self) -> SentinelCluster:
        self._data_node(self.primary)
        _wait("the primary", lambda: self.client(self.primary).ping())
        self._data_node(self.replica, "--replicaof", "127.0.0.1", str(self.primary))
        for _ in range(3):
            self._sentinel()
        _wait("the replica's link to the primary", lambda: self.link_up(self.replica))
        # A failover needs a quorum of Sentinels that know the replica and each other; they
        # learn both through the primary's hello channel, every 2 s.
        for port in self.sentinels:
            _wait(
                f"sentinel {port} to know the replica and its peers",
                lambda p=port: (
                    len(self.sentinel(p).sentinel_slaves(MASTER)) == 1
                    and len(self.sentinel(p).sentinel_sentinels(MASTER)) == 2
                ),
                why=self.logs,
            )
        return self

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)  # a frozen process cannot die otherwise
                proc.kill()
            proc.wait(10)

    def logs(self) -> str:
        return "\n".join(
            f"--- {path.parent.name}\n{path.read_text(errors='replace')[-2500:]}"
            for path in sorted(self.base.glob("redis-*/log"))
        )

    # --- clients

    def client(self, port: int, db: int = 0) -> redis.Redis:
        return redis.Redis(port=port, db=db, socket_timeout=SOCKET_TIMEOUT)

    def sentinel(self, port: int | None = None) -> redis.Redis:
        return redis.Redis(port=port or self.sentinels[0], socket_timeout=SOCKET_TIMEOUT)

    def primary_port(self) -> int:
        # Unanimous, so that a client asking any Sentinel gets this one.
        ports = {
            int(self.sentinel(p).sentinel_get_master_addr_by_name(MASTER)[1])
            for p in self.sentinels
        }
        return ports.pop() if len(ports) == 1 else 0

    def restart_as_replica(self, port: int, *, of: int) -> None:
        self.procs[port].wait(10)
        self._data_node(port, "--replicaof", "127.0.0.1", str(of))

    def wait_replica_ready(self, port: int) -> None:
        """In sync, and every Sentinel sees it as a replica it could promote."""

        def ready() -> bool:
            if not self.link_up(port):
                return False
            for sentinel in self.sentinels:
                known = {int(r["port"]): r for r in self.sentinel(sentinel).sentinel_slaves(MASTER)}
                replica = known.get(port)
                if (
                    replica is None
                    or replica["is_sdown"]
                    or replica["is_disconnected"]
                    or replica.get("master-link-status") != "ok"
                ):
                    return False
            return True

        _wait(f"replica {port} to be ready for a failover", ready, why=self.logs)

    def role(self, port: int) -> str:
        return str(self.client(port).info("replication")["role"])

    def link_up(self, port: int) -> bool:
        return self.client(port).info("replication").get("master_link_status") == "up"

    def rq_queues(self, db: str) -> dict[str, Any]:
        connection = {
            "SENTINELS": [("127.0.0.1", p) for p in self.sentinels],
            "MASTER_NAME": MASTER,
            "DB": int(db),
            "SOCKET_TIMEOUT": SOCKET_TIMEOUT,
            "SENTINEL_KWARGS": {"socket_timeout": SOCKET_TIMEOUT},
        }
        return {
            name: {
                **{k: v for k, v in cfg.items() if k not in ("URL", "HOST", "PORT", "DB")},
                **connection,
            }
            for name, cfg in settings.RQ_QUEUES.items()
        }

    def env(self, base: dict[str, str]) -> dict[str, str]:
        env = dict(base)
        env["REDIS_SENTINELS"] = ",".join(f"127.0.0.1:{p}" for p in self.sentinels)
        env["REDIS_SENTINEL_MASTER"] = MASTER
        env["REDIS_SOCKET_TIMEOUT"] = str(SOCKET_TIMEOUT)
        return env


@pytest.fixture
def cluster(tmp_path: Path, tenants: dict[str, Any]) -> Iterator[SentinelCluster]:
    cluster = SentinelCluster(tmp_path)
    try:
        cluster.start()
        db = os.environ["KUMIKO_TEST_REDIS_DB"]
        with override_settings(RQ_QUEUES=cluster.rq_queues(db), KUMIKO_JOBS=fast_settings()):
            yield cluster
    finally:
        cluster.close()


class Load:
    """Enqueues runs from a thread of its own until stopped: plain ones, rate-limited ones
    (a tenant cap and a sequential job, both RQ RateLimits) and delayed ones (rq-scheduler)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.runs: dict[str, str] = {}  # run id -> tag, once the enqueue returned (committed)
        self.refused: dict[str, str] = {}  # refused by max_per_tenant: committed as ``capped``
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)

    def count(self) -> int:
        return len(self.runs)

    def _loop(self) -> None:
        i = 0
        try:
            while not self._stop.is_set():
                tag = f"{self.prefix}-{i}"
                tenant = TENANTS[i % len(TENANTS)]
                try:
                    if i % 6 == 1:
                        handle = jobs.capped.enqueue(tenant=tenant, tag=tag)
                    elif i % 6 == 3:
                        handle = jobs.one_at_a_time.enqueue(tenant=tenant, tag=tag)
                    elif i % 6 == 5:
                        handle = jobs.probe.enqueue_in(1, tenant=tenant, tag=tag)
                    else:
                        handle = jobs.probe.enqueue(tenant=tenant, tag=tag)
                except Exception as exc:  # the row did not commit: nothing to account for
                    self.errors.append(f"{tag}: {exc!r}")
                else:
                    (self.runs if handle.admitted else self.refused)[str(handle.run_id)] = tag
                i += 1
                time.sleep(0.03)
        finally:
            connection.close()


def _statuses(run_ids: list[str]) -> Counter[str]:
    return Counter(JobRun.objects.filter(pk__in=run_ids).values_list("status", flat=True))


def _stuck(run_ids: list[str], redis_client: redis.Redis) -> str:
    """What Redis holds for each run that is not done yet (a failure message)."""
    from kumiko_jobs.worker.relay import pending_rq_job_ids

    lines = []
    waiting = JobRun.objects.filter(pk__in=run_ids).exclude(status=RunStatus.SUCCEEDED)
    for run in waiting[:20]:
        held = {
            job_id: redis_client.hmget(f"rq:job:{job_id}", "status", "origin", "worker_name")
            for job_id in pending_rq_job_ids(run)
        }
        lines.append(f"{run.run_id} {run.job_name} {run.status} a{run.attempts} {held}")
    return "\n".join(lines)


def _effects() -> Counter[str]:
    return Counter(p.tag for schema in TENANTS for p in probes(schema) if p.tag != "cron")


def _cron_ids() -> list[str]:
    return sorted(schedule_id(d) for d in registry if d.cron)


def _fail_primary(cluster: SentinelCluster, how: str, old: int, new: int) -> None:
    """Fail ``old`` the ``how`` way; return once ``new`` is the primary every Sentinel names."""
    proc = cluster.procs[old]
    if how == "kill":
        proc.kill()
    elif how == "freeze":
        proc.send_signal(signal.SIGSTOP)
    else:
        # Refused (INPROG, NOGOODSLAVE) while the Sentinels still settle the previous round.
        _wait(
            "the Sentinels to accept SENTINEL FAILOVER",
            lambda: bool(cluster.sentinel().execute_command("SENTINEL", "FAILOVER", MASTER)),
            why=cluster.logs,
        )
    _wait(
        "the Sentinels to promote the replica",
        lambda: cluster.primary_port() == new and cluster.role(new) == "master",
        why=cluster.logs,
    )
    if how == "freeze":
        proc.send_signal(signal.SIGCONT)


def _check_round(
    cluster: SentinelCluster, load: Load, runs: dict[str, str], new: int, why: Callable[[], str]
) -> None:
    """The end of one way: every committed run so far succeeded once; nothing else ran."""
    db = int(os.environ["KUMIKO_TEST_REDIS_DB"])
    client = cluster.client(new, db)
    ids = list(runs)
    _wait(
        "every committed run to succeed",
        lambda: _statuses(ids) == Counter({RunStatus.SUCCEEDED: len(ids)}),
        why=lambda: f"{_statuses(ids)}\n{_stuck(ids, client)}\n{why()}",
    )
    _wait(
        "rqscheduler to restore the cron entries",
        lambda: not transport.missing_cron_entries(_cron_ids()),
        why=why,
    )
    assert not load.errors, load.errors
    # Refused at enqueue (a tenant's cap reached): committed as such, and never run.
    assert _statuses(list(load.refused)) == Counter({RunStatus.CAPPED: len(load.refused)})
    effects = _effects()
    assert sorted(effects) == sorted(runs.values()), "every committed run's effect, no other"
    duplicated = {tag: n for tag, n in effects.items() if n != 1}
    assert not duplicated, f"effects that happened more than once: {duplicated}"
    assert client.scard("rq:workers") >= 2, "the workers are registered on the new primary"
    assert client.keys("rq:scheduler_instance:*"), f"no scheduler registered\n{why()}"
    # kumiko's other keys go through the same Sentinel-built clients, to the new primary.
    token = transport.boot_dataset_token("after-failover")
    assert client.get(transport_keys.BOOT_DATASET_KEY) == token.encode()
    transport.request_cancel(transport.connection_for("default"), "f" * 32, "operator", 60)
    assert client.get(transport_keys.CANCEL_KEY + "f" * 32) == b"operator"
    assert transport.scheduler_lag(60).overdue == 0


def test_primary_fails_three_ways_under_load_and_nothing_committed_is_lost(cluster, tmp_path):
    from tests.conftest import worker_env

    db = int(os.environ["KUMIKO_TEST_REDIS_DB"])
    env = cluster.env(worker_env())
    pool = Workers(tmp_path)
    scheduler = _start_scheduler(env, tmp_path)
    scheduler_log = tmp_path / "scheduler.log"
    everything = lambda: f"{cluster.logs()}\n{pool.logs()}"  # noqa: E731
    runs: dict[str, str] = {}
    cron_ids = _cron_ids()
    assert cron_ids, "the test app declares cron jobs"
    try:
        workers = [pool.start(env=env) for _ in range(2)]
        first = cluster.client(cluster.primary, db)
        _wait(
            "both workers and rqscheduler to register",
            lambda: first.scard("rq:workers") >= 2 and bool(first.keys("rq:scheduler_instance:*")),
            why=everything,
        )
        old, new = cluster.primary, cluster.replica
        for how in ("kill", "freeze", "failover"):
            cluster.wait_replica_ready(new)
            with Load(how) as load:
                _wait(
                    f"{how}: runs before the failure",
                    lambda: load.count() >= 20,
                    why=everything,
                )
                _fail_primary(cluster, how, old, new)
                promoted_at = load.count()
                # What a primary that failed right after the scheduler registered its crons
                # leaves (asynchronous replication): the new primary does not have them.
                with cluster.client(new, db).pipeline() as pipe:
                    pipe.zrem(transport.Scheduler.scheduled_jobs_key, *cron_ids)
                    pipe.delete(*(f"rq:job:{sid}" for sid in cron_ids))
                    pipe.execute()
                _wait(
                    f"{how}: runs committed after the promotion",
                    lambda n=promoted_at + 20: load.count() >= n,
                    why=everything,
                )
            runs.update(load.runs)
            _check_round(cluster, load, runs, new, everything)
            # The same processes all along: they followed the promotion instead of ending.
            assert all(w.poll() is None for w in workers), pool.logs()
            assert scheduler.poll() is None, scheduler_log.read_text()
            if how == "kill":  # back, empty, as a replica of the new primary
                cluster.restart_as_replica(old, of=new)
            else:  # the Sentinels turn the old primary into a replica of the new one
                _wait(
                    f"{how}: the old primary to come back as a replica",
                    lambda p=old: cluster.role(p) == "slave" and cluster.link_up(p),
                    why=cluster.logs,
                )
            old, new = new, old
    finally:
        pool.stop_all()
        scheduler.kill()
        scheduler.wait()


# --------------------------------------------------------------------------- lost slot releases


def _old_release_message(definition: Any, envelope: Any, delay: float, **kwargs: Any) -> Any:
    """A message as a release before the caps moved into the dequeue pushed it: behind an RQ
    ``RateLimit`` (per job and tenant for a sequential job), no caps in its fair field."""
    import dataclasses

    from kumiko_jobs.enqueueing import messages

    message = messages.message_for(definition, envelope, delay, **kwargs)
    key = f"{transport_keys.SEQUENTIAL_LIMIT}{definition.name}:{envelope.schema}"
    return dataclasses.replace(message, caps=(), rate_limit_key=key, rate_limit=1)


def test_relay_frees_a_rate_limit_slot_whose_release_redis_lost(redis_conn, monkeypatch):
    """The failover test's stall, in slow motion: a sequential job's run finished and was
    recorded, then Redis lost RQ's bookkeeping of it (status ``started``, its slot taken), so
    the next run's message waits for a slot nobody will free until the job's timeout. The
    messages are an older release's (a rolling deploy): RQ ``RateLimit``s, which this
    release's workers and relay still serve."""
    from datetime import timedelta

    from django.utils import timezone

    from kumiko_jobs.enqueueing import submit
    from kumiko_jobs.worker import relay
    from kumiko_jobs.worker.relay import pending_rq_job_ids, relay_pending
    from tests.conftest import work
    from tests.integration.test_reliability import status

    monkeypatch.setattr(submit, "message_for", _old_release_message)
    first = jobs.one_at_a_time.enqueue(tenant="t1", tag="first")
    second = jobs.one_at_a_time.enqueue(tenant="t1", tag="second")
    first_id = pending_rq_job_ids(JobRun.objects.get(pk=first.run_id))[0]
    second_id = pending_rq_job_ids(JobRun.objects.get(pk=second.run_id))[0]
    assert redis_conn.hget(f"rq:job:{second_id}", "status") == b"rate_limited"
    # What the failover left: the first run is done in PostgreSQL; in Redis its message was
    # taken and started, and the finish (which frees the slot) never arrived.
    redis_conn.lrem(transport.get_queue("default").key, 0, first_id)
    redis_conn.hset(f"rq:job:{first_id}", "status", "started")
    JobRun.objects.filter(pk=first.run_id).update(
        status=RunStatus.SUCCEEDED, attempts=1, finished_at=timezone.now() - timedelta(seconds=5)
    )

    # Finished more recently than the grace: left alone (its worker may still be releasing it).
    assert relay_pending(grace=60).pushed == 0
    assert redis_conn.hget(f"rq:job:{second_id}", "status") == b"rate_limited"
    # Calibration: the relay without the release sees a message that exists and waits for a
    # slot, so it pushes nothing, and the run would wait out the first message's timeout.
    with monkeypatch.context() as patched:
        patched.setattr(relay, "release_lost_slots", lambda cutoff: 0)
        calibration = relay_pending(grace=0)
        assert calibration.checked == 1 and calibration.pushed == 0
        assert redis_conn.hget(f"rq:job:{second_id}", "status") == b"rate_limited"

    assert relay.release_lost_slots(timezone.now() - timedelta(seconds=1)) == 1
    assert redis_conn.hget(f"rq:job:{second_id}", "status") == b"queued"
    assert relay.release_lost_slots(timezone.now()) == 0  # nothing left to free
    work()
    assert status(second.run_id) == RunStatus.SUCCEEDED
    assert [p.tag for p in probes("t1")] == ["second"]  # the first "ran" only in its row


def test_rqscheduler_registers_again_when_its_registration_is_gone(redis_conn):
    """The ``failover`` way lost the scheduler's registration without an error the scheduler
    saw; scheduler_liveness would then report no scheduler while one runs."""
    scheduler = transport.scheduler_for("default")
    scheduler.register_birth()
    redis_conn.delete(scheduler.key)
    # Calibration: rq-scheduler's own heartbeat only extends an expiry, of nothing here.
    super(transport.Scheduler, scheduler).heartbeat()
    assert not redis_conn.exists(scheduler.key)

    scheduler.heartbeat()
    assert redis_conn.hexists(scheduler.key, "birth")
    assert not redis_conn.hexists(scheduler.key, "death")
    assert 0 < redis_conn.ttl(scheduler.key) <= scheduler._interval + 10
    scheduler.heartbeat()  # present now: only its expiry is extended
    assert redis_conn.hexists(scheduler.key, "birth")


def test_rqscheduler_after_an_outage_takes_back_its_own_registration(redis_conn):
    """Its death mark lost (written to a primary that then failed over, or never sent): the
    registration it left looks alive, and rq-scheduler refuses a live name."""
    scheduler = transport.scheduler_for("default")
    scheduler.register_birth()
    # Calibration: a second start under the same name, outside a restart, is refused.
    with pytest.raises(ValueError, match="already an active RQ scheduler"):
        scheduler.register_birth()
    scheduler._restarting = True  # what run() sets after a Redis error
    scheduler.register_birth()
    assert redis_conn.hexists(scheduler.key, "birth")
    assert not scheduler._restarting
