"""What the kumiko worker sends to Redis per message, beyond what RQ itself needs.

RQ's worker sends a heartbeat's three commands one by one, and beats three times around every
message. kumiko's Worker sends each beat as one pipeline and at most one beat a second on its
own; these tests pin that down with counts, not timings.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from kumiko_jobs import transport
from kumiko_jobs.models import JobRun, RunStatus
from kumiko_jobs.worker import Worker
from tests.conftest import redis_round_trips, work
from tests.testapp import jobs

pytestmark = pytest.mark.usefixtures("live_db")


def test_a_message_costs_about_half_the_redis_round_trips_of_rq_s_own_worker(tenants):
    handles = [jobs.probe.enqueue(tenant="t1", tag=f"r{i}") for i in range(30)]
    with redis_round_trips() as counts:
        work()
    assert all(JobRun.objects.get(pk=h.run_id).status == RunStatus.SUCCEEDED for h in handles)
    # Plain RQ's SimpleWorker needs 18 per message (bench/throughput.py --profile); the burst's
    # start and end add a few for all 30.
    per_message = counts["trips"] / len(handles)
    assert per_message < 11, per_message


@pytest.fixture
def worker(redis_conn: Any) -> Iterator[Worker]:
    w = Worker([transport.get_queue("default")], connection=redis_conn)
    w.register_birth()
    try:
        yield w
    finally:
        w.register_death()


def _beat_in_redis(worker: Worker) -> bytes | None:
    return worker.connection.hget(worker.key, "last_heartbeat")


def test_one_beat_a_second_on_its_own_and_every_beat_in_one_pipeline(worker):
    worker.last_heartbeat = transport.utcnow() - timedelta(seconds=5)
    with redis_round_trips() as counts:
        worker.heartbeat()
    assert counts["trips"] == 1  # hset, expire, expire: one pipeline
    first = _beat_in_redis(worker)
    assert first is not None
    assert worker.connection.ttl(worker.key) > 400  # RQ's worker_ttl + 60

    with redis_round_trips() as counts:
        worker.heartbeat()  # within the second: nothing to say yet
    assert counts["trips"] == 0
    assert _beat_in_redis(worker) == first

    worker.heartbeat(timeout=30)  # an explicit TTL is RQ asking for a change: always sent
    assert _beat_in_redis(worker) != first
    assert worker.connection.ttl(worker.key) <= 30


def test_beats_go_out_while_redis_is_thought_lost(worker):
    worker.heartbeat()
    before = _beat_in_redis(worker)
    worker._redis_lost = True  # the next beat is how the worker notices Redis is back
    worker.heartbeat()
    assert worker._redis_lost is False
    assert _beat_in_redis(worker) != before
