"""Reliability: the outbox relay, worker crashes and shutdowns, tenant lifecycle, idempotency.

Crash tests run real ``manage.py rqworker`` processes (``python -m bench.soak manage rqworker``:
the same command, with the soak's jobs declared, and faster liveness settings than the
defaults) and kill them with SIGKILL mid-run. Every wait has a deadline far below the jobs'
600 s timeout, so a recovery they see cannot come from the timeout rule; no test asserts how
long anything took.
"""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import connection, transaction
from django.test import override_settings
from django.utils import timezone

from bench import soak
from kumiko_jobs import transport
from kumiko_jobs.models import JobAttempt, JobRun, RejectedMessage, RunStatus
from kumiko_jobs.transport import keys as transport_keys
from kumiko_jobs.worker.relay import pending_rq_job_ids, relay_pending
from kumiko_jobs.worker.sweep import sweep_abandoned
from tests.chaos.workers import DEADLINE, Processes, chaos_settings
from tests.conftest import probes, work, worker_env
from tests.testapp import jobs

pytestmark = pytest.mark.usefixtures("live_db")

# Liveness and maintenance of the test workers (FAST: 1, 3, 1, 2 s; defaults: 1, 6, 10, 30 s),
# and the deadline of every wait: the chaos tests' (tests/chaos/workers.py).
fast_settings = chaos_settings


class Workers(Processes):
    """Worker processes of one test, logging to files (a full pipe would block them)."""

    def start(self, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        """``rqworker default ARGS`` with the fast settings; ``env`` instead of the workers'."""
        env = dict(env or worker_env())
        env[soak.SETTINGS_ENV] = json.dumps(fast_settings())
        env.setdefault("KUMIKO_LOG", "WARNING")
        return self.launch(("rqworker", "default", *args), env, name="worker")


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Workers]:
    pool = Workers(tmp_path)
    yield pool
    pool.stop_all()


def status(run_id: str) -> str:
    return str(JobRun.objects.values_list("status", flat=True).get(pk=run_id))


def effects(schema: str, kind: str) -> list[str]:
    from django_tenants.utils import schema_context

    from example_project.billing.models import ActivityLog

    with schema_context(schema):
        return list(
            ActivityLog.objects.filter(job=kind).order_by("id").values_list("message", flat=True)
        )


def attempts_of(run_id: str) -> list[tuple[int, str, str]]:
    return list(
        JobAttempt.objects.filter(run_id=run_id)
        .order_by("number", "started_at")
        .values_list("number", "outcome", "error_type")
    )


# --------------------------------------------------------------------------- outbox and relay


def _unreachable_redis() -> dict[str, Any]:
    from example_project.devservices import free_port

    url = f"redis://127.0.0.1:{free_port()}/0"
    return {name: {**cfg, "URL": url} for name, cfg in settings.RQ_QUEUES.items()}


def test_enqueue_commits_while_redis_is_down_and_the_relay_pushes_it_once(tenants, caplog):
    # A request's transaction: the push fails on commit, the request does not.
    with (
        override_settings(RQ_QUEUES=_unreachable_redis()),
        caplog.at_level(logging.WARNING),
        transaction.atomic(),
    ):
        handle = jobs.probe.enqueue(tenant="t1", tag="outbox")
    assert "committed but not pushed" in caplog.text
    assert status(handle.run_id) == RunStatus.QUEUED
    assert transport.queue_length("default") == 0

    assert relay_pending(grace=0).pushed == 1
    assert relay_pending(grace=0).pushed == 0  # Redis holds it now: no second push
    assert transport.get_queue("default").job_ids == pending_rq_job_ids(
        JobRun.objects.get(pk=handle.run_id)
    )
    work()
    assert status(handle.run_id) == RunStatus.SUCCEEDED
    assert [p.tag for p in probes("t1")] == ["outbox"]
    assert relay_pending(grace=0).pushed == 0


def test_relay_waits_for_the_grace_period(tenants, redis_conn):
    handle = jobs.probe.enqueue(tenant="t2", tag="fresh")
    redis_conn.flushdb()  # Redis restarted without its data
    assert relay_pending().pushed == 0  # RELAY_GRACE (30 s): the push might be in flight
    JobRun.objects.filter(pk=handle.run_id).update(queued_at=timezone.now() - timedelta(seconds=31))
    assert relay_pending().pushed == 1
    work()
    assert status(handle.run_id) == RunStatus.SUCCEEDED


def test_relay_restores_a_scheduled_retry_lost_with_redis(tenants, redis_conn):
    handle = soak.job("soak.work").enqueue(tenant="t1", n=1, fail_first=True)
    work()  # attempt 1 fails; attempt 2 waits one second in rq-scheduler
    run = JobRun.objects.get(pk=handle.run_id)
    assert (run.status, run.attempts) == (RunStatus.QUEUED, 1)
    redis_conn.flushdb()
    JobRun.objects.filter(pk=run.pk).update(scheduled_for=timezone.now())

    assert relay_pending(grace=0).pushed == 1
    assert transport.get_queue("default").job_ids == [f"kj-{handle.run_id}-a2-d0-g0"]
    work()
    run.refresh_from_db()
    assert (run.status, run.attempts) == (RunStatus.SUCCEEDED, 2)
    assert effects("t1", "soak") == [f"{handle.run_id} a2 t1"]


def test_relay_restores_a_deferral_lost_with_redis(tenants, redis_conn):
    handle = soak.job("soak.work").enqueue(tenant="t3", n=2, defer_first=True)
    work()
    assert status(handle.run_id) == RunStatus.DEFERRED
    redis_conn.flushdb()
    JobRun.objects.filter(pk=handle.run_id).update(scheduled_for=timezone.now())

    assert relay_pending(grace=0).pushed == 1
    assert transport.get_queue("default").job_ids == [f"kj-{handle.run_id}-a1-d1-g0"]
    work()
    run = JobRun.objects.get(pk=handle.run_id)
    assert (run.status, run.attempts, run.defer_count) == (RunStatus.SUCCEEDED, 1, 1)


def test_relay_pushes_again_what_rq_gave_up_on(tenants):
    """A worker took the message while PostgreSQL was down: RQ holds it as failed, the run
    is still queued."""
    handle = jobs.probe.enqueue(tenant="t2", tag="pg-was-down")
    queue = transport.get_queue("default")
    rq_job = queue.fetch_job(queue.job_ids[0])
    queue.remove(rq_job)
    rq_job.set_status("failed")
    queue.failed_job_registry.add(rq_job, ttl=600, exc_string="OperationalError")

    assert relay_pending(grace=0).pushed == 1
    assert rq_job.id not in queue.failed_job_registry.get_job_ids()
    work()
    assert status(handle.run_id) == RunStatus.SUCCEEDED


def test_relay_pushes_again_what_a_dead_worker_took_off_the_queue(tenants, redis_conn):
    """Killed between taking the message (RQ moves it to an intermediate list) and starting it."""
    handle = jobs.probe.enqueue(tenant="t3", tag="stranded")
    queue = transport.get_queue("default")
    job_id = queue.job_ids[0]
    redis_conn.lmove(queue.key, queue.intermediate_queue_key, "LEFT", "RIGHT")

    assert relay_pending(grace=0).pushed == 0  # first sighting: a live worker may be starting it
    redis_conn.set(f"kumiko:relay:taken:{job_id}", time.time() - 60)  # seen a minute ago
    assert relay_pending(grace=0).pushed == 1
    assert redis_conn.lrange(queue.intermediate_queue_key, 0, -1) == []
    work()
    assert status(handle.run_id) == RunStatus.SUCCEEDED
    assert [p.tag for p in probes("t3")] == ["stranded"]


def test_relay_fails_runs_of_jobs_that_no_longer_exist(tenants):
    handle = jobs.probe.enqueue(tenant="t1", tag="renamed")
    transport.get_queue("default").empty()
    JobRun.objects.filter(pk=handle.run_id).update(job_name="testapp.removed_since")
    result = relay_pending(grace=0)
    assert (result.pushed, result.failed) == (0, 1)
    run = JobRun.objects.get(pk=handle.run_id)
    assert run.status == RunStatus.FAILED and run.error_type == "JobNotRegistered"


def test_relay_command(tenants, redis_conn, capsys):
    from django.core.management import call_command

    handle = jobs.probe.enqueue(tenant="t3", tag="cli")
    redis_conn.flushdb()
    call_command("kumiko_jobs", "relay", "--grace", "0")
    assert "pushed 1" in capsys.readouterr().out
    work()
    assert status(handle.run_id) == RunStatus.SUCCEEDED


# --------------------------------------------------------------------------- crash detection


def _liveness_data(redis: Any, *, age: float = 100.0) -> None:
    redis.set(transport_keys.WORKERS_SINCE_KEY, time.time() - age)


def _running(handle: Any, rq_job_id: str, worker_name: str, started_ago: float = 10.0) -> None:
    from kumiko_jobs.transport import JsonJob

    redis = transport.connection_for("default")
    JobRun.objects.filter(pk=handle.run_id).update(
        status=RunStatus.RUNNING,
        attempts=1,
        started_at=timezone.now() - timedelta(seconds=started_ago),
        rq_job_id=rq_job_id,
    )
    redis.hset(JsonJob.key_for(rq_job_id), "worker_name", worker_name)


@override_settings(KUMIKO_JOBS=fast_settings())
def test_sweep_tells_dead_live_and_foreign_workers_apart(tenants, redis_conn):
    transport.get_queue("default").empty()
    _liveness_data(redis_conn)
    dead = jobs.flaky.enqueue(tenant="t1", tag="dead", fail_times=0)
    live = jobs.flaky.enqueue(tenant="t1", tag="live", fail_times=0)
    foreign = jobs.flaky.enqueue(tenant="t1", tag="foreign", fail_times=0)
    young = jobs.flaky.enqueue(tenant="t1", tag="young", fail_times=0)
    for handle, name in ((dead, "ghost"), (live, "busy"), (foreign, "plain-rq")):
        _running(handle, f"kj-{handle.run_id}-a1-d0-g0", name)
    _running(young, f"kj-{young.run_id}-a1-d0-g0", "ghost", started_ago=0)
    prefix = transport.SimpleWorkerBase.redis_worker_namespace_prefix
    redis_conn.hset(prefix + "ghost", mapping={"birth": "then", "kumiko": "1"})  # killed
    redis_conn.hset(prefix + "plain-rq", mapping={"birth": "then"})  # alive, no liveness beats
    redis_conn.set(transport_keys.WORKER_KEY + "busy", f"kj-{live.run_id}-a1-d0-g0", ex=30)
    redis_conn.sadd(transport_keys.LIVE_WORKERS, "busy")

    assert sweep_abandoned() == (1, 0)

    run = JobRun.objects.get(pk=dead.run_id)
    assert run.status == RunStatus.QUEUED
    assert "worker ghost stopped" in run.error_message
    for handle in (live, foreign, young):
        assert status(handle.run_id) == RunStatus.RUNNING


@override_settings(KUMIKO_JOBS=fast_settings())
def test_sweep_waits_while_liveness_is_unknown(tenants, redis_conn):
    handle = jobs.flaky.enqueue(tenant="t1", tag="after-flush", fail_times=0)
    _running(handle, f"kj-{handle.run_id}-a1-d0-g0", "ghost")
    _liveness_data(redis_conn, age=1)  # Redis just lost its data: no worker has beaten yet
    assert sweep_abandoned() == (0, 0)
    _liveness_data(redis_conn, age=100)
    assert sweep_abandoned() == (1, 0)


def test_a_beat_names_the_job_and_brings_its_runs_cancellation(redis_conn):
    """The worker's beat (transport.beat): what the sweep reads, and the cancellation it
    carries back from the key an operator's request writes (transport.request_cancel)."""
    run_hex = "a" * 32
    job_id = f"kj-{run_hex}-a1-d0-g0"
    assert transport.beat(redis_conn, "w1", "", 30) is None  # idle: no run to cancel
    assert redis_conn.get(transport_keys.WORKER_KEY + "w1") == b""
    assert transport.beat(redis_conn, "w1", job_id, 30) is None  # nobody asked
    assert redis_conn.get(transport_keys.WORKER_KEY + "w1") == job_id.encode()
    assert 0 < redis_conn.ttl(transport_keys.WORKER_KEY + "w1") <= 30
    assert redis_conn.smembers(transport_keys.LIVE_WORKERS) == {b"w1"}
    assert redis_conn.exists(transport_keys.WORKERS_SINCE_KEY)
    transport.request_cancel(redis_conn, run_hex, "operator", 30)
    assert transport.beat(redis_conn, "w1", job_id, 30) == "operator"
    transport.request_cancel(redis_conn, "b" * 32, "", 30)  # who asked is unknown: "-"
    assert transport.beat(redis_conn, "w1", f"kj-{'b' * 32}-a2-d0-g0", 30) == "-"

    transport.goodbye(redis_conn, "w1")
    assert not redis_conn.exists(transport_keys.WORKER_KEY + "w1")
    assert redis_conn.smembers(transport_keys.LIVE_WORKERS) == set()


def _crash_mid_run(workers: Workers, job_name: str, tag: str) -> str:
    handle = soak.job(job_name).enqueue(tenant="t1", tag=tag, seconds=60)
    victim = workers.start()
    workers.wait_for("the run to start", lambda: status(handle.run_id) == RunStatus.RUNNING)
    victim.send_signal(signal.SIGKILL)
    assert victim.wait() == -signal.SIGKILL
    workers.start()  # the survivor: sweeps, relays, and runs the retry
    return handle.run_id


def test_kill_9_mid_run_is_retried_by_another_worker(tenants, workers):
    run_id = _crash_mid_run(workers, "soak.sleeper", "crash")
    workers.wait_for("the retry to succeed", lambda: status(run_id) == RunStatus.SUCCEEDED)

    run = JobRun.objects.get(pk=run_id)
    assert run.attempts == 2
    assert attempts_of(run_id) == [(1, "failed", "Abandoned"), (2, "succeeded", "")]
    abandoned = JobAttempt.objects.get(run_id=run_id, number=1)
    assert "stopped (no liveness for 3 s)" in abandoned.error_message
    assert effects("t1", "sleeper") == ["crash a2 t1"]  # the killed attempt left nothing


def test_kill_9_on_the_last_attempt_fails_the_run_as_abandoned(tenants, workers):
    run_id = _crash_mid_run(workers, "soak.sleeper_once", "last")
    workers.wait_for("the run to fail", lambda: status(run_id) == RunStatus.FAILED)

    run = JobRun.objects.get(pk=run_id)
    assert run.error_type == "Abandoned" and "abandoned" in run.error_message
    assert run.finished_at is not None
    assert effects("t1", "sleeper") == []


def test_warm_shutdown_lets_the_current_run_finish(tenants, workers):
    handle = soak.job("soak.sleeper").enqueue(tenant="t2", tag="warm", seconds=3)
    proc = workers.start()
    workers.wait_for("the run to start", lambda: status(handle.run_id) == RunStatus.RUNNING)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(DEADLINE) == 0
    run = JobRun.objects.get(pk=handle.run_id)
    assert (run.status, run.attempts) == (RunStatus.SUCCEEDED, 1)
    assert effects("t2", "sleeper") == ["warm a1 t2"]


def test_cold_shutdown_is_handled_like_a_crash(tenants, workers):
    handle = soak.job("soak.sleeper").enqueue(tenant="t3", tag="cold", seconds=60)
    proc = workers.start()
    workers.wait_for("the run to start", lambda: status(handle.run_id) == RunStatus.RUNNING)
    proc.send_signal(signal.SIGTERM)
    time.sleep(1.5)  # RQ ignores a second signal within one second of the first
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(DEADLINE) == 1
    assert status(handle.run_id) == RunStatus.RUNNING  # nothing was recorded: a crash

    workers.start()
    workers.wait_for("the retry", lambda: status(handle.run_id) == RunStatus.SUCCEEDED)
    assert attempts_of(handle.run_id) == [(1, "failed", "Abandoned"), (2, "succeeded", "")]
    assert effects("t3", "sleeper") == ["cold a2 t3"]


def test_worker_relays_what_was_committed_while_redis_was_down(tenants, workers):
    with override_settings(RQ_QUEUES=_unreachable_redis()), transaction.atomic():
        handle = jobs.probe.enqueue(tenant="t2", tag="relayed-by-a-worker")
    workers.start()  # not a burst worker: it runs the relay in the background
    workers.wait_for("the relayed run", lambda: status(handle.run_id) == RunStatus.SUCCEEDED)
    assert [p.tag for p in probes("t2")] == ["relayed-by-a-worker"]


# --------------------------------------------------------------------------- tenant lifecycle


@override_settings(
    KUMIKO_JOBS={**settings.KUMIKO_JOBS, "TENANT_DELETION": "anonymise"}  # the row stays
)
def test_run_of_a_deleted_tenant_fails_closed(tenants):
    from example_project.customers.models import Client

    doomed = Client(schema_name="t_doomed", name="Doomed")
    doomed.save()  # creates and migrates the schema
    try:
        handle = jobs.probe.enqueue(tenant=doomed, tag="orphan")
    finally:
        doomed.delete(force_drop=True)  # DROP SCHEMA ... CASCADE
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_namespace WHERE nspname = 't_doomed'")
        assert cursor.fetchone() is None

    work()

    run = JobRun.objects.get(pk=handle.run_id)
    assert run.status == RunStatus.FAILED
    assert "tenant not found: no tenant has schema 't_doomed'" in run.error_message
    assert all(not probes(schema) for schema in tenants)  # no fallback to anyone else
    with connection.cursor() as cursor:
        cursor.execute("SELECT to_regclass('public.testapp_probe')")
        assert cursor.fetchone() == (None,)  # and none to public: it has no such table


def test_a_deleted_tenants_purged_run_is_refused_not_run(tenants):
    from example_project.customers.models import Client
    from kumiko_jobs.models import RejectedMessage

    doomed = Client(schema_name="t_purged", name="Purged")
    doomed.save()
    try:
        handle = jobs.probe.enqueue(tenant=doomed, tag="orphan")
    finally:
        doomed.delete(force_drop=True)
    # TENANT_DELETION="purge" (the default) took the waiting run's row with the tenant.
    assert not JobRun.objects.filter(pk=handle.run_id).exists()
    work()
    # Its message is refused (a run is never recreated from a message): nothing ran anywhere.
    assert RejectedMessage.objects.filter(reason__contains=handle.run_id).exists()
    assert all(not probes(schema) for schema in tenants)


@pytest.fixture
def inactive_t3(tenants: dict[str, Any]) -> Iterator[Any]:
    from example_project.customers.models import Client

    Client.objects.filter(schema_name="t3").update(is_active=False)
    try:
        yield tenants["t3"]
    finally:
        Client.objects.filter(schema_name="t3").update(is_active=True)


def test_inactive_tenant_runs_are_skipped(inactive_t3):
    with override_settings(
        KUMIKO_JOBS=fast_settings(TENANT_ACTIVE_FIELD="is_active", INACTIVE_TENANT="skip")
    ):
        handle = jobs.probe.enqueue(tenant="t3", tag="skipped")
        work()
    run = JobRun.objects.get(pk=handle.run_id)
    assert run.status == RunStatus.CANCELLED
    assert run.error_message == "tenant 't3' is inactive"
    assert probes("t3") == []


def test_inactive_tenant_runs_are_deferred_until_it_is_active(inactive_t3, redis_conn):
    from example_project.customers.models import Client

    with override_settings(
        KUMIKO_JOBS=fast_settings(
            TENANT_ACTIVE_FIELD="is_active",
            INACTIVE_TENANT="defer",
            INACTIVE_TENANT_DEFER_SECONDS=1,
        )
    ):
        handle = jobs.probe.enqueue(tenant="t3", tag="later")
        work()
        assert status(handle.run_id) == RunStatus.DEFERRED
        # The deferral survives Redis losing it: the relay picks the gate's resumption.
        redis_conn.flushdb()
        JobRun.objects.filter(pk=handle.run_id).update(scheduled_for=timezone.now())
        assert relay_pending(grace=0).pushed == 1
        assert transport.get_queue("default").job_ids == [f"kj-{handle.run_id}-a1-d0-g1"]
        Client.objects.filter(schema_name="t3").update(is_active=True)
        work()
    run = JobRun.objects.get(pk=handle.run_id)
    assert (run.status, run.gate_defer_count, run.defer_count) == (RunStatus.SUCCEEDED, 1, 0)
    assert [p.tag for p in probes("t3")] == ["later"]


def test_secret_key_rotation_keeps_queued_messages_valid(tenants):
    old = settings.SECRET_KEY
    handle = jobs.probe.enqueue(tenant="t1", tag="rotated")
    with override_settings(SECRET_KEY="the-new-key-" + "x" * 40, SECRET_KEY_FALLBACKS=[old]):
        work()
    assert status(handle.run_id) == RunStatus.SUCCEEDED


def test_without_the_fallback_old_messages_are_rejected_and_the_relay_resigns(tenants):
    handle = jobs.probe.enqueue(tenant="t1", tag="orphaned-key")
    with override_settings(SECRET_KEY="the-new-key-" + "x" * 40, SECRET_KEY_FALLBACKS=[]):
        work()
        assert "bad signature" in RejectedMessage.objects.get().reason
        assert status(handle.run_id) == RunStatus.QUEUED and probes("t1") == []
        # The row in PostgreSQL is trusted; the relay signs its message with the new key.
        assert relay_pending(grace=0).pushed == 1
        work()
    assert status(handle.run_id) == RunStatus.SUCCEEDED


# --------------------------------------------------------------------------- idempotency


@pytest.fixture
def receipt_table(tenants: dict[str, Any]) -> Iterator[None]:
    with connection.cursor() as cursor:
        cursor.execute(
            'CREATE TABLE IF NOT EXISTS "t1".receipt_sent ('
            "idempotency_key varchar(300) PRIMARY KEY, invoice_id integer NOT NULL)"
        )
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute('DROP TABLE IF EXISTS "t1".receipt_sent')


def test_idempotency_key_makes_a_retried_side_effect_happen_once(receipt_table):
    handle = jobs.send_receipt.enqueue(tenant="t1", invoice_id=7, fail_after_effect=True)
    work()

    run = JobRun.objects.get(pk=handle.run_id)
    assert (run.status, run.attempts) == (RunStatus.SUCCEEDED, 2)
    with connection.cursor() as cursor:
        cursor.execute('SELECT idempotency_key, invoice_id FROM "t1".receipt_sent')
        assert cursor.fetchall() == [(f"reliability.send_receipt:{handle.run_id}", 7)]
    second = JobAttempt.objects.get(run=run, number=2)
    assert [line["msg"] for line in second.log] == ["receipt already sent by an earlier attempt"]
