"""A start cut by the network: the state test_chaos_network's latency-and-cuts test left behind.

A worker's start transaction (RQ's execution, the started registry, the job's ``started``
status and worker name, its removal from the intermediate list) reached Redis, the reply did
not, redis-py's retries failed, and so did the failure's bookkeeping: the worker went on to
other work. The message then stays ``started`` under the name of a live worker, and its run
still waits (``queued``): the dead-worker rule does not apply (the worker is alive), the sweep
looks only at ``running`` runs, and RQ's own cleanup comes with its ten-minute maintenance.

Here the cut is made in a real in-process worker (its start applied, then the connection
error raised where the reply would have been read) on the real Redis and PostgreSQL; the
relay must then take the message back, once, and the run must run once.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.test import override_settings
from rq.utils import utcformat

from kumiko_jobs import transport
from kumiko_jobs.models import JobAttempt, JobRun, RunStatus
from kumiko_jobs.transport import RedisConnectionError
from kumiko_jobs.transport import keys as transport_keys
from kumiko_jobs.worker import Worker
from kumiko_jobs.worker.relay import pending_rq_job_ids, relay_pending
from tests.chaos.workers import chaos_settings
from tests.conftest import probes, work
from tests.testapp import jobs

pytestmark = pytest.mark.usefixtures("live_db")


class _StartReplyLost(Worker):
    """A worker whose start reaches Redis while its reply, and the failure's writes, do not."""

    def prepare_job_execution(self, job: Any, remove_from_intermediate_queue: bool = False) -> None:
        super().prepare_job_execution(job, remove_from_intermediate_queue)
        raise RedisConnectionError("Connection closed by server. (the test's cut)")

    def handle_execution_ended(self, job: Any, queue: Any, heartbeat_ttl: int) -> None:
        raise RedisConnectionError("Connection closed by server. (the test's cut)")


def _cut_start(tag: str) -> tuple[str, str, str]:
    """Enqueue a probe and let a worker's start of it be cut: (run id, RQ job id, worker)."""
    handle = jobs.probe.enqueue(tenant="t1", tag=tag)
    queue = transport.get_queue("default")
    worker = _StartReplyLost([queue], connection=queue.connection)
    worker.work(burst=True)
    run = JobRun.objects.get(pk=handle.run_id)
    (job_id,) = pending_rq_job_ids(run)
    return str(handle.run_id), job_id, worker.name


def _alive(redis: Any, worker: str, executing: str) -> None:
    """``worker`` beats as a live kumiko worker executing ``executing`` ("" when idle)."""
    redis.set(transport_keys.WORKERS_SINCE_KEY, time.time() - 100)  # liveness known for long
    transport.beat(redis, worker, executing, 30)


def _started_ago(redis: Any, job_id: str, seconds: float) -> None:
    started = datetime.now(UTC) - timedelta(seconds=seconds)
    redis.hset(transport.JsonJob.key_for(job_id), "started_at", utcformat(started))


@override_settings(KUMIKO_JOBS=chaos_settings())
def test_a_start_whose_reply_was_cut_is_taken_back_by_the_relay_once(tenants, redis_conn):
    run_id, job_id, worker = _cut_start("cut-start")

    # The state the cut leaves: a waiting run, a message RQ holds as started by that worker.
    assert JobRun.objects.get(pk=run_id).status == RunStatus.QUEUED
    status, name = redis_conn.hmget(transport.JsonJob.key_for(job_id), "status", "worker_name")
    assert (status, name) == (b"started", worker.encode())
    queue = transport.get_queue("default")
    assert job_id in queue.started_job_registry.get_job_ids()
    assert queue.job_ids == [] and redis_conn.lrange(queue.intermediate_queue_key, 0, -1) == []

    # A live worker that executes it, or a start too young to judge: left alone.
    _alive(redis_conn, worker, job_id)
    _started_ago(redis_conn, job_id, 60)
    assert relay_pending(grace=0).pushed == 0
    _alive(redis_conn, worker, "")
    _started_ago(redis_conn, job_id, 0)
    assert relay_pending(grace=0).pushed == 0

    # Alive, idle, and the start older than WORKER_DEAD_AFTER: the message is taken back.
    _started_ago(redis_conn, job_id, 60)
    assert relay_pending(grace=0).pushed == 1
    assert job_id not in queue.started_job_registry.get_job_ids()
    assert relay_pending(grace=0).pushed == 0  # pushed once: it is queued now
    work()

    run = JobRun.objects.get(pk=run_id)
    assert (run.status, run.attempts) == (RunStatus.SUCCEEDED, 1)
    assert JobAttempt.objects.filter(run_id=run_id).count() == 1
    assert [p.tag for p in probes("t1")] == ["cut-start"]
