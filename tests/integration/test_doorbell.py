"""The doorbell (transport/doorbell.py): a worker waiting behind work it may not take wakes for
a message it may take at once, not at its next look.

A real kumiko worker (``Worker.work``, not burst, ``max_jobs=1``) on the real Redis and
PostgreSQL, with a paused tenant's run in the queue, so that RQ's list holds a token and the
worker cannot block on it. The worker's own fallback look (``RING_WAIT_MAX``) is set to an
hour, so that only a ring can wake it within the test; a second thread makes the arrival
(another tenant's enqueue, or the resume) and watches the run: if it has not started after
``WAKE_DEADLINE`` seconds the thread rings the bell itself (so the test ends) and the test
fails, saying so.

Seen failing with the ring taken out of ``pushing.push_many`` (the other tenant's run waited
for the fallback ring), and with ``lifted`` ignored by the release script (the resumed run).
"""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Callable

import pytest
from django.core.management import call_command
from django.db import connection as django_connection

from kumiko_jobs import transport
from kumiko_jobs.models import JobRun, RunStatus
from kumiko_jobs.transport import doorbell
from kumiko_jobs.worker import Worker
from tests.testapp import jobs

pytestmark = pytest.mark.usefixtures("live_db")

# Far above the milliseconds a ring takes, far below the hour of the fallback.
WAKE_DEADLINE = 20.0


def command(*args: str) -> None:
    call_command("kumiko_jobs", *args, stdout=io.StringIO())


def started(tag: str) -> bool:
    return JobRun.objects.filter(payload__tag=tag, status=RunStatus.SUCCEEDED).exists()


def assert_worker_blocks_on_the_bell() -> None:
    """Until a Redis client is blocked in ``BLPOP`` (the waiting worker; Redis's own client
    list says so), so that the arrival comes while it waits, not before it first looks."""
    redis = transport.connection_for("default")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if any(c.get("cmd") == "blpop" for c in redis.client_list()):
            return
        time.sleep(0.02)
    raise AssertionError("the worker never waited on the bell")


def wait_while(arrive: Callable[[], None], tag: str) -> bool:
    """Run one worker until it has done one run, while another thread calls ``arrive`` and
    watches run ``tag``; True when ``tag`` ran before the deadline (no fallback ring)."""
    outcome: dict[str, bool] = {}

    def arrival() -> None:
        try:
            assert_worker_blocks_on_the_bell()
            arrive()
            deadline = time.monotonic() + WAKE_DEADLINE
            while time.monotonic() < deadline and not started(tag):
                time.sleep(0.05)
            outcome["woken"] = started(tag)
            if not outcome["woken"]:
                with transport.connection_for("default").pipeline() as pipe:
                    doorbell.ring(pipe, "default")  # let the worker end the test
                    pipe.execute()
        finally:
            django_connection.close()

    helper = threading.Thread(target=arrival)
    helper.start()
    queue = transport.get_queue("default")
    Worker([queue], connection=queue.connection).work(burst=False, max_jobs=1)
    helper.join()
    return outcome["woken"]


@pytest.fixture
def slow_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only a ring wakes a waiting worker within the test."""
    monkeypatch.setattr(doorbell, "RING_WAIT_MAX", 3600.0)


def test_an_arrival_wakes_a_worker_waiting_behind_a_paused_tenant(tenants, slow_fallback):
    command("pause", "--tenant", "t1")
    jobs.probe.enqueue(tenant="t1", tag="paused")
    assert transport.get_queue("default").count == 1  # its token: the list is not empty

    woken = wait_while(lambda: jobs.probe.enqueue(tenant="t2", tag="arrived"), "arrived")
    assert woken, "t2's run waited for the worker's fallback look, not the push's ring"
    assert JobRun.objects.get(payload__tag="paused").status == RunStatus.QUEUED


def test_a_resume_wakes_a_waiting_worker(tenants, slow_fallback):
    command("pause", "--tenant", "t1")
    jobs.probe.enqueue(tenant="t1", tag="resumed")

    woken = wait_while(lambda: command("resume", "--tenant", "t1"), "resumed")
    assert woken, "the resumed run waited for the worker's fallback look, not the resume's ring"


def test_a_resumed_queue_wakes_a_waiting_worker(tenants, slow_fallback):
    """A paused queue parks nothing: its resume rings because a pause was lifted."""
    command("pause", "--queue", "default")
    jobs.probe.enqueue(tenant="t1", tag="queue-resumed")

    woken = wait_while(lambda: command("resume", "--queue", "default"), "queue-resumed")
    assert woken, "the resumed queue's run waited for the worker's fallback look"


def test_the_bell_wakes_a_waiter_and_a_silent_bell_times_out(redis_conn):
    """The wait itself: True on a ring from another connection, False when none comes."""
    assert doorbell.wait_for_ring(redis_conn, ["default"], 0.2) is False

    def ring_soon() -> None:
        time.sleep(0.2)
        with transport.connection_for("default").pipeline() as pipe:
            doorbell.ring(pipe, "default")
            pipe.execute()

    ringer = threading.Thread(target=ring_soon)
    ringer.start()
    assert doorbell.wait_for_ring(redis_conn, ["other", "default"], 30) is True
    ringer.join()
    assert redis_conn.llen(doorbell.bell_of("default")) == 0  # the waiter took the ring


def test_rings_are_bounded(redis_conn):
    with redis_conn.pipeline() as pipe:
        for _ in range(3):
            doorbell.ring(pipe, "default", doorbell.BELL_SIZE)
        pipe.execute()
    assert redis_conn.llen(doorbell.bell_of("default")) == doorbell.BELL_SIZE
