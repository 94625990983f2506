"""Job semantics of issue 14: concurrency options of system jobs, skipped vs capped.

Real PostgreSQL, real Redis, real RQ workers (separate ``manage.py rqworker`` processes where
two runs must be able to overlap).
"""

from __future__ import annotations

import subprocess
import time
from datetime import UTC, datetime
from typing import Any

import pytest

from kumiko_jobs import InvalidJob, signals, transport
from kumiko_jobs.definition.options import build_definition
from kumiko_jobs.enqueueing.schedules import fire, schedule_id
from kumiko_jobs.models import JobAttempt, JobRun, RunStatus
from tests.conftest import start_rqworker, work
from tests.testapp import jobs

pytestmark = pytest.mark.usefixtures("live_db")

DEADLINE = 60.0  # seconds the workers get to finish both runs before the test gives up
# Two 04:00 ticks on different days: two distinct runs of the same cron job.
TICKS = (datetime(2026, 3, 1, 4, 0, 1, tzinfo=UTC), datetime(2026, 3, 2, 4, 0, 1, tzinfo=UTC))


def _fire_two_ticks(definition: Any) -> list[str]:
    run_ids = []
    for now in TICKS:
        firing = fire(schedule_id(definition), now=now)
        assert firing.message is not None
        transport.push(firing.message)
        run_ids.append(firing.run_id)
    return run_ids


def _run_with_two_workers(run_ids: list[str]) -> list[JobRun]:
    """Two long-running worker processes, stopped once both runs are finished."""
    workers = [start_rqworker("default") for _ in range(2)]
    try:
        deadline = time.monotonic() + DEADLINE
        while time.monotonic() < deadline:
            done = JobRun.objects.filter(pk__in=run_ids, status=RunStatus.SUCCEEDED).count()
            if done == len(run_ids):
                break
            time.sleep(0.2)
    finally:
        for proc in workers:
            proc.terminate()
        for proc in workers:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    runs = sorted(JobRun.objects.filter(pk__in=run_ids), key=lambda r: r.started_at)
    assert [r.status for r in runs] == [RunStatus.SUCCEEDED] * 2, [
        (r.status, r.error_message) for r in runs
    ]
    return runs


def _saw_a_sibling(run: JobRun) -> bool:
    lines = JobAttempt.objects.get(run=run).log
    return any(line["msg"] == "a sibling run is running" for line in lines)


def test_a_sequential_system_cron_does_not_overlap_itself():
    run_ids = _fire_two_ticks(jobs.sequential_system_cron)
    # The sequential cap, keyed for the system: both ticks queued, the dequeue holds one back.
    assert transport.queue_length("default") == 2
    first, second = _run_with_two_workers(run_ids)
    assert second.started_at >= first.finished_at
    assert not _saw_a_sibling(first) and not _saw_a_sibling(second)


def test_calibration_a_parallel_system_cron_overlaps_itself_on_two_workers():
    # Without concurrency options the same two ticks run at once on the two workers: the
    # assertions above can fail.
    run_ids = _fire_two_ticks(jobs.parallel_system_cron)
    assert transport.queue_length("default") == 2
    first, second = _run_with_two_workers(run_ids)
    assert second.started_at < first.finished_at
    # Each saw the other running (a run that sees its sibling lingers so the sibling sees it).
    assert _saw_a_sibling(first) and _saw_a_sibling(second)


def _dropped_outcomes() -> tuple[list[dict[str, Any]], Any]:
    seen: list[dict[str, Any]] = []

    def on_drop(**kwargs: Any) -> None:
        seen.append(kwargs)

    signals.job_dropped.connect(on_drop)
    return seen, on_drop


def test_a_skip_system_cron_records_a_skipped_tick_while_the_last_is_active():
    seen, receiver = _dropped_outcomes()
    try:
        first = fire(schedule_id(jobs.skipping_system_cron), now=TICKS[0])
        second = fire(schedule_id(jobs.skipping_system_cron), now=TICKS[1])
        again = fire(schedule_id(jobs.skipping_system_cron), now=TICKS[1])
    finally:
        signals.job_dropped.disconnect(receiver)
    assert first.message is not None
    assert second.message is None and again.message is None
    skipped = JobRun.objects.get(pk=second.run_id)
    assert skipped.status == RunStatus.SKIPPED and skipped.finished_at is not None
    assert JobRun.objects.filter(job_name="testapp.skipping_system_cron").count() == 2
    assert [(s["run_id"], s["outcome"]) for s in seen] == [(second.run_id, "skipped")]
    transport.push(first.message)
    work()
    assert JobRun.objects.get(pk=first.run_id).status == RunStatus.SUCCEEDED
    third = fire(schedule_id(jobs.skipping_system_cron), now=datetime(2026, 3, 3, 5, tzinfo=UTC))
    assert third.message is not None  # the last tick is done: the next one runs


def test_max_per_tenant_caps_a_system_job_and_says_capped_not_skipped():
    seen, receiver = _dropped_outcomes()
    try:
        first = jobs.capped_system.enqueue(tag="a")
        second = jobs.capped_system.enqueue(tag="b")
    finally:
        signals.job_dropped.disconnect(receiver)
    assert first.admitted and not first.capped
    assert second.capped and not second.skipped and not second.admitted
    assert JobRun.objects.get(pk=second.run_id).status == RunStatus.CAPPED
    assert [s["outcome"] for s in seen] == ["capped"]
    work()
    assert JobRun.objects.get(pk=first.run_id).status == RunStatus.SUCCEEDED
    assert jobs.capped_system.enqueue(tag="c").admitted  # the slot is free again


def test_skip_mode_says_skipped_not_capped(tenants):
    seen, receiver = _dropped_outcomes()
    try:
        jobs.skip_while_busy.enqueue(tenant="t1", tag="first")
        second = jobs.skip_while_busy.enqueue(tenant="t1", tag="second")
    finally:
        signals.job_dropped.disconnect(receiver)
    assert second.skipped and not second.capped
    row = JobRun.objects.get(pk=second.run_id)
    assert row.status == RunStatus.SKIPPED and row.schema_name == "t1"
    assert [(s["outcome"], s["schema_name"]) for s in seen] == [("skipped", "t1")]


def test_concurrency_combinations_without_a_meaning_are_refused_at_registration():
    def gate(ctx):
        return None

    for option in ({"concurrency": "skip"}, {"max_per_tenant": 1}, {"tenant_concurrency": 2}):
        with pytest.raises(InvalidJob, match="boot_gate=True runs inline"):
            build_definition(gate, {"system": True, "boot_gate": True, **option})
    with pytest.raises(InvalidJob, match="a cron schedule has none"):
        build_definition(
            gate, {"system": True, "cron": "0 3 * * *", "concurrency": "debounce", "debounce": 5}
        )
    # The same options on a system job that is enqueued mean what they mean for a tenant job.
    for option in ({"concurrency": "skip"}, {"max_per_tenant": 1}, {"tenant_concurrency": 2}):
        assert build_definition(gate, {"system": True, "cron": "0 3 * * *", **option})


@pytest.fixture
def job_logger_level() -> Any:
    import logging

    logger = logging.getLogger("kumiko_jobs.job")
    before = logger.level
    yield logger.setLevel
    logger.setLevel(before)


def _lines(run_id: str) -> list[tuple[str, str, dict[str, Any]]]:
    return [(e["level"], e["msg"], e["data"]) for e in JobAttempt.objects.get(run_id=run_id).log]


def test_log_child_binds_fields_and_debug_lines_follow_the_logger_level(tenants, job_logger_level):
    import logging

    job_logger_level(logging.INFO)
    quiet = jobs.logs_in_parts.enqueue(tenant="t1", tag="q")
    work()
    assert _lines(quiet.run_id) == [
        ("INFO", "charging", {"step": "charge", "invoice": 7, "amount": 12}),
        ("WARNING", "again", {"step": "retry-charge", "invoice": 7, "attempt_no": 2}),
        ("INFO", "done", {}),
    ]
    job_logger_level(logging.DEBUG)
    verbose = jobs.logs_in_parts.enqueue(tenant="t1", tag="v")
    work()
    assert ("DEBUG", "noisy detail", {"tag": "v"}) in _lines(verbose.run_id)
    assert len(_lines(verbose.run_id)) == 4
