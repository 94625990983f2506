"""The cron gap a killed scheduler left, closed (issue 28): a short lock, and the ticks caught up.

Set up directly on the real Redis and PostgreSQL, without killing processes (test_chaos_cron
does that): a scheduler that took rq-scheduler's lock and died holds up the others for
``SCHEDULER_LOCK_TTL`` (1 s), not rq-scheduler's ``--interval + 10`` s; a live holder's lock
outlives that TTL because its loop renews it, and a holder whose lock expired cannot delete the
next holder's. An alarm rung a few seconds late (the hand-over) fires every tick it passed,
each once, also when a second scheduler rings it again.
"""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.conf import settings
from django.test import override_settings

from kumiko_jobs import transport
from kumiko_jobs.core.envelope import tick_run_id
from kumiko_jobs.definition.cron import latest_tick
from kumiko_jobs.enqueueing.schedules import schedule_id, sync_schedules
from kumiko_jobs.models import JobRun
from tests.testapp import jobs

pytestmark = pytest.mark.usefixtures("live_db")

LOCK = "rq:scheduler_lock"
JOB = jobs.every_two_seconds  # "*/2" seconds, on the "low" queue


def test_a_dead_holders_lock_expires_within_the_ttl(redis_conn):
    dead = transport.scheduler_for("low")
    assert dead.acquire_lock()  # ... and killed inside its round: never released
    assert 0 < redis_conn.pttl(LOCK) <= 1000  # SCHEDULER_LOCK_TTL; rq-scheduler's was 11 s
    other = transport.scheduler_for("low")
    assert not other.acquire_lock()
    redis_conn.pexpire(LOCK, 1)  # the TTL has run out (Redis's clock, not the test's)
    time.sleep(0.01)
    assert other.acquire_lock()
    dead.remove_lock()  # a stale holder cannot delete the next holder's lock
    assert redis_conn.exists(LOCK)
    other.remove_lock()
    assert not redis_conn.exists(LOCK)


# The renewal's test with a TTL of 3 s (renewed every second): what it shows does not depend on
# the TTL, and a 1 s TTL made it fail on a machine that stalled the process for a second (a
# stall longer than the TTL loses a live holder's lock by design: its round then stops).
@override_settings(KUMIKO_JOBS={**settings.KUMIKO_JOBS, "SCHEDULER_LOCK_TTL": 3.0})
def test_a_live_holder_keeps_renewing_its_lock(redis_conn):
    holder = transport.scheduler_for("low")
    holder._renews_lock = True  # as in its own loop (serve)
    assert holder.acquire_lock()
    try:
        assert 2000 < redis_conn.pttl(LOCK) <= 3000
        time.sleep(7)  # more than twice the TTL: only renewal keeps it
        assert not transport.scheduler_for("low").acquire_lock()
        assert not holder.lock_lost()
    finally:
        holder.remove_lock()
    assert not redis_conn.exists(LOCK)


def test_a_lock_lost_mid_round_stops_the_round(redis_conn):
    holder = transport.scheduler_for("low")
    holder._renews_lock = True
    assert holder.acquire_lock()
    redis_conn.set(LOCK, "another scheduler's token")  # expired and taken meanwhile
    deadline = time.monotonic() + 5
    while not holder.lock_lost() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert holder.lock_lost()
    holder.remove_lock()
    assert redis_conn.get(LOCK) == b"another scheduler's token"


def _tick_rows() -> set[uuid.UUID]:
    return set(JobRun.objects.filter(job_name=JOB.name).values_list("pk", flat=True))


def _ticks(first: datetime, until: datetime) -> list[datetime]:
    """``JOB``'s ticks from ``first`` up to the latest one at ``until``."""
    ticks = []
    tick = first
    while tick <= latest_tick(JOB.cron, JOB.timezone, until):
        ticks.append(tick)
        tick += timedelta(seconds=2)
    return ticks


def _ids(ticks: list[datetime]) -> set[uuid.UUID]:
    return {uuid.UUID(tick_run_id(JOB.name, t)) for t in ticks}


def test_an_alarm_rung_seconds_late_fires_every_tick_it_passed_once(redis_conn):
    sync_schedules()
    key = transport.Scheduler.scheduled_jobs_key
    # Armed for a tick 2.1-4.1 s ago (within CRON_CATCH_UP, 5 s, with 0.9 s to spare before the
    # round reads its clock), as a round killed left it.
    armed = latest_tick(JOB.cron, JOB.timezone, datetime.now(UTC) - timedelta(seconds=2.1))
    redis_conn.zadd(key, {schedule_id(JOB): armed.timestamp()}, xx=True)

    before = datetime.now(UTC)
    transport.scheduler_for("low").enqueue_jobs()
    after = datetime.now(UTC)

    # Every tick from the armed one to the latest at the round's own moment, which lies between
    # ``before`` and ``after``: a round on a loaded machine may straddle a two-second tick.
    fired = _tick_rows()
    ticks = next(
        (ticks for ticks in (_ticks(armed, before), _ticks(armed, after)) if _ids(ticks) == fired),
        _ticks(armed, after),
    )
    assert len(ticks) >= 2
    assert fired == _ids(ticks)
    pushed = transport.get_queue("low").job_ids
    assert len(pushed) == len(ticks) == len(set(pushed))

    # A second scheduler rings the same late alarm again: the passed ticks find their rows;
    # at most the ticks that fell since are new, and nothing is pushed twice.
    redis_conn.zadd(key, {schedule_id(JOB): armed.timestamp()}, xx=True)
    transport.scheduler_for("low").enqueue_jobs()
    since = _ids(_ticks(armed, datetime.now(UTC))) - fired
    assert _tick_rows() - fired <= since
    again = transport.get_queue("low").job_ids
    assert len(again) == len(set(again)) == len(_tick_rows())
