"""What happens to cron ticks missed while no scheduler ran (issue 23; docs/settings.md, ``cron``).

Pinned as kumiko's ``Scheduler`` really does it, on the real Redis and PostgreSQL (the
scheduler's own round, in this process): an alarm whose time passed while no scheduler ran
keeps its score, also across the next scheduler start (``sync_schedules`` leaves an unchanged
entry alone). The first round after that rings it once: it starts **one** run, for the latest
tick at or before now (late), none for the ticks before it, and re-arms the alarm at the next
tick. An entry that had to be registered again (deleted, or its cron changed) starts at its
next tick and catches nothing up.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest

from kumiko_jobs import transport
from kumiko_jobs.core.envelope import tick_run_id
from kumiko_jobs.definition.cron import latest_tick
from kumiko_jobs.enqueueing.schedules import schedule_id, sync_schedules
from kumiko_jobs.models import JobRun
from tests.testapp import jobs

pytestmark = pytest.mark.usefixtures("live_db")


def _score(redis_conn, definition) -> float | None:
    return redis_conn.zscore(transport.Scheduler.scheduled_jobs_key, schedule_id(definition))


def _stop_the_clock_for(redis_conn, definition, seconds: float) -> None:
    """The alarm as a scheduler stopped ``seconds`` ago left it: due since then."""
    key = transport.Scheduler.scheduled_jobs_key
    redis_conn.zadd(key, {schedule_id(definition): time.time() - seconds}, xx=True)


def _one_round(queue: str) -> None:
    transport.scheduler_for(queue).enqueue_jobs()


def test_ticks_missed_for_seconds_start_one_late_run_for_the_latest(redis_conn):
    job = jobs.every_two_seconds
    sync_schedules()
    _stop_the_clock_for(redis_conn, job, 11.0)  # five ticks fell meanwhile
    sync_schedules()  # the scheduler starts again: the unchanged entry keeps its score
    assert _score(redis_conn, job) < time.time() - 10
    before = datetime.now(UTC)
    _one_round("low")
    after = datetime.now(UTC)
    [run] = JobRun.objects.filter(job_name=job.name)
    # The latest tick at the moment of the round, which lies between ``before`` and ``after``
    # (a round on a loaded machine may straddle a two-second tick).
    rung = {tick_run_id(job.name, latest_tick(job.cron, job.timezone, t)) for t in (before, after)}
    assert run.run_id.hex in rung
    assert transport.queue_length("low") == 1
    # Re-armed at the next tick after the round; a round before that tick rings nothing.
    armed = _score(redis_conn, job)
    assert armed > before.timestamp()
    _one_round("low")
    if time.time() < armed:
        assert JobRun.objects.filter(job_name=job.name).count() == 1
    else:  # the machine was slower than one tick: that tick rang, and only it
        assert JobRun.objects.filter(job_name=job.name).count() <= 2


def test_days_of_missed_daily_ticks_start_one_run(redis_conn):
    job = jobs.nightly_cleanup  # 03:00 Europe/Berlin
    sync_schedules()
    _stop_the_clock_for(redis_conn, job, 3 * 86400)
    _one_round(job.queue_name)
    [run] = JobRun.objects.filter(job_name=job.name)
    latest = latest_tick(job.cron, job.timezone, datetime.now(UTC))
    assert run.run_id.hex == tick_run_id(job.name, latest)
    assert (datetime.now(UTC) - latest).total_seconds() < 86400  # the last one, not the first


def test_a_re_registered_entry_catches_nothing_up(redis_conn):
    job = jobs.every_two_seconds
    sync_schedules()
    _stop_the_clock_for(redis_conn, job, 11.0)
    transport.cancel_scheduled(schedule_id(job))  # deleted, e.g. from django-rq's pages
    before = datetime.now(UTC)
    _one_round("low")  # restored at its next tick, as the round begins
    after = datetime.now(UTC)
    assert _score(redis_conn, job) > before.timestamp()
    # No run for a tick before the round. (A tick that fell during the round, on a loaded
    # machine, may have rung in it: that one only.)
    latest = latest_tick(job.cron, job.timezone, after)
    during = {tick_run_id(job.name, latest)} if latest > before else set()
    runs = {r.hex for r in JobRun.objects.filter(job_name=job.name).values_list("pk", flat=True)}
    assert runs <= during
