"""What the kumiko worker sends to Redis per message, beyond what RQ itself needs.

RQ's worker sends a heartbeat's three commands one by one, and beats three times around every
message. kumiko's Worker sends each beat as one pipeline and at most one beat a second on its
own; it dequeues and starts a message in one round trip (the dequeue script writes RQ's start:
transport/rq_start.py), finishes it in one transaction, and writes its state only when it
changes (transport.BookkeepingSimpleWorker). These
tests pin that down with counts, not timings, and count RQ's own SimpleWorker on the same
Redis as the calibration.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest
from redis.client import Pipeline, Redis
from rq import SimpleWorker as RQSimpleWorker

from kumiko_jobs import transport
from kumiko_jobs.models import JobRun, RunStatus
from kumiko_jobs.worker import Worker
from tests.conftest import redis_round_trips, work
from tests.testapp import jobs

pytestmark = pytest.mark.usefixtures("live_db")


def noop(n: int) -> int:
    """A plain RQ job, for RQ's own worker (the calibration)."""
    return n


def _trips_per_message(enqueue: Callable[[int], None], drain: Callable[[], None]) -> float:
    """Round trips of one message in a burst's steady state: a burst of 40 minus a burst of
    10, over the 30 more messages, so the burst's own start and end cancel out (after a
    burst of 3 that pays for what a process does once)."""
    enqueue(3)
    drain()
    trips = []
    for count in (10, 40):
        enqueue(count)
        with redis_round_trips() as counts:
            drain()
        trips.append(counts["trips"])
    return (trips[1] - trips[0]) / 30


def _enqueue_probes(count: int) -> None:
    for i in range(count):
        jobs.probe.enqueue(tenant="t1", tag=f"r{i}")


def test_a_message_costs_two_redis_round_trips(tenants):
    per_message = _trips_per_message(_enqueue_probes, work)
    assert JobRun.objects.filter(status=RunStatus.SUCCEEDED).count() == 53
    # The dequeue with the start (the pick, the HGETALL of the job hash and RQ's start writes,
    # in one script), the finish. A heartbeat of its own goes out at most once a second (the
    # test machine may be slow: allow a few).
    assert 2 <= per_message <= 2.5, per_message


def test_calibration_rq_s_own_simple_worker_costs_more_than_twice_as_many(redis_conn):
    queue = transport.get_queue("default")

    def enqueue(count: int) -> None:
        for i in range(count):
            queue.enqueue(f"{__name__}.noop", i, result_ttl=60)

    def drain() -> None:
        RQSimpleWorker([queue], connection=redis_conn, serializer=queue.serializer).work(burst=True)

    per_message = _trips_per_message(enqueue, drain)
    assert per_message >= 9, per_message  # 10 in RQ 3.0 (WATCH uncounted by pipelines)


@contextmanager
def _state_writes() -> Iterator[list[bytes]]:
    """The values of every write of a worker hash's ``state`` field from this thread, sent
    alone or in a pipeline."""
    writes: list[bytes] = []
    command, execute = Redis.execute_command, Pipeline.execute
    caller = threading.get_ident()

    def note(args: tuple[Any, ...]) -> None:
        if args[0] == "HSET" and str(args[1]).startswith("rq:worker:") and "state" in args[2:]:
            values = args[2:]
            writes.append(values[values.index("state") + 1])

    def recorded_command(self: Any, *args: Any, **kwargs: Any) -> Any:
        if threading.get_ident() == caller:
            note(args)
        return command(self, *args, **kwargs)

    def recorded_execute(self: Any, *args: Any, **kwargs: Any) -> Any:
        if threading.get_ident() == caller:
            for queued_args, _ in self.command_stack:
                note(queued_args)
        return execute(self, *args, **kwargs)

    Redis.execute_command = recorded_command  # type: ignore[method-assign]
    Pipeline.execute = recorded_execute  # type: ignore[method-assign]
    try:
        yield writes
    finally:
        Redis.execute_command = command  # type: ignore[method-assign]
        Pipeline.execute = execute  # type: ignore[method-assign]


def test_the_worker_state_is_written_when_it_changes(tenants, redis_conn):
    _enqueue_probes(5)
    with _state_writes() as writes:
        work()
    # started and idle as the worker starts, then idle with each finish; each start's busy is
    # written by the dequeue script (rq_start.py; test_worker_bookkeeping sees it through RQ's
    # Worker.all()).
    assert writes == ["started", "idle"] + ["idle"] * 5, writes

    # Calibration: RQ's own worker writes "idle" twice more around every message.
    queue = transport.get_queue("default")
    for i in range(5):
        queue.enqueue(f"{__name__}.noop", i)
    with _state_writes() as rq_writes:
        RQSimpleWorker([queue], connection=redis_conn, serializer=queue.serializer).work(burst=True)
    assert rq_writes == ["started", "idle"] + ["busy", "idle", "idle"] * 5, rq_writes


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
