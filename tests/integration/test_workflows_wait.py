"""``handle.wait(timeout)`` and ``await handle.await_result(timeout)`` through real workers: the
final state and result without polling the row (one read at the start, one when the finish's
signal comes), a clear timeout, the tenant's wall, a workflow's handle, and the backstop read
for runs that end outside a worker's finish (docs/workflows.md, "Waiting")."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.conf import settings
from django.db import connection
from django.test import override_settings
from django_tenants.utils import tenant_context

import kumiko_jobs
from kumiko_jobs import WaitTimeout, transport
from kumiko_jobs.models import JobRun, RunStatus, Workflow
from kumiko_jobs.operations import cancel_run
from kumiko_jobs.transport import keys as transport_keys
from tests.conftest import work
from tests.testapp import jobs
from tests.testapp import workflow_jobs as wf

pytestmark = pytest.mark.usefixtures("live_db")

# No backstop read within a test: a wait that returns was woken by the signal.
NO_RECHECK = {**settings.KUMIKO_JOBS, "WAIT_RECHECK": 60}


class Waiter(threading.Thread):
    """Runs ``call`` in its own thread (the worker must run in the main one: RQ's signal
    handlers), counting the reads of kumiko's rows it sends."""

    def __init__(self, call: Callable[[], Any], *, count: bool = True) -> None:
        super().__init__()
        self.call = call
        self.count = count
        self.reads = 0
        self.value: Any = None
        self.error: BaseException | None = None
        self.took = 0.0

    def _count(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        result = execute(sql, params, many, context)
        if sql.lstrip().upper().startswith("SELECT") and "kumiko_jobs_" in sql:
            self.reads += 1  # once read (``_started`` waits for the first)
        return result

    def run(self) -> None:
        started = time.monotonic()
        try:
            if not self.count:  # async: the reads run on asgiref's thread, not this one
                self.value = self.call()
                return
            with connection.execute_wrapper(self._count):
                self.value = self.call()
        except BaseException as exc:
            self.error = exc
        finally:
            self.took = time.monotonic() - started
            connection.close()


def _started(call: Callable[[], Any], *, count: bool = True) -> Waiter:
    waiter = Waiter(call, count=count)
    waiter.start()
    if not count:
        time.sleep(0.3)  # past its first read, blocked on the signal
        return waiter
    # Past its first read (then it blocks on the signal): a fixed pause let the test finish
    # the run first when the thread's new connection was slow, and the waiter then read once.
    deadline = time.monotonic() + 30
    while waiter.reads < 1 and waiter.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    return waiter


@override_settings(KUMIKO_JOBS=NO_RECHECK)
def test_wait_returns_the_result_after_two_reads_of_the_row(tenants: Any) -> None:
    handle = wf.record.enqueue(tenant="t1", tag="w")
    waiter = _started(lambda: handle.wait(30))
    assert waiter.is_alive()  # nothing ran yet: it waits
    work()
    waiter.join(30)
    assert waiter.error is None, (type(waiter.error), str(waiter.error), waiter.took)
    assert waiter.value is handle
    assert handle.status == RunStatus.SUCCEEDED
    assert handle.result == {"tag": "w", "schema": "t1"}
    # One read before blocking, one after the finish's signal: no polling in between.
    assert waiter.reads == 2
    assert waiter.took < 20


@override_settings(KUMIKO_JOBS=NO_RECHECK)
def test_a_failed_run_is_final_too(tenants: Any) -> None:
    handle = wf.unrecoverable.enqueue(tenant="t1", tag="x")
    waiter = _started(lambda: handle.wait(30))
    work()
    waiter.join(30)
    assert waiter.error is None and handle.status == RunStatus.FAILED and waiter.reads == 2


def test_a_finished_run_is_read_once(tenants: Any) -> None:
    handle = wf.record.enqueue(tenant="t1", tag="done")
    work()
    waiter = Waiter(lambda: handle.wait(5))
    waiter.run()
    assert waiter.error is None and handle.status == RunStatus.SUCCEEDED
    assert waiter.reads == 1


def test_the_timeout_says_what_to_do_and_leaves_the_run_alone(tenants: Any) -> None:
    handle = wf.record.enqueue(tenant="t1", tag="late")
    with pytest.raises(WaitTimeout, match=r"had not finished after 0.5 s. Wait longer"):
        handle.wait(0.5)
    assert JobRun.objects.get(pk=handle.run_id).status == RunStatus.QUEUED
    # Longer than the Redis client's socket timeout (5 s): blocked in short BLPOPs, so the
    # client never gives up on the connection, and the caller gets the wait's own error.
    with override_settings(KUMIKO_JOBS=NO_RECHECK), pytest.raises(WaitTimeout):
        handle.wait(6)
    with pytest.raises(kumiko_jobs.InvalidJob, match="timeout in seconds above 0"):
        handle.wait(0)


def test_a_tenant_cannot_wait_for_another_tenants_run(tenants: Any) -> None:
    handle = wf.record.enqueue(tenant="t1", tag="theirs")
    started = time.monotonic()
    with tenant_context(tenants["t2"]), pytest.raises(JobRun.DoesNotExist):
        handle.wait(10)
    assert time.monotonic() - started < 5  # refused at the first read, not after the timeout
    with tenant_context(tenants["t1"]), pytest.raises(WaitTimeout):
        handle.wait(0.2)  # its own tenant may wait


@override_settings(KUMIKO_JOBS={**settings.KUMIKO_JOBS, "WAIT_RECHECK": 0.2})
def test_a_run_cancelled_while_queued_is_seen_by_the_backstop_read(tenants: Any) -> None:
    """No worker finish signals it: the read every WAIT_RECHECK seconds finds it."""
    handle = wf.record.enqueue(tenant="t1", tag="cancel-me")
    waiter = _started(lambda: handle.wait(30))
    cancel_run(JobRun.objects.get(pk=handle.run_id))
    waiter.join(30)
    assert waiter.error is None and handle.status == RunStatus.CANCELLED
    assert waiter.took < 10


def test_await_result_for_async_code(tenants: Any) -> None:
    """A finished run at once, a late one times out, and a waiting one wakes on its signal
    (the backstop read is a minute away)."""
    done = wf.record.enqueue(tenant="t1", tag="async")
    work()
    late = wf.record.enqueue(tenant="t1", tag="late")

    def end_it() -> None:  # what a worker's finish does: the row final, then the signal
        time.sleep(1)
        try:
            cancel_run(JobRun.objects.get(pk=late.run_id))
            transport.signal_done(late.run_id, "default")
        finally:
            connection.close()

    async def scenario() -> float:
        assert await done.await_result(5) is done and done.result["tag"] == "async"
        with pytest.raises(WaitTimeout):
            await late.await_result(0.3)
        ender = threading.Thread(target=end_it)
        started = time.monotonic()
        ender.start()
        assert await late.await_result(30) is late
        ender.join(10)
        return time.monotonic() - started

    with override_settings(KUMIKO_JOBS=NO_RECHECK):
        # As a sync caller would (the reads run on this thread, on its connection).
        took = async_to_sync(scenario)()
    assert took < 20  # woken, not timed out (no recheck within 60 s)
    assert late.status == RunStatus.CANCELLED


@override_settings(KUMIKO_JOBS=NO_RECHECK)
def test_a_workflow_handle_waits_for_its_last_step(tenants: Any) -> None:
    flow = kumiko_jobs.group(
        [wf.record.step(tag="a", key="a"), wf.fail.step(tag="b", key="b")],
        then=wf.summary.step(tag="cb", key="cb"),
    )
    handle = kumiko_jobs.workflow(flow, name="waited").enqueue(tenant="t1")
    waiter = _started(lambda: handle.wait(30))
    work()
    waiter.join(30)
    assert waiter.error is None and waiter.value is handle
    assert handle.status == RunStatus.FAILED
    assert handle.steps() == {"a": "succeeded", "b": "failed", "cb": "succeeded"}
    assert waiter.reads == 2  # woken by the last step's finish, not by polling
    with tenant_context(tenants["t2"]), pytest.raises(Workflow.DoesNotExist):
        handle.wait(5)


@override_settings(KUMIKO_JOBS=NO_RECHECK)
def test_cancelling_a_workflow_wakes_its_waiters(tenants: Any) -> None:
    flow = kumiko_jobs.chain(wf.record.step(tag="a", key="a"), wf.record.step(tag="b", key="b"))
    handle = kumiko_jobs.workflow(flow, name="cancelled").enqueue(tenant="t1")
    waiter = _started(lambda: handle.wait(30))
    assert handle.cancel()
    waiter.join(30)
    assert waiter.error is None and handle.status == RunStatus.CANCELLED
    assert waiter.took < 10 and waiter.reads == 2


def test_a_final_run_leaves_a_short_lived_signal(tenants: Any, redis_conn: Any) -> None:
    final = jobs.probe.enqueue(tenant="t1", tag="f")
    work()
    waiting = jobs.probe.enqueue(tenant="t1", tag="w")
    key = f"{transport_keys.DONE_KEY}{final.run_id.replace('-', '')}"
    assert redis_conn.lrange(key, 0, -1) == [b"1"]
    assert 0 < redis_conn.ttl(key) <= 60
    assert not redis_conn.exists(f"{transport_keys.DONE_KEY}{waiting.run_id.replace('-', '')}")
