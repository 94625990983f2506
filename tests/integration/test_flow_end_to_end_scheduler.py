"""Flow control through a real ``manage.py rqscheduler`` (issue 24, "Done when").

Delayed messages (``enqueue_in``, a retry's backoff, ``ctx.defer``, a Django task's
``run_after``) wait in rq-scheduler's set and reach their queue when the ``rqscheduler``
process moves them, not kumiko's push: these tests check that what the push decided (the
priority level, the rate-limit windows, the unique key) survives that move, and that cron
ticks of a paused job or tenant wait and run once after the resume.

Order, never time: a run's place among the attempts' starts (``JobAttempt.started_at``, written
by one in-process worker) is what the priority assertions read; rate limits are counted per
window as in test_rate_limits.py. The scheduler is a real process on the test Redis database;
the worker runs in this process (``work``) once the scheduler has moved what it waits for.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import IO, Any

import pytest
from django.utils import timezone
from django_tenants.utils import schema_context

from kumiko_jobs import transport
from kumiko_jobs.enqueueing.schedules import cron_spec
from kumiko_jobs.models import JobAttempt, JobRun, RunStatus
from kumiko_jobs.worker import pauses
from kumiko_jobs.worker.relay import pending_rq_job_ids
from tests.conftest import TENANTS, probes, work
from tests.integration.test_fair_dequeue import work_some
from tests.integration.test_rate_limits import most_in_any_window, start_times
from tests.integration.test_two_schedulers import (
    live_schedulers,
    start_rqscheduler,
    wait_for_room_in_this_minute,
)
from tests.testapp import jobs

pytestmark = pytest.mark.usefixtures("live_db")

DEADLINE = 30.0  # a safety net for waits, not a measurement
DUE = 1.5  # seconds the delayed messages wait in rq-scheduler's set


class RunningScheduler:
    """One ``manage.py rqscheduler --interval 1`` process, logging to a file."""

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path
        self.log: IO[str] = log_path.open("w")
        self.proc = start_rqscheduler(self.log)

    def logs(self) -> str:
        self.log.flush()
        return self.log_path.read_text()[-4000:]

    def wait_for(self, what: str, check: Callable[[], bool]) -> None:
        end = time.monotonic() + DEADLINE
        while not check():
            if time.monotonic() > end:
                pytest.fail(f"gave up waiting for {what}\n{self.logs()}")
            if self.proc.poll() is not None:
                pytest.fail(f"rqscheduler exited ({self.proc.returncode})\n{self.logs()}")
            time.sleep(0.1)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()  # rq-scheduler registers its death and drops its lock
            try:
                self.proc.wait(timeout=DEADLINE)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


@pytest.fixture
def scheduler(tenants: Any, redis_conn: Any, tmp_path: Path) -> Iterator[RunningScheduler]:
    running = RunningScheduler(tmp_path / "rqscheduler.log")
    try:
        running.wait_for("the scheduler to start", lambda: live_schedulers(redis_conn) >= 1)
        yield running
    finally:
        running.stop()


def attempt_order(job_names: set[str] | None = None) -> list[tuple[str, int]]:
    """(tag, attempt number) of every attempt of ``job_names``, in the order they started."""
    rows = JobAttempt.objects.select_related("run").order_by("started_at", "pk")
    if job_names is not None:
        rows = rows.filter(run__job_name__in=job_names)
    return [(a.run.payload.get("tag", ""), a.number) for a in rows]


def waiting_ids(run_ids: list[str]) -> set[str]:
    """The RQ job ids the runs' next messages have (the relay's candidates: a retry's is the
    next attempt's, a deferral's the next deferral's)."""
    return {i for r in JobRun.objects.filter(pk__in=run_ids) for i in pending_rq_job_ids(r)}


def moved(run_ids: list[str]) -> Callable[[], bool]:
    """Have the runs' next messages left rq-scheduler's set (moved to their queue)?"""
    ids = waiting_ids(run_ids)

    def check() -> bool:
        return not ids & set(transport.scheduled_job_ids("default"))

    return check


def scheduled(run_id: str) -> bool:
    return bool(waiting_ids([run_id]) & set(transport.scheduled_job_ids("default")))


def fair_field(redis_conn: Any, run_id: str) -> list[Any]:
    """The fair field (bucket, weight, priority, job, windows) of the run's next message."""
    for rq_job_id in sorted(waiting_ids([run_id])):
        if redis_conn.exists(f"rq:job:{rq_job_id}"):
            job = transport.JsonJob.fetch(rq_job_id, connection=redis_conn)
            return list(job.meta.get("kumiko_fair") or [])
    raise AssertionError(f"no message in Redis for run {run_id}")


def test_delayed_runs_keep_priority_rate_limit_and_unique_key_when_rqscheduler_moves_them(
    scheduler: RunningScheduler, redis_conn: Any
) -> None:
    """A backlog of t1 runs at priority 0 is queued; then, delayed by 1.5 s: a t1 run at
    priority 5, twelve runs of ``rate_probe`` (5/s across tenants) and a unique run. Once the
    scheduler moved them, the priority-5 run starts before all of t1's backlog queued ahead of
    it, no window holds more than five starts of ``rate_probe``, and the unique key was held
    while the run waited in the scheduler and after the move (one run, one effect).

    Proven able to fail: with the fair field dropped from the message when rq-scheduler moves
    it (``job.meta = {}; job.save_meta()`` in ``Scheduler.enqueue_job``) the priority-5 run
    starts behind t1's backlog."""
    for i in range(6):
        jobs.probe.enqueue(tenant="t1", tag=f"low{i}")
    hi = jobs.probe.using(priority=5).enqueue_in(DUE, tenant="t1", tag="delayed-hi")
    limited = [
        jobs.rate_probe.enqueue_in(DUE, tenant="t1" if i % 2 else "t2", tag=f"r{i}")
        for i in range(12)
    ]
    first = jobs.unique_sync.enqueue_in(DUE, tenant="t1", invoice_id=7, note="first")
    while_scheduled = jobs.unique_sync.enqueue_in(DUE, tenant="t1", invoice_id=7, note="second")
    assert while_scheduled.deduplicated and while_scheduled.run_id == first.run_id
    delayed = [hi.run_id, first.run_id, *(h.run_id for h in limited)]
    assert all(scheduled(run_id) for run_id in delayed)

    scheduler.wait_for("the scheduler to move the delayed runs", moved(delayed))
    # Moved to the queue: still the same run for the same key.
    after_move = jobs.unique_sync.enqueue(tenant="t1", invoice_id=7, note="third")
    assert after_move.deduplicated and after_move.run_id == first.run_id
    field = fair_field(redis_conn, hi.run_id)  # checked last: the behaviour comes first
    work()

    t1_order = [tag for tag, _ in attempt_order({jobs.probe.name}) if tag]
    assert t1_order[0] == "delayed-hi", t1_order
    times = start_times(jobs.rate_probe.name)
    assert len(times) == 12
    assert most_in_any_window(times, 0.95) <= 5, times
    assert [(p.tag, p.note) for p in probes("t1") if p.tag == "unique-7"] == [("unique-7", "first")]
    mine = JobRun.objects.filter(pk__in=delayed)
    assert set(mine.values_list("status", flat=True)) == {RunStatus.SUCCEEDED}
    assert set(mine.values_list("attempts", flat=True)) == {1}
    assert field[2:3] == [5]


def test_a_retry_moved_by_rqscheduler_keeps_its_priority_and_rate_windows(
    scheduler: RunningScheduler, redis_conn: Any
) -> None:
    """``flow_retried`` (rate_limit="3/s", one retry after a fixed 1 s backoff) enqueued at
    priority 6 fails its first attempt; its retry waits in rq-scheduler's set while a t1
    backlog at priority 0 is queued. After the scheduler moved the retry, its message still
    carries level 6 and the job's window, and it starts before the backlog queued ahead of it.

    Proven able to fail: with ``transport.current_priority`` returning None (a retry pushed
    at the job's own level) the retry is level 0 and starts after the backlog; with the fair
    field dropped on the move, likewise."""
    for i in range(5):
        jobs.probe.enqueue(tenant="t1", tag=f"low{i}")
    handle = jobs.flow_retried.using(priority=6).enqueue(tenant="t1", tag="retry-hi")
    work_some(1)  # level 6 first: the first attempt, which fails; the backlog stays queued
    run = JobRun.objects.get(pk=handle.run_id)
    assert (run.status, run.attempts) == (RunStatus.QUEUED, 1)
    assert JobAttempt.objects.count() == 1
    scheduler.wait_for("the scheduler to move the retry", moved([handle.run_id]))
    field = fair_field(redis_conn, handle.run_id)
    work()

    order = attempt_order({jobs.probe.name, jobs.flow_retried.name})
    assert order[:2] == [("retry-hi", 1), ("retry-hi", 2)], order
    assert JobRun.objects.get(pk=handle.run_id).status == RunStatus.SUCCEEDED
    assert [p.note for p in probes("t1") if p.tag == "retry-hi"] == ["a1", "a2"]
    assert field[2:3] == [6] and [f"j:{jobs.flow_retried.name}", 3, 1] in field[4]


def test_a_deferred_unique_run_holds_its_key_and_keeps_its_priority(
    scheduler: RunningScheduler, redis_conn: Any
) -> None:
    """A unique job enqueued at priority 4 defers itself for a second (``ctx.defer``): while
    its deferral waits in rq-scheduler's set, and after the scheduler moved it, an enqueue of
    the same key returns the deferred run; the resumed attempt starts before a t1 backlog
    queued during the deferral, and the work is done once.

    Proven able to fail: with ``deferred`` left out of the statuses that hold a unique key
    (``unique._ACTIVE``) the enqueue during the deferral does not return the deferred run;
    with the fair field dropped on the move, the resumed attempt starts behind the backlog."""
    job = jobs.flow_unique_defers
    for i in range(4):
        jobs.probe.enqueue(tenant="t1", tag=f"low{i}")
    handle = job.using(priority=4).enqueue(tenant="t1", invoice_id=3, tag="d3")
    work_some(1)  # level 4 first: the attempt that defers; the backlog stays queued
    assert JobRun.objects.get(pk=handle.run_id).status == RunStatus.DEFERRED
    during = job.enqueue(tenant="t1", invoice_id=3, tag="d3")
    assert during.deduplicated and during.run_id == handle.run_id
    scheduler.wait_for("the scheduler to move the deferral", moved([handle.run_id]))
    moved_again = job.enqueue(tenant="t1", invoice_id=3, tag="d3")
    assert moved_again.deduplicated and moved_again.run_id == handle.run_id
    field = fair_field(redis_conn, handle.run_id)
    work()

    order = attempt_order({jobs.probe.name, job.name})
    assert [tag for tag, _ in order[:2]] == ["d3", "d3"], order
    assert JobRun.objects.filter(job_name=job.name).count() == 1
    assert JobRun.objects.get(pk=handle.run_id).status == RunStatus.SUCCEEDED
    assert [p.note for p in probes("t1") if p.tag == "d3"] == ["deferring", "resumed"]
    assert field[2:3] == [4]


def test_a_task_run_after_moved_by_rqscheduler_keeps_its_priority(
    scheduler: RunningScheduler, redis_conn: Any
) -> None:
    """A Django task with ``run_after`` waits in rq-scheduler's set; moved to the queue, its
    message keeps the task's priority (a kumiko level, not RQ's ``at_front``): priority 9
    starts before the t1 backlog queued ahead of it, priority -9 after it.

    Proven able to fail: with the fair field dropped on the move (as above) the urgent task
    is not the first start."""
    pytest.importorskip("django.tasks")
    from tests.testapp import tasks

    for i in range(3):
        jobs.probe.enqueue(tenant="t1", tag=f"low{i}")
    when = timezone.now() + timedelta(seconds=DUE)
    with schema_context("t1"):
        urgent = tasks.add.using(priority=9, run_after=when).enqueue(1, 1)
        last = tasks.add.using(priority=-9, run_after=when).enqueue(2, 2)
    scheduler.wait_for("the scheduler to move the tasks", moved([urgent.id, last.id]))
    fields = [fair_field(redis_conn, urgent.id), fair_field(redis_conn, last.id)]
    work()
    started = list(
        JobRun.objects.filter(schema_name="t1").order_by("started_at").values_list("pk", flat=True)
    )
    assert [pk.hex for pk in started[:1]] == [urgent.id]
    assert [pk.hex for pk in started[-1:]] == [last.id]
    assert [p.tag for p in probes("t1") if p.tag.startswith("add")] == ["add 1+1", "add 2+2"]
    assert [f[2:3] for f in fields] == [[9], [-9]]


# --- cron ticks and pauses -----------------------------------------------------------------


def test_cron_ticks_of_a_paused_job_wait_and_each_runs_once_after_resume(
    scheduler: RunningScheduler,
) -> None:
    """``every_two_seconds`` (a system cron on "low") is paused while the scheduler rings it:
    its ticks are written and queued, none starts; after the resume every tick that fired
    runs exactly once (one run per tick, one attempt each, no tick twice).

    Proven able to fail: with paused jobs left out of the sets the dequeue script reads
    (``pausing.assert_pauses`` writing no jobs), the ticks run while paused."""
    job = jobs.every_two_seconds
    pauses.pause(job=job.name)
    queue = transport.get_queue(job.queue_name)
    scheduler.wait_for("three ticks to be queued", lambda: queue.count >= 3)
    work(job.queue_name)
    rows = JobRun.objects.filter(job_name=job.name)
    assert rows.exists() and set(rows.values_list("status", flat=True)) == {RunStatus.QUEUED}
    assert not JobAttempt.objects.filter(run__job_name=job.name).exists()
    resumed_at = timezone.now()
    pauses.resume(job=job.name)
    scheduler.stop()  # no more ticks: what fired is what must run
    work(job.queue_name)

    ticks = rows.count()  # one row per tick: a tick's run id is derived from its second
    assert ticks >= 3
    assert set(rows.values_list("status", flat=True)) == {RunStatus.SUCCEEDED}
    assert set(rows.values_list("attempts", flat=True)) == {1}
    assert JobAttempt.objects.filter(run__job_name=job.name).count() == ticks
    paused_ones = rows.filter(queued_at__lt=resumed_at)
    assert paused_ones.count() >= 3
    assert all(r.started_at >= resumed_at for r in paused_ones)
    assert queue.count == 0


def test_a_paused_tenants_cron_tick_waits_and_runs_once_after_resume(
    scheduler: RunningScheduler,
) -> None:
    """``every_minute`` (a per-tenant cron) rung by the scheduler while t2 is paused: t1's and
    t3's children run, t2's waits queued; after the resume it runs, once. One parent for the
    tick, one effect per tenant.

    Proven able to fail: with paused tenants left out of the sets the dequeue script reads
    (``pausing.assert_pauses`` writing no tenants), t2's child runs while paused."""
    spec = cron_spec(jobs.every_minute)
    wait_for_room_in_this_minute()
    pauses.pause(tenant="t2")
    transport.register_cron(spec, first_delay=0)
    scheduler.wait_for("the tick to be queued", lambda: transport.queue_length(spec.queue) >= 1)
    work()
    work()  # the parent's fan-out pushes the children; they run in the second burst
    parents = JobRun.objects.filter(job_name=jobs.every_minute.name, schema_name="")
    assert parents.count() == 1
    children = JobRun.objects.filter(parent_run_id=parents.get().run_id)
    assert dict(children.values_list("schema_name", "status")) == {
        "t1": RunStatus.SUCCEEDED,
        "t2": RunStatus.QUEUED,
        "t3": RunStatus.SUCCEEDED,
    }
    assert probes("t2") == []
    pauses.resume(tenant="t2")
    work()
    assert set(children.values_list("status", flat=True)) == {RunStatus.SUCCEEDED}
    assert set(children.values_list("attempts", flat=True)) == {1}
    for schema in TENANTS:
        assert [(p.tag, p.note) for p in probes(schema)] == [("cron", "cron")]
    assert parents.count() == 1


def test_delayed_runs_of_a_paused_queue_wait_after_the_move_and_run_in_order(
    scheduler: RunningScheduler,
) -> None:
    """The default queue is paused while three delayed runs and a paused-job-in-tenant's run
    wait in rq-scheduler's set; moved to the queue, none starts; after the queue's resume the
    runs of the job paused in t1 still wait, the others run in order, and after the last
    resume the held one runs once.

    Proven able to fail: with paused queues left out of the dequeue's sets
    (``pausing.assert_pauses`` writing no queues) the runs start while the queue is paused."""
    mine_jobs = {jobs.probe.name, jobs.list_tags.name}  # not the cron ticks the scheduler rings
    pauses.pause(queue="default")
    pauses.pause(job=jobs.list_tags.name, tenant="t1")
    handles = [jobs.probe.enqueue_in(DUE, tenant="t1", tag=f"q{i}") for i in range(3)]
    held = jobs.list_tags.enqueue_in(DUE, tenant="t1", tag="held")
    scheduler.wait_for("the scheduler to move them", moved([*(h.run_id for h in handles)]))
    scheduler.wait_for("the scheduler to move the held one", moved([held.run_id]))
    work()
    assert not JobAttempt.objects.filter(run__job_name__in=mine_jobs).exists()
    pauses.resume(queue="default")
    work()
    assert [tag for tag, _ in attempt_order(mine_jobs)] == ["q0", "q1", "q2"]
    assert JobRun.objects.get(pk=held.run_id).status == RunStatus.QUEUED
    pauses.resume(job=jobs.list_tags.name, tenant="t1")
    work()
    assert [tag for tag, _ in attempt_order(mine_jobs)] == ["q0", "q1", "q2", "held"]
    mine = JobRun.objects.filter(pk__in=[held.run_id, *(h.run_id for h in handles)])
    assert set(mine.values_list("attempts", flat=True)) == {1}
