"""A worker's end does not wait on its command channel's thread.

RQ's ``unsubscribe`` sends ``UNSUBSCRIBE`` and then stops the pub/sub thread. When the thread
read the reply before its stop flag was cleared, it went into another ``get_message`` with
RQ's ``sleep_time`` of 60 s, and since redis-py 8.2 ``stop()`` joins the thread: a burst
worker's end (every test's, every ``rqworker --burst``'s) or a shutdown then took a minute
(a whole CI run went over its time this way). kumiko's worker bases clear the flag first
(transport.rq_worker._StopsPubSubFirst).

The check is structural, not timed: a spy on redis-py's ``PubSub`` counts the thread's
``get_message`` calls that *start* after ``UNSUBSCRIBE`` was sent. With the flag cleared first
there are none; with RQ's order the race makes some (in CI, about one teardown in two).
Real Redis, real RQ workers; nothing is mocked.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from redis.client import PubSub

from kumiko_jobs import transport
from kumiko_jobs.worker import ForkingWorker, Worker

pytestmark = pytest.mark.usefixtures("live_db")

TEARDOWNS = 25


@pytest.fixture
def late_reads() -> Iterator[list[str]]:
    """Names of the threads that began a ``get_message`` after their pub/sub unsubscribed."""
    seen: list[str] = []
    # Any: redis-py's PubSub methods are untyped.
    unsubscribe: Any = PubSub.unsubscribe
    get_message: Any = PubSub.get_message

    def spied_unsubscribe(self: PubSub, *args: Any) -> Any:
        self._test_unsubscribed = True  # type: ignore[attr-defined]
        return unsubscribe(self, *args)

    def spied_get_message(self: PubSub, *args: Any, **kwargs: Any) -> Any:
        if getattr(self, "_test_unsubscribed", False):
            seen.append(threading.current_thread().name)
            # Do not wait out RQ's 60 s: the read itself is what the test counts.
            kwargs["timeout"] = 0
        return get_message(self, *args, **kwargs)

    PubSub.unsubscribe = spied_unsubscribe  # type: ignore[method-assign]
    PubSub.get_message = spied_get_message  # type: ignore[method-assign]
    try:
        yield seen
    finally:
        PubSub.unsubscribe = unsubscribe  # type: ignore[method-assign]
        PubSub.get_message = get_message  # type: ignore[method-assign]


@pytest.mark.parametrize("worker_class", [Worker, ForkingWorker], ids=["simple", "forking"])
def test_the_pubsub_thread_stops_without_another_read(
    late_reads: list[str], worker_class: type
) -> None:
    queue = transport.get_queue("default")
    threads = []
    for _ in range(TEARDOWNS):
        worker = worker_class([queue], connection=queue.connection)
        worker.work(burst=True)
        threads.append(worker.pubsub_thread)
    assert late_reads == [], (
        f"{len(late_reads)} of {TEARDOWNS} teardowns read the channel again after "
        "UNSUBSCRIBE (each such read waits up to RQ's 60 s)"
    )
    # And each thread is gone once its worker returned (stop() in older redis-py did not
    # join; RQ's own join waits only a second).
    assert [t for t in threads if t.is_alive()] == []
