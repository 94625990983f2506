"""A finish that comes after the run stopped being its attempt's writes nothing, through a real
worker on real Redis and PostgreSQL.

While a run's body is still going, the run can be taken from it: the sweep hands the attempt
back when its worker looks dead (a job elsewhere in the process held the GIL past
``WORKER_DEAD_AFTER``, so no beat went out), a worker's watchdog records a timeout, an
operator's cancellation ends it. The body's finish must not then write its outcome over the
row (a ``succeeded`` over a ``cancelled``, a second attempt row for attempt 1, follow-ups of a
run that was retried): the finish is fenced on the row still running that attempt, in its one
statement (``run_sql.finish``) and in its transaction (``finish_in_transaction``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from django.conf import settings
from django.db import connections
from django.test import override_settings
from django.utils import timezone

from kumiko_jobs import transport
from kumiko_jobs.history import retention, transitions
from kumiko_jobs.models import JobAttempt, JobRun, RejectedMessage, RunStatus
from kumiko_jobs.worker import sweep
from tests.conftest import probes, work
from tests.testapp import jobs

pytestmark = pytest.mark.usefixtures("live_db")

JOB_PREFIX = "fenced"

# Set by the test once the run has been taken from its attempt; the body waits for it.
_taken = threading.Event()


def waits_until_taken(ctx: Any, *, tag: str, followup: bool = False) -> str:
    assert _taken.wait(30), "the test never took the run"
    if followup:
        ctx.enqueue(jobs.probe, tag=f"{tag}-child")
    return "done late"


def _take_when_running(run_id: Any, take: Callable[[str], Any]) -> threading.Thread:
    """In another thread (its own connection): wait for the run to be ``running``, take it
    with ``take(rq_job_id)``, then let the body go on."""

    def run() -> None:
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                row = JobRun.objects.filter(pk=run_id, status=RunStatus.RUNNING).first()
                if row is not None:
                    take(row.rq_job_id)
                    return
                time.sleep(0.02)
        finally:
            _taken.set()
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def _cancelled(rq_job_id: str) -> Any:
    """An operator's request (on the row), then what a worker records when it stops the run."""
    run = JobRun.objects.get(rq_job_id=rq_job_id)
    transitions.request_cancel([run.run_id], "an operator", timezone.now())
    return sweep.record_cancelled(rq_job_id, "test: cancelled while running")


def _timed_out(rq_job_id: str) -> Any:
    return sweep.record_timed_out(rq_job_id, "test: handed back while running", push=False)


@pytest.mark.parametrize("followup", [False, True], ids=["one statement", "transaction"])
@pytest.mark.parametrize("take", [_cancelled, _timed_out], ids=["cancelled", "handed back"])
def test_a_late_finish_does_not_overwrite_the_run(
    tenants: Any, declare: Any, followup: bool, take: Callable[[str], Any]
) -> None:
    _taken.clear()
    waiting = declare(waits_until_taken, retries=1)
    handle = waiting.enqueue(tenant="t1", tag="late", followup=followup)
    taker = _take_when_running(handle.run_id, take)
    work()
    taker.join(30)

    run = JobRun.objects.get(pk=handle.run_id)
    attempts = list(
        JobAttempt.objects.filter(run_id=handle.run_id).values_list("number", "outcome")
    )
    if take is _cancelled:
        assert run.status == RunStatus.CANCELLED
        assert attempts == [(1, JobAttempt.Outcome.CANCELLED)]
    else:  # handed back for a retry (the relay or the scheduler pushes it; not here)
        assert (run.status, run.attempts) == (RunStatus.QUEUED, 1)
        assert attempts == [(1, JobAttempt.Outcome.RETRYING)]
    assert run.result is None  # the late success wrote nothing of its own
    # Its follow-up, written in the fenced transaction, was neither written nor pushed (a
    # message without its row would be refused and recorded).
    assert probes("t1") == []
    assert not JobRun.objects.filter(job_name=jobs.probe.name).exists()
    assert not RejectedMessage.objects.exists()
    assert transport.get_queue("default").count == 0


def fails_when_taken(ctx: Any, *, tag: str) -> None:
    assert _taken.wait(30), "the test never took the run"
    raise RuntimeError("failed after the run was taken")


def test_a_late_failure_pushes_no_retry(tenants: Any, declare: Any) -> None:
    """Handed back for a retry (the relay pushes it after the row's ``scheduled_for``), the
    late failure's own retry message is not pushed: the burst would run attempt 2 at once."""
    _taken.clear()
    failing = declare(fails_when_taken, retries=3, backoff={"type": "fixed", "delay": 0})
    handle = failing.enqueue(tenant="t1", tag="late")
    taker = _take_when_running(handle.run_id, _timed_out)
    work()
    taker.join(30)
    run = JobRun.objects.get(pk=handle.run_id)
    assert (run.status, run.attempts) == (RunStatus.QUEUED, 1)
    assert transport.get_queue("default").count == 0


def test_an_ordinary_finish_still_writes(tenants: Any, declare: Any) -> None:
    """The fence's allowed path: nobody took the run, the late body's success is recorded."""
    _taken.set()
    waiting = declare(waits_until_taken)
    handle = waiting.enqueue(tenant="t1", tag="on time", followup=True)
    work()
    run = JobRun.objects.get(pk=handle.run_id)
    assert run.status == RunStatus.SUCCEEDED
    assert run.result == "done late"
    assert list(
        JobAttempt.objects.filter(run_id=handle.run_id).values_list("number", "outcome")
    ) == [(1, JobAttempt.Outcome.SUCCEEDED)]
    work()
    assert [p.tag for p in probes("t1")] == ["on time-child"]


def test_a_run_still_running_when_its_tenant_is_anonymised_writes_nothing_back(
    tenants: Any, declare: Any
) -> None:
    """``TENANT_DELETION = "anonymise"`` scrubs the tenant's rows while one of its runs still
    runs: that run is ended with the deletion, and its late success writes no result, log or
    attempt back into the scrubbed row (``retention.forget_tenant``, what the tenant's
    ``post_delete`` calls; the tenant itself is kept here, only its history is forgotten)."""
    _taken.clear()
    waiting = declare(waits_until_taken)
    handle = waiting.enqueue(tenant="t1", tag="secret-4242")

    def forget(_rq_job_id: str) -> None:
        anonymise = {**settings.KUMIKO_JOBS, "TENANT_DELETION": "anonymise"}
        with override_settings(KUMIKO_JOBS=anonymise):
            retention.forget_tenant("t1")

    taker = _take_when_running(handle.run_id, forget)
    work()
    taker.join(30)
    run = JobRun.objects.get(pk=handle.run_id)
    assert run.status == RunStatus.CANCELLED
    assert run.error_message == retention.TENANT_DELETED
    assert run.result is None and run.payload == {}
    assert not JobAttempt.objects.filter(run_id=handle.run_id).exists()
