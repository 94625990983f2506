"""A worker SIGKILLed in the middle of a rate-limited, prioritised, partly paused backlog
(issue 24, "Done when": worker kills, nothing lost or duplicated), and an ``rqscheduler``
SIGKILLed while delayed runs wait in its set.

Real ``manage.py rqworker`` processes (the reliability suite's ``Workers``: the same command
line, with its faster liveness settings, ``WORKER_DEAD_AFTER=3``), real Redis and PostgreSQL.
What is counted is what the jobs write (one ``Probe`` row per run, one ``ActivityLog`` row
for the killed run), the attempts' starts per rate window, and the order of the starts by
priority level; no assertion reads a duration.
"""

from __future__ import annotations

import signal
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from bench import soak
from kumiko_jobs import transport
from kumiko_jobs.models import JobAttempt, JobRun, RunStatus
from kumiko_jobs.worker import pauses
from tests.conftest import TENANTS, probes, work
from tests.integration.test_flow_end_to_end_scheduler import (
    RunningScheduler,
    attempt_order,
    moved,
    scheduled,
)
from tests.integration.test_rate_limits import most_in_any_window, start_times
from tests.integration.test_reliability import effects, status
from tests.integration.test_reliability import workers as workers
from tests.integration.test_two_schedulers import live_schedulers
from tests.testapp import jobs

pytestmark = pytest.mark.usefixtures("live_db")


def succeeded(run_ids: list[str]) -> bool:
    return JobRun.objects.filter(pk__in=run_ids, status=RunStatus.SUCCEEDED).count() == len(run_ids)


def test_a_worker_killed_mid_backlog_loses_nothing_runs_nothing_twice_and_keeps_the_rules(
    tenants: Any, workers: Any
) -> None:
    """Worker 1 runs a long t1 run while the backlog arrives: eight t2 runs at level 0, five t1
    runs at level 3, fifteen ``rate_probe`` runs (5/s across tenants) and three runs of the
    paused tenant t3. Worker 1 is SIGKILLed mid-run; two fresh workers sweep it and drain the
    rest. Every run of the others succeeds exactly once (one row each, one attempt each; the
    killed run once more, its effect written once), none is left ``running``, no window holds
    more than five rate-probe starts, the level-3 runs start before the level-0 ones (two
    workers may start one level-0 run while the other records its last level-3 start), and
    t3's runs wait, untouched, until the resume, then run once each.

    Proven able to fail: with levels ignored (every message pushed at level 0,
    ``messages.message_for`` with ``priority=0``) the level-0 runs interleave with the
    level-3 ones; with ``rate_probe``'s window dropped (``rates_of`` returning no windows)
    more than five start in a window; with paused tenants left out of the dequeue's sets
    (``assert_pauses``) t3's runs start before the resume."""
    pauses.pause(tenant="t3")
    victim_run = soak.job("soak.sleeper").enqueue(tenant="t1", tag="victim", seconds=60)
    victim = workers.start()
    workers.wait_for(
        "the long run to start", lambda: status(victim_run.run_id) == RunStatus.RUNNING
    )

    lows = [jobs.probe.enqueue(tenant="t2", tag=f"low{i}").run_id for i in range(8)]
    urgent = jobs.probe.using(priority=3)
    highs = [urgent.enqueue(tenant="t1", tag=f"hi{i}").run_id for i in range(5)]
    limited = [
        jobs.rate_probe.enqueue(tenant="t1" if i % 2 else "t2", tag=f"r{i}").run_id
        for i in range(15)
    ]
    paused = [jobs.probe.enqueue(tenant="t3", tag=f"p{i}").run_id for i in range(3)]
    victim.send_signal(signal.SIGKILL)
    assert victim.wait() == -signal.SIGKILL
    workers.start()
    workers.start()
    everything_else = [victim_run.run_id, *lows, *highs, *limited]
    workers.wait_for("every unpaused run to succeed", lambda: succeeded(everything_else))

    # Nothing lost, nothing twice: one attempt and one row per run; the killed run's effect once.
    others = JobRun.objects.filter(pk__in=[*lows, *highs, *limited])
    assert set(others.values_list("attempts", flat=True)) == {1}
    assert JobAttempt.objects.filter(run__in=others).count() == len(others)
    assert effects("t1", "sleeper") == ["victim a2 t1"]
    tags = Counter(p.tag for schema in TENANTS for p in probes(schema))
    assert set(tags.values()) == {1}, tags
    assert sorted(tags) == sorted(
        [*(f"low{i}" for i in range(8)), *(f"hi{i}" for i in range(5))]
        + [f"r{i}" for i in range(15)]
    )
    assert not JobRun.objects.filter(status=RunStatus.RUNNING).exists()
    # The rate limit held in every window, across the kill and the two workers.
    times = start_times(jobs.rate_probe.name)
    assert len(times) == 15 and most_in_any_window(times, 0.95) <= 5, times
    # Priorities for what remained: level 3 first (one level-0 start may overlap the last).
    order = list(
        JobAttempt.objects.filter(run__in=others)
        .order_by("started_at")
        .values_list("run__priority", flat=True)
    )
    last_high = max(i for i, level in enumerate(order) if level == 3)
    assert order[:last_high].count(0) <= 1, order
    # The paused tenant's runs waited untouched: queued, no attempt, no row.
    t3 = JobRun.objects.filter(pk__in=paused)
    assert set(t3.values_list("status", flat=True)) == {RunStatus.QUEUED}
    assert not JobAttempt.objects.filter(run__in=t3).exists() and probes("t3") == []

    pauses.resume(tenant="t3")
    workers.wait_for("t3's runs to succeed after the resume", lambda: succeeded(paused))
    # Each once, and FIFO as two workers can show it: the resume wakes both (the doorbell), so
    # p0 and p1 start together and may finish in either order, but p2 starts after p0.
    assert sorted(p.tag for p in probes("t3")) == ["p0", "p1", "p2"]
    started = list(
        JobAttempt.objects.filter(run__in=t3)
        .order_by("started_at")
        .values_list("run__payload", flat=True)
    )
    tags = [payload["tag"] for payload in started]
    assert tags.index("p0") < tags.index("p2"), tags
    assert set(t3.values_list("attempts", flat=True)) == {1}
    assert not JobRun.objects.filter(status=RunStatus.RUNNING).exists()
    workers.wait_for("the queue to drain", lambda: transport.get_queue("default").count == 0)


def test_a_killed_rqscheduler_loses_no_delayed_run_and_the_next_one_keeps_their_rules(
    tenants: Any, redis_conn: Any, tmp_path: Path
) -> None:
    """``rqscheduler`` is SIGKILLed while delayed runs wait in its set (a t1 run at priority 5,
    ten ``rate_probe`` runs, a unique run); a new ``rqscheduler`` (rq-scheduler's lock of the
    dead one expires) moves each once, with what its push decided: the priority-5 run starts
    before t1's backlog queued ahead of it, no window holds more than five rate-probe starts,
    the unique key still returns the run, and every run made one attempt and one row.

    Proven able to fail: with the fair field dropped when the scheduler moves a message
    (``job.meta = {}; job.save_meta()`` in ``Scheduler.enqueue_job``) the priority-5 run
    starts behind the backlog."""
    first = RunningScheduler(tmp_path / "rqscheduler-1.log")
    try:
        first.wait_for("the first scheduler to start", lambda: live_schedulers(redis_conn) >= 1)
        for i in range(3):
            jobs.probe.enqueue(tenant="t1", tag=f"low{i}")
        delay = 5.0  # due after the kill: the dead scheduler moves none of them
        hi = jobs.probe.using(priority=5).enqueue_in(delay, tenant="t1", tag="hi").run_id
        limited = [
            jobs.rate_probe.enqueue_in(delay, tenant="t1" if i % 2 else "t2", tag=f"r{i}").run_id
            for i in range(10)
        ]
        unique = jobs.unique_sync.enqueue_in(delay, tenant="t1", invoice_id=9).run_id
        assert all(scheduled(run_id) for run_id in [hi, unique, *limited])
        first.proc.send_signal(signal.SIGKILL)
        assert first.proc.wait() == -signal.SIGKILL
    finally:
        first.stop()
    second = RunningScheduler(tmp_path / "rqscheduler-2.log")
    try:
        delayed = [hi, unique, *limited]
        second.wait_for("the second scheduler to move the delayed runs", moved(delayed))
    finally:
        second.stop()
    again = jobs.unique_sync.enqueue(tenant="t1", invoice_id=9)
    assert again.deduplicated and again.run_id == unique
    work()

    t1 = [tag for tag, _ in attempt_order({jobs.probe.name})]
    assert t1 == ["hi", "low0", "low1", "low2"], t1
    times = start_times(jobs.rate_probe.name)
    assert len(times) == 10 and most_in_any_window(times, 0.95) <= 5, times
    mine = JobRun.objects.filter(pk__in=delayed)
    assert set(mine.values_list("status", flat=True)) == {RunStatus.SUCCEEDED}
    assert set(mine.values_list("attempts", flat=True)) == {1}
    assert JobAttempt.objects.filter(run__in=mine).count() == len(delayed)
    tags = Counter(p.tag for p in probes("t1") + probes("t2"))
    assert tags["hi"] == 1 and tags["unique-9"] == 1
    assert all(tags[f"r{i}"] == 1 for i in range(10)), tags
