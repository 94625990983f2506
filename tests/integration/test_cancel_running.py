"""Cancelling a running run (issue 14): operator request -> worker's beat -> the job.

The in-process worker runs in the test's main thread (RQ installs signal handlers there); the
operator asks from a second thread once the run is ``running``. Forking workers are separate
``manage.py rqworker`` processes. Real PostgreSQL and Redis throughout.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connections
from django.test import override_settings

from kumiko_jobs import operations, signals, transport
from kumiko_jobs.models import JobAttempt, JobRun, RunStatus
from kumiko_jobs.run import cancellation
from tests.conftest import probes, start_rqworker, work
from tests.testapp import jobs

pytestmark = pytest.mark.usefixtures("live_db")

DEADLINE = 60.0
# Beats every second, so a request reaches the in-process worker within about a second.
FAST_BEATS = {
    "DB_GUARD": "enforce",
    "DEFAULT_RETRIES": 0,
    "PUSH_FAILURE_PAUSE": 0,
    "WORKER_HEARTBEAT": 1,
    "WORKER_DEAD_AFTER": 2,
}


def _when_running(run_id: str, act: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    """In a second thread: wait until the run is running, then ``act()`` (the operator)."""
    results: list[Any] = []

    def operator() -> None:
        try:
            deadline = time.monotonic() + DEADLINE
            while time.monotonic() < deadline:
                if JobRun.objects.filter(pk=run_id, status=RunStatus.RUNNING).exists():
                    results.append(act())
                    return
                time.sleep(0.05)
        finally:
            connections.close_all()

    thread = threading.Thread(target=operator)
    thread.start()
    return thread, results


@pytest.fixture
def dropped() -> Iterator[list[dict[str, Any]]]:
    seen: list[dict[str, Any]] = []

    def on_drop(**kwargs: Any) -> None:
        seen.append(kwargs)

    signals.job_dropped.connect(on_drop)
    yield seen
    signals.job_dropped.disconnect(on_drop)


def _nothing_left_to_run() -> None:
    assert transport.queue_length("default") == 0
    assert transport.scheduled_job_ids("default") == []


@override_settings(KUMIKO_JOBS=FAST_BEATS)
def test_a_job_that_checks_ends_cancelled_with_who_and_when_and_no_retry(tenants, dropped):
    handle = jobs.cancellable.enqueue(tenant="t1", tag="c")
    thread, results = _when_running(
        handle.run_id,
        lambda: operations.cancel_run(JobRun.objects.get(pk=handle.run_id), by="ops-alice"),
    )
    work()
    thread.join()
    assert results == [operations.CANCEL_REQUESTED]
    run = JobRun.objects.get(pk=handle.run_id)
    assert run.status == RunStatus.CANCELLED and run.finished_at is not None
    assert run.cancel_requested_by == "ops-alice" and run.cancel_requested_at is not None
    assert run.cancel_requested_at <= run.finished_at
    assert run.attempts == 1 and run.max_attempts == 3  # retries=2, none used
    assert run.error_type == "JobCancelled" and "ops-alice" in run.error_message
    attempt = JobAttempt.objects.get(run=run)
    assert attempt.outcome == JobAttempt.Outcome.CANCELLED
    assert [(d["run_id"], d["outcome"]) for d in dropped] == [(handle.run_id, "cancelled")]
    _nothing_left_to_run()
    # The process forgot the request with the run: the next run of the job is not cancelled.
    assert cancellation.requested_by(handle.run_id) is None


@override_settings(KUMIKO_JOBS=FAST_BEATS)
def test_the_cli_asks_a_running_run_to_stop(tenants, capsys):
    handle = jobs.cancellable.enqueue(tenant="t1", tag="cli")
    thread, _ = _when_running(
        handle.run_id, lambda: call_command("kumiko_jobs", "cancel", handle.run_id)
    )
    work()
    thread.join()
    assert "asked running run" in capsys.readouterr().out
    run = JobRun.objects.get(pk=handle.run_id)
    assert run.status == RunStatus.CANCELLED
    assert run.cancel_requested_by.startswith("manage.py")
    with pytest.raises(CommandError, match="already finished"):
        call_command("kumiko_jobs", "cancel", handle.run_id)
    with pytest.raises(CommandError, match="no run"):
        call_command("kumiko_jobs", "cancel", "not-a-run")


def test_the_cli_cancels_a_waiting_run_at_once(tenants, capsys):
    handle = jobs.probe.enqueue(tenant="t1", tag="waiting")
    call_command("kumiko_jobs", "cancel", handle.run_id)
    assert "cancelled run" in capsys.readouterr().out
    work()  # its message is dropped
    assert JobRun.objects.get(pk=handle.run_id).status == RunStatus.CANCELLED
    assert probes("t1") == []


@override_settings(KUMIKO_JOBS=FAST_BEATS)
def test_success_wins_when_the_body_completes_without_acknowledging(tenants):
    handle = jobs.completes_despite_cancel.enqueue(tenant="t1", tag="race")
    thread, _ = _when_running(
        handle.run_id,
        lambda: operations.cancel_run(JobRun.objects.get(pk=handle.run_id), by="ops"),
    )
    work()
    thread.join()
    run = JobRun.objects.get(pk=handle.run_id)
    # The job saw the request (so the race really happened) and completed its work anyway.
    assert [p.note for p in probes("t1")] == ["saw request: True"]
    assert run.status == RunStatus.SUCCEEDED
    assert run.cancel_requested_at is not None  # the request stays on record, too late


@override_settings(KUMIKO_JOBS=FAST_BEATS)
def test_a_failure_after_the_request_is_cancelled_not_retried(tenants):
    handle = jobs.fails_after_cancel.enqueue(tenant="t1", tag="f")
    thread, _ = _when_running(
        handle.run_id,
        lambda: operations.cancel_run(JobRun.objects.get(pk=handle.run_id), by="ops"),
    )
    work(scheduler_rounds=1)
    thread.join()
    run = JobRun.objects.get(pk=handle.run_id)
    assert [p.note for p in probes("t1")] == ["saw request: True"]
    assert run.status == RunStatus.CANCELLED and run.attempts == 1
    assert "RuntimeError" in run.error_message
    _nothing_left_to_run()


@override_settings(KUMIKO_JOBS=FAST_BEATS)
def test_a_swallowed_cancellation_still_ends_the_run_cancelled(tenants):
    handle = jobs.swallows_cancel.enqueue(tenant="t1", tag="s")
    thread, _ = _when_running(
        handle.run_id,
        lambda: operations.cancel_run(JobRun.objects.get(pk=handle.run_id), by="ops"),
    )
    work()
    thread.join()
    assert [p.note for p in probes("t1")] == ["caught"]
    assert JobRun.objects.get(pk=handle.run_id).status == RunStatus.CANCELLED


def _forking_worker() -> subprocess.Popen[str]:
    return start_rqworker("default", "--worker-class", "kumiko_jobs.worker.ForkingWorker")


def _stop(proc: subprocess.Popen[str]) -> str:
    proc.terminate()
    try:
        out, _ = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    return out


def _wait_finished(run_id: str) -> JobRun:
    deadline = time.monotonic() + DEADLINE * 2
    while time.monotonic() < deadline:
        run = JobRun.objects.get(pk=run_id)
        if run.is_finished:
            return run
        time.sleep(0.2)
    raise AssertionError(f"run {run_id} did not finish: {run.status}")


def test_the_forking_worker_tells_its_work_horse(tenants):
    handle = jobs.cancellable.enqueue(tenant="t1", tag="fork")
    proc = _forking_worker()
    try:
        thread, _ = _when_running(
            handle.run_id,
            lambda: operations.cancel_run(JobRun.objects.get(pk=handle.run_id), by="ops"),
        )
        thread.join()
        run = _wait_finished(handle.run_id)
    finally:
        out = _stop(proc)
    assert run.status == RunStatus.CANCELLED, out
    # The job itself stopped (JobCancelled from check_cancelled in the horse), not the kill.
    assert JobAttempt.objects.get(run=run).error_message.startswith("cancellation requested")
    assert "killing its work horse" not in out


def test_the_forking_worker_kills_a_horse_that_never_checks(tenants):
    handle = jobs.ignores_cancel.enqueue(tenant="t1", tag="stubborn")
    proc = _forking_worker()
    try:
        thread, _ = _when_running(
            handle.run_id,
            lambda: operations.cancel_run(JobRun.objects.get(pk=handle.run_id), by="ops"),
        )
        thread.join()
        run = _wait_finished(handle.run_id)
    finally:
        out = _stop(proc)
    assert run.status == RunStatus.CANCELLED, out
    assert run.attempts == 1 and "killed the work horse" in run.error_message
    assert JobAttempt.objects.get(run=run).outcome == JobAttempt.Outcome.CANCELLED
    assert "killing its work horse" in out
    _nothing_left_to_run()
