"""A worker's Redis connection cut while it starts or stops (issue 28, the long soak).

In the long soak 35 worker processes exited 1 with "Connection closed by server." and nothing
else: RQ retries its dequeue, kumiko's mixins keep the loop's bookkeeping going, but the calls
before and after the loop (the worker's name on its connection, its registration, its command
channel, the note of a warm shutdown request) raised on the first cut, since a client django-rq
builds from a URL retries nothing. They now ride a cut out (transport/worker_cuts.py).

A real ``rqworker`` reaches Redis through tests/chaos/proxy.py, which lets a chosen command
reach Redis and cuts the connection when its reply comes back: the server acted, the worker
never heard. PostgreSQL is direct. Nothing is mocked.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
from django.conf import settings

from kumiko_jobs.models import JobAttempt, JobRun, RunStatus
from tests.chaos.proxy import Proxy
from tests.chaos.workers import Processes
from tests.conftest import TENANTS, probes, worker_env
from tests.testapp import jobs

pytestmark = pytest.mark.usefixtures("live_db")


@pytest.fixture
def redis_proxy() -> Iterator[Proxy]:
    url = urlsplit(settings.RQ_QUEUES["default"]["URL"])
    proxy = Proxy((url.hostname or "127.0.0.1", url.port or 6379)).start()
    yield proxy
    proxy.close()


def _redis_through(proxy: Proxy, **extra: str) -> dict[str, str]:
    env = {**worker_env(), **extra}
    url = urlsplit(env["REDIS_URL"])
    env["REDIS_URL"] = urlunsplit(url._replace(netloc=proxy.url_netloc()))
    return env


def _attempts(run_id: Any) -> list[tuple[int, str]]:
    rows = JobAttempt.objects.filter(run_id=run_id).order_by("number")
    return list(rows.values_list("number", "outcome"))


def test_a_worker_starting_rides_out_cuts(tenants: dict[str, Any], procs: Processes, redis_proxy):
    """Each of the start's own calls has its reply cut once: the worker starts and runs."""
    # Commands that reached Redis and whose replies are lost: CLIENT SETNAME (the worker made),
    # the registration's MULTI/EXEC (applied: the next try meets the worker's own hash), and
    # the command channel's SUBSCRIBE (its reply is read by RQ's pubsub thread, which RQ's own
    # handler reconnects; the subscribe itself is tried again only when it cannot be sent).
    for command in (b"SETNAME", b"rq:workers", b"SUBSCRIBE"):
        redis_proxy.cut_reply(after=command, reply=b"")
    handle = jobs.probe.enqueue(tenant="t1", tag="started-through-cuts")
    worker = procs.start(env=_redis_through(redis_proxy))

    def ended() -> bool:
        run = JobRun.objects.get(pk=handle.run_id)
        return worker.poll() is not None or run.status == RunStatus.SUCCEEDED

    procs.wait_for("the run, or the worker's exit", ended)
    log = procs.log_of(worker)
    assert worker.poll() is None, f"the worker exited {worker.returncode}:\n{log}"
    assert redis_proxy.replies_cut == 3, log
    assert [p.tag for p in probes("t1")] == ["started-through-cuts"]
    for what in ("naming its connection", "registering"):
        assert f"lost Redis while {what}" in log, log


def test_a_worker_stopping_rides_out_a_cut(tenants: dict[str, Any], procs: Processes, redis_proxy):
    """A warm shutdown during a run whose note in Redis is cut: the run ends as it would have
    (succeeded, once), and the worker exits 0 after it."""
    worker = procs.start(env=_redis_through(redis_proxy))
    procs.wait_ready(1)
    redis_proxy.cut_reply(after=b"shutdown_requested_date", reply=b"")
    handle = jobs.two_per_tenant.enqueue(tenant="t1", tag="stopped-through-a-cut", seconds=3)
    procs.wait_for(
        "the run to start",
        lambda: JobRun.objects.get(pk=handle.run_id).status == RunStatus.RUNNING,
    )
    worker.send_signal(signal.SIGTERM)  # warm: the run finishes first
    returncode = worker.wait(timeout=60)

    log = procs.log_of(worker)
    assert redis_proxy.replies_cut == 1, log
    run = JobRun.objects.get(pk=handle.run_id)
    attempts = _attempts(handle.run_id)
    # The cut note did not break into the job (it used to: the signal handler's error was
    # raised inside the sleeping body, and the attempt was recorded as failed).
    assert (run.status, attempts) == (RunStatus.SUCCEEDED, [(1, "succeeded")]), log
    assert [p.attempt for p in probes("t1")] == [1]
    assert returncode == 0, log
    assert "could not note its shutdown request" in log


def test_a_worker_with_a_boot_job_rides_out_a_cut_token(
    tenants: dict[str, Any], procs: Processes, redis_proxy
):
    """The boot jobs' dataset token (a worker with a ``run_on_boot`` job reads it when it
    starts) has its reply cut: the worker reads it again and starts, and the boot job runs
    once in every tenant (the lost try had set the token; the next one reads the same)."""
    redis_proxy.cut_reply(after=b"kumiko_jobs:boot:dataset", reply=b"")
    # tests/testapp/jobs.py declares `testapp.booted` (run_on_boot, per tenant) only then.
    worker = procs.start(env=_redis_through(redis_proxy, KUMIKO_TEST_BOOT_JOB="1"))

    def booted_everywhere() -> bool:
        return worker.poll() is not None or all(
            [p.tag for p in probes(schema)] == ["booted"] for schema in TENANTS
        )

    procs.wait_for("the boot job in every tenant, or the worker's exit", booted_everywhere)
    log = procs.log_of(worker)
    assert worker.poll() is None, f"the worker exited {worker.returncode}:\n{log}"
    assert redis_proxy.replies_cut == 1, log
    assert "lost Redis while reading the boot jobs' dataset token" in log, log
    parents = JobRun.objects.filter(job_name="testapp.booted", schema_name="")
    assert parents.count() == 1, log


def test_rqscheduler_starting_rides_out_a_cut(
    tenants: dict[str, Any], procs: Processes, redis_proxy
):
    """``rqscheduler``'s registration has its reply cut as it starts: the scheduler registers
    again (its own lost registration is not taken for another live scheduler) and moves a
    delayed message when it falls due."""
    from kumiko_jobs import transport

    redis_proxy.cut_reply(after=b"rq:scheduler_instance", reply=b"")
    waiting = jobs.probe.enqueue_in(1, tenant="t1", tag="moved-after-a-cut")
    scheduler = procs.start("rqscheduler", "--interval", "1", env=_redis_through(redis_proxy))

    def moved() -> bool:
        return scheduler.poll() is not None or transport.queue_length("default") == 1

    procs.wait_for("the delayed message on the queue, or the scheduler's exit", moved)
    log = procs.log_of(scheduler)
    assert scheduler.poll() is None, f"rqscheduler exited {scheduler.returncode}:\n{log}"
    assert redis_proxy.replies_cut == 1, log
    assert JobRun.objects.get(pk=waiting.run_id).status == RunStatus.QUEUED, log
