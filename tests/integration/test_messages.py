"""Messages: expiry, the relay's re-signing, runs never recreated, cron ticks never replayed.

Real PostgreSQL schemas, real Redis, real RQ workers (``work()``) and rq-scheduler's own
``enqueue_job`` path (``transport.move_due_scheduled_jobs``). Every replay below is what someone
with write access to Redis can do: copy a job hash or a message body and push it again.
"""

from __future__ import annotations

import time
import uuid
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import connections
from django.utils import timezone

from kumiko_jobs import transport
from kumiko_jobs.core import conf
from kumiko_jobs.core.envelope import decode, encode, tick_run_id
from kumiko_jobs.enqueueing.messages import envelope_of, message_for
from kumiko_jobs.enqueueing.schedules import schedule_id, sync_schedules
from kumiko_jobs.models import JobRun, RejectedMessage, RunStatus
from kumiko_jobs.worker.relay import relay_pending
from kumiko_jobs.worker.sweep import delete_expired
from tests.conftest import TENANTS, work
from tests.testapp import jobs

pytestmark = pytest.mark.usefixtures("live_db")

SCHEDULED = "rq:scheduler:scheduled_jobs"  # rq-scheduler's sorted set of due times


def body_of(job_id: str) -> str:
    """The signed envelope string an RQ job in Redis carries (what a copier would take)."""
    job = transport.JsonJob.fetch(job_id, connection=transport.connection_for("default"))
    return str(job.args[0])


def tenant_tags(schema: str) -> list[str]:
    """Read through a second connection: what the tenant's table really holds."""
    other = connections.create_connection("default")
    try:
        with other.cursor() as cursor:
            cursor.execute(f'SELECT tag FROM "{schema}".testapp_probe ORDER BY id')
            return [row[0] for row in cursor.fetchall()]
    finally:
        other.close()


def push_copy(body: str, job_id: str) -> None:
    """Push a copied message under an RQ job id of the copier's choosing."""
    transport.push(transport.Message(body=body, queue="default", job_id=job_id, timeout=60))


def work_one() -> None:
    """A real kumiko worker that takes one message and stops (children stay queued)."""
    from kumiko_jobs.worker import Worker

    queue = transport.get_queue("default")
    Worker([queue], connection=queue.connection).work(burst=True, max_jobs=1)


def clear_of_a_minute_end() -> None:
    """Cron tests ring one tick twice; a minute ending in between would be a legitimate tick."""
    into_minute = time.time() % 60
    if into_minute > 50:
        time.sleep(60 - into_minute + 0.5)


# --- expiry -----------------------------------------------------------------------------------


def _waiting_run_with_an_expired_message(tag: str) -> str:
    """A committed run whose only message was signed and due MAX_AGE + 1 min ago.

    What a backlog looks like after Redis was unreachable for longer than MESSAGE_MAX_AGE (or a
    worker fleet stopped for that long): the row waits, its message sat in the queue.
    """
    handle = jobs.probe.enqueue(tenant="t1", tag=tag)
    queue = transport.get_queue("default")
    queue.empty()
    run = JobRun.objects.get(pk=handle.run_id)
    old = time.time() - conf.get().MESSAGE_MAX_AGE - 60
    env = envelope_of(run, attempt=1)
    message = message_for(jobs.probe, env, 0.0)
    push_copy(encode(env, now=old), message.job_id)
    return handle.run_id


def test_an_expired_message_is_refused_recorded_and_never_runs(tenants):
    run_id = _waiting_run_with_an_expired_message("expired")
    work()
    rejected = RejectedMessage.objects.get()
    assert rejected.reason.startswith(f"expired: run {run_id} was due at ")
    assert "MESSAGE_MAX_AGE=604800 s" in rejected.reason
    # Never ran in any schema, and the run is not lost: it still waits.
    for schema in TENANTS:
        assert tenant_tags(schema) == []
    assert JobRun.objects.get(pk=run_id).status == RunStatus.QUEUED


def test_the_relay_fails_closed_a_waiting_run_whose_message_no_worker_would_accept(
    tenants, settings
):
    """A run enqueued under a larger MAX_ENVELOPE_BYTES (or before sizes were checked at the
    last attempt): every worker refuses its message, and the relay used to push it again every
    round, forever. Now the relay fails it closed once and pushes nothing."""
    handle = jobs.probe.enqueue(tenant="t1", tag="big", payload={"blob": "x" * 3000})
    transport.get_queue("default").empty()
    settings.KUMIKO_JOBS = {**settings.KUMIKO_JOBS, "MAX_ENVELOPE_BYTES": 2048}
    result = relay_pending(grace=0)
    assert (result.pushed, result.failed) == (0, 1)
    run = JobRun.objects.get(pk=handle.run_id)
    assert (run.status, run.error_type) == (RunStatus.FAILED, "EnvelopeError")
    assert "over MAX_ENVELOPE_BYTES=2048: no worker would accept it" in run.error_message
    assert transport.queue_length("default") == 0
    assert relay_pending(grace=0).failed == 0  # once: the run no longer waits
    assert tenant_tags("t1") == []


def test_the_relay_signs_an_expired_waiting_run_anew_and_it_runs(tenants):
    run_id = _waiting_run_with_an_expired_message("resigned")
    work()
    assert RejectedMessage.objects.count() == 1
    # The refused message finished in RQ without touching the run: the relay rebuilds it from
    # the row and signs it now, due now.
    assert relay_pending(grace=0).pushed == 1
    queue = transport.get_queue("default")
    fresh = decode(body_of(queue.job_ids[0]))
    assert fresh.run_id == run_id and time.time() - fresh.due_at < 600
    work()
    assert JobRun.objects.get(pk=run_id).status == RunStatus.SUCCEEDED
    assert tenant_tags("t1") == ["resigned"]
    assert RejectedMessage.objects.count() == 1


def test_a_message_deferred_for_longer_than_max_age_is_not_expired(tenants):
    # enqueue_in(30 days): due in 30 days, so it lives until 30 days + MAX_AGE.
    handle = jobs.probe.enqueue_in(timedelta(days=30), tenant="t2", tag="later")
    scheduled = transport.scheduled_job_ids("default")
    assert len(scheduled) == 1
    env = decode(body_of(scheduled[0]))
    assert env.run_id == handle.run_id
    assert env.due_at - env.signed_at == pytest.approx(30 * 24 * 3600, abs=1)
    # Delivered early by hand, as rq-scheduler would deliver it in 30 days: it runs.
    redis = transport.connection_for("default")
    redis.zadd(SCHEDULED, {scheduled[0]: int(time.time()) - 1})
    assert transport.move_due_scheduled_jobs("default") == 1
    work()
    assert JobRun.objects.get(pk=handle.run_id).status == RunStatus.SUCCEEDED
    assert tenant_tags("t2") == ["later"]


# --- no run recreated from a message ----------------------------------------------------------


def test_the_message_of_a_run_deleted_by_retention_never_runs_again(tenants):
    handle = jobs.probe.enqueue(tenant="t1", tag="once")
    queue = transport.get_queue("default")
    copied = body_of(queue.job_ids[0])  # taken from Redis while it was queued
    work()
    assert tenant_tags("t1") == ["once"]
    # Retention deletes the finished run (RETENTION_DAYS after it finished).
    days = conf.get().RETENTION_DAYS
    JobRun.objects.filter(pk=handle.run_id).update(
        finished_at=timezone.now() - timedelta(days=days, minutes=1)
    )
    assert delete_expired()[0] >= 1
    assert not JobRun.objects.filter(pk=handle.run_id).exists()

    push_copy(copied, "copied-back")
    work()
    assert tenant_tags("t1") == ["once"]  # the job did not run again
    assert not JobRun.objects.filter(pk=handle.run_id).exists()  # nor was the run recreated
    rejected = RejectedMessage.objects.get()
    assert rejected.rq_job_id == "copied-back"
    assert "its history row is gone" in rejected.reason
    assert "never recreated from a message" in rejected.reason
    assert handle.run_id in rejected.excerpt


def test_a_signed_message_for_a_run_that_never_existed_is_refused(tenants):
    env = envelope_of(
        JobRun(
            run_id=uuid.uuid4(),
            job_name=jobs.probe.name,
            schema_name="t3",
            payload={"tag": "phantom"},
            trace_context={},
        ),
        attempt=1,
    )
    push_copy(encode(env), "phantom")
    work()
    assert tenant_tags("t3") == []
    assert JobRun.objects.count() == 0
    assert "history row is gone" in RejectedMessage.objects.get().reason


# --- cron ticks -------------------------------------------------------------------------------


def _ring(definition: Any) -> None:
    """rq-scheduler finds the alarm due and calls our Scheduler.enqueue_job for it."""
    redis = transport.connection_for("default")
    # Only this alarm is due: the test app's seconds cron (every 2 s, on another queue of the
    # same Redis) would otherwise come due too whenever the machine is slow.
    later = int(time.time()) + 3600
    others = [m for m in redis.zrange(SCHEDULED, 0, -1) if m.decode() != schedule_id(definition)]
    if others:
        redis.zadd(SCHEDULED, dict.fromkeys(others, later))
    redis.zadd(SCHEDULED, {schedule_id(definition): int(time.time()) - 1})
    assert transport.move_due_scheduled_jobs("default") == 1


def test_a_cron_tick_is_identified_by_signed_data_and_fans_out_once(tenants):
    clear_of_a_minute_end()
    sync_schedules()
    _ring(jobs.every_minute)
    queue = transport.get_queue("default")
    assert len(queue.job_ids) == 1 and not queue.job_ids[0].startswith("kj-cron-")
    tick = decode(body_of(queue.job_ids[0]))
    assert tick.tick is not None and tick.trigger == "cron"
    parent = JobRun.objects.get(pk=tick.run_id)  # the scheduler wrote the row first
    assert parent.status == RunStatus.QUEUED
    assert tick.run_id == tick_run_id(jobs.every_minute.name, datetime.fromisoformat(tick.tick))
    work_one()
    children = [decode(body_of(job_id)) for job_id in queue.job_ids]
    # Every child signs (job, tick, tenant).
    assert sorted((c.job, c.tick, c.schema) for c in children) == [
        (jobs.every_minute.name, tick.tick, schema) for schema in TENANTS
    ]
    work()
    for schema in TENANTS:
        assert tenant_tags(schema) == ["cron"]
    # The alarm rings again for the next tick, not this one.
    redis = transport.connection_for("default")
    due = redis.zscore(SCHEDULED, schedule_id(jobs.every_minute))
    assert due is not None and due > time.time()


def test_a_tick_rung_twice_or_replayed_does_nothing_more(tenants):
    clear_of_a_minute_end()
    sync_schedules()
    _ring(jobs.every_minute)
    queue = transport.get_queue("default")
    tick_body = body_of(queue.job_ids[0])
    work_one()
    child_bodies = [body_of(job_id) for job_id in queue.job_ids]
    assert len(child_bodies) == len(TENANTS)
    work()
    # A second scheduler, or the alarm re-scored into the past by hand: the same tick.
    _ring(jobs.every_minute)
    assert queue.job_ids == []
    # The tick's message and its children's, copied back under fresh RQ ids.
    push_copy(tick_body, "tick-copy")
    for n, body in enumerate(child_bodies):
        push_copy(body, f"child-copy-{n}")
    work()
    work()
    assert JobRun.objects.filter(job_name=jobs.every_minute.name, schema_name="").count() == 1
    for schema in TENANTS:
        assert tenant_tags(schema) == ["cron"]


def test_a_copied_cron_template_replayed_into_a_queue_never_runs(tenants, redis_conn):
    """The attack of issue 11: copy the alarm's job hash, give it any enqueued_at, queue it.

    The previous runner took the tick's identity from that unsigned enqueued_at, so each copy
    with another minute started a new tick, fanned out into every tenant.
    """
    sync_schedules()
    alarm = schedule_id(jobs.every_minute)
    fields = redis_conn.hgetall(f"rq:job:{alarm}")
    assert fields, "sync_schedules registered no alarm"
    for n, minute in enumerate(("2026-01-01T03:00:00.000000Z", "2026-01-01T03:01:00.000000Z")):
        copy_id = f"replayed-{n}"
        redis_conn.hset(
            f"rq:job:{copy_id}",
            mapping={**fields, b"id": copy_id, b"status": b"queued", b"enqueued_at": minute},
        )
        redis_conn.rpush("rq:queue:default", copy_id)
    work()
    work()
    assert JobRun.objects.filter(job_name=jobs.every_minute.name).count() == 0
    for schema in TENANTS:
        assert tenant_tags(schema) == []
    reasons = sorted(RejectedMessage.objects.values_list("reason", flat=True))
    assert len(reasons) == 2
    assert all("expired" in r or "cron template" in r for r in reasons), reasons


def test_a_copied_alarm_under_another_id_fires_nothing(tenants, redis_conn):
    """Copied into rq-scheduler's own set under a new id: not a registered cron job's alarm."""
    sync_schedules()
    alarm = schedule_id(jobs.every_minute)
    fields = redis_conn.hgetall(f"rq:job:{alarm}")
    redis_conn.hset("rq:job:kj-cron-stolen", mapping={**fields, b"id": b"kj-cron-stolen"})
    redis_conn.zadd(SCHEDULED, {"kj-cron-stolen": int(time.time()) - 1})
    transport.move_due_scheduled_jobs("default")
    work()
    assert transport.get_queue("default").job_ids == []
    assert JobRun.objects.filter(job_name=jobs.every_minute.name).count() == 0
    assert redis_conn.zscore(SCHEDULED, "kj-cron-stolen") is None
    for schema in TENANTS:
        assert tenant_tags(schema) == []


# --- the previous envelope version ------------------------------------------------------------


def _version_1_body(env: Any) -> str:
    """A message exactly as the version 1 ``encode`` built it: no times, no tick, v1 salt."""
    import json
    from dataclasses import asdict

    from django.core import signing

    document = {"v": 1, **asdict(env)}
    for key in ("tick", "signed_at", "due_at", "version", "flow_schema"):
        del document[key]
    payload = json.dumps(document, separators=(",", ":"), sort_keys=True)
    return signing.Signer(salt="kumiko_jobs.envelope.v1", algorithm="sha256").sign(payload)


def test_a_version_1_message_queued_before_the_deploy_still_runs(tenants):
    handle = jobs.probe.enqueue(tenant="t2", tag="from-v1")
    queue = transport.get_queue("default")
    job_id = queue.job_ids[0]
    queue.empty()
    env = envelope_of(JobRun.objects.get(pk=handle.run_id), attempt=1)
    push_copy(_version_1_body(env), job_id)
    work()
    assert JobRun.objects.get(pk=handle.run_id).status == RunStatus.SUCCEEDED
    assert tenant_tags("t2") == ["from-v1"]
    assert RejectedMessage.objects.count() == 0


def test_a_version_1_message_of_a_deleted_run_is_refused_too(tenants):
    env = envelope_of(
        JobRun(
            run_id=uuid.uuid4(),
            job_name=jobs.probe.name,
            schema_name="t1",
            payload={"tag": "v1-replay"},
            trace_context={},
        ),
        attempt=1,
    )
    push_copy(_version_1_body(env), "v1-replay")
    work()
    assert tenant_tags("t1") == []
    assert "history row is gone" in RejectedMessage.objects.get().reason
