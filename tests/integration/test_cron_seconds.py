"""Seconds in cron expressions (issue 14): one tick per due second, identified by it, exactly
once across two real ``manage.py rqscheduler`` processes (real Redis and PostgreSQL)."""

from __future__ import annotations

import subprocess
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from kumiko_jobs import InvalidJob, transport
from kumiko_jobs.core.envelope import _TICK_NAMESPACE, decode, tick_run_id
from kumiko_jobs.definition.cron import latest_tick, shortest_interval
from kumiko_jobs.definition.options import build_definition
from kumiko_jobs.enqueueing.schedules import fire, schedule_id
from kumiko_jobs.models import JobRun
from tests.integration.test_two_schedulers import live_schedulers, start_rqscheduler, wait_until
from tests.testapp import jobs

JOB = jobs.every_two_seconds


def test_minute_crons_keep_their_tick_ids():
    # The per-minute scheme's ids (job@minute), so ticks fired before a deploy stay fired.
    tick = datetime(2026, 5, 1, 3, 0, tzinfo=UTC)
    old = uuid.uuid5(_TICK_NAMESPACE, f"billing.x@{tick.isoformat()}").hex
    assert tick_run_id("billing.x", tick) == old
    assert tick_run_id("billing.x", tick + timedelta(seconds=2)) != old


def test_latest_tick_is_the_due_second():
    base = datetime(2026, 5, 1, 3, 0, 4, 300000, tzinfo=UTC)
    assert latest_tick(JOB.cron, "UTC", base) == base.replace(microsecond=0)
    assert latest_tick(JOB.cron, "UTC", base + timedelta(seconds=1)) == base.replace(microsecond=0)
    # 0.4 s before the next due second: still the last one; a tick never fires early.
    assert latest_tick(JOB.cron, "UTC", base + timedelta(seconds=1.3)) == base.replace(
        microsecond=0
    )
    assert latest_tick(JOB.cron, "UTC", datetime(2026, 5, 1, 3, 0, 6, tzinfo=UTC)) == datetime(
        2026, 5, 1, 3, 0, 6, tzinfo=UTC
    )
    assert shortest_interval(JOB.cron) == 2.0


def test_sub_minute_per_tenant_crons_and_six_fields_are_refused():
    def report(ctx):
        return None

    with pytest.raises(InvalidJob, match="at most once a minute"):
        build_definition(report, {"cron": "*/30 * * * * * *", "per_tenant": True})
    # Once a minute, written with seconds: fine for a fan-out.
    assert build_definition(report, {"cron": "15 * * * * * *", "per_tenant": True})
    with pytest.raises(InvalidJob, match="6 fields"):
        build_definition(report, {"cron": "*/5 * * * * *", "system": True})


@pytest.mark.usefixtures("live_db")
def test_each_due_second_fires_its_own_tick_once():
    at = datetime(2026, 5, 1, 3, 0, 4, 200000, tzinfo=UTC)
    first = fire(schedule_id(JOB), now=at)
    again = fire(schedule_id(JOB), now=at + timedelta(seconds=0.5))  # same second, rung twice
    later = fire(schedule_id(JOB), now=at + timedelta(seconds=2))
    assert first.message is not None and later.message is not None and again.message is None
    assert again.run_id == first.run_id != later.run_id
    assert first.next_at == datetime(2026, 5, 1, 3, 0, 6, tzinfo=UTC).timestamp()
    assert JobRun.objects.filter(job_name=JOB.name).count() == 2


@pytest.mark.usefixtures("live_db")
def test_two_rqschedulers_fire_every_due_second_once(redis_conn, tmp_path: Path):
    log_paths = [tmp_path / f"rqscheduler-{i}.log" for i in (1, 2)]
    log_files = [path.open("w") for path in log_paths]
    schedulers = [start_rqscheduler(log) for log in log_files]
    queue = transport.get_queue("low")

    def logs() -> str:
        for log in log_files:
            log.flush()
        return "\n".join(f"--- {p.name}\n{p.read_text()}" for p in log_paths)

    try:
        wait_until(lambda: live_schedulers(redis_conn) == 2, "both schedulers to start", logs)
        # Both synced the schedules (the 2-second alarm included) and ring it in turn.
        wait_until(lambda: len(queue.job_ids) >= 4, "four ticks on the queue", logs)
    finally:
        for proc in schedulers:
            proc.terminate()
        for proc in schedulers:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for log in log_files:
            log.close()
    job_ids = queue.job_ids
    assert len(job_ids) == len(set(job_ids)), logs()  # no tick pushed twice
    ticks = []
    for job_id in job_ids:
        env = decode(transport.JsonJob.fetch(job_id, connection=redis_conn).args[0])
        assert env.tick is not None
        tick = datetime.fromisoformat(env.tick)
        # Identified by the scheduled second, which is a due second of the crontab.
        assert tick.second % 2 == 0 and tick.microsecond == 0
        assert env.run_id == tick_run_id(JOB.name, tick)
        ticks.append(tick)
    assert len(set(ticks)) == len(ticks)
    # One run row per pushed tick, and more than one tick within a minute: seconds honoured.
    rows = JobRun.objects.filter(job_name=JOB.name)
    assert rows.count() == len(ticks) >= 4
    assert max(ticks) - min(ticks) < timedelta(minutes=1)
