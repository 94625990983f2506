"""A timeout is final, and the next attempt never overlaps the previous one.

The job ``testapp.overruns`` (timeout 1 s) catches every ``Exception`` on its first attempt, RQ's
timeout included, and keeps going; it writes start/tick/end marks with its attempt number to a
file, so the tests compare what ran when through the job's own record, not through timings.
Workers are real ``manage.py rqworker`` processes of both classes, with the sweep running every
second and a timeout rule that would fire one second after the timeout.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings

from bench import soak
from kumiko_jobs.models import JobAttempt, JobRun, RunStatus
from kumiko_jobs.worker.sweep import sweep_abandoned
from tests.conftest import probes, work, worker_env
from tests.integration.test_reliability import (
    Workers,
    _liveness_data,
    _running,
    attempts_of,
    status,
)
from tests.testapp import jobs

pytestmark = pytest.mark.usefixtures("live_db")

WORKER_CLASSES = {
    "in-process": "kumiko_jobs.worker.Worker",
    "forking": "kumiko_jobs.worker.ForkingWorker",
}
# The sweep every second, with a timeout rule that would hand a run back 1 s after its timeout.
SWEEPING = {
    "WORKER_HEARTBEAT": 1,
    "WORKER_DEAD_AFTER": 3,
    "MAINTENANCE_INTERVAL": 1,
    "RELAY_GRACE": 2,
    "RUNNING_TIMEOUT_GRACE": 0,
}
TIMED_OUT = (1, "retrying", "JobTimeoutException")  # retried: the job has retries=1


class TimeoutWorkers(Workers):
    def start_class(self, kind: str, **extra: Any) -> subprocess.Popen[bytes]:
        env = worker_env()
        env[soak.SETTINGS_ENV] = json.dumps({**settings.KUMIKO_JOBS, **SWEEPING, **extra})
        env.setdefault("KUMIKO_LOG", "WARNING")
        argv = ("rqworker", "default", "--worker-class", WORKER_CLASSES[kind])
        return self.launch(argv, env, name="worker")


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[TimeoutWorkers]:
    pool = TimeoutWorkers(tmp_path)
    yield pool
    pool.stop_all()


def marks(path: Path) -> list[tuple[int, str, float]]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        attempt, *event, at = line.split()
        rows.append((int(attempt), " ".join(event), float(at)))
    return rows


def events(path: Path, attempt: int) -> list[str]:
    return [event for number, event, _ in marks(path) if number == attempt]


def assert_attempts_never_overlap(path: Path) -> None:
    """Every mark of an attempt comes after every mark of the attempts before it."""
    rows = marks(path)
    spans: dict[int, tuple[float, float]] = {}
    for attempt, _, at in rows:
        first, last = spans.get(attempt, (at, at))
        spans[attempt] = (min(first, at), max(last, at))
    ordered = sorted(spans.items())
    for (before, (_, ended)), (after, (started, _)) in itertools.pairwise(ordered):
        assert ended < started, f"attempt {after} started while attempt {before} ran: {rows}"


@pytest.mark.parametrize("kind", WORKER_CLASSES)
def test_a_swallowed_timeout_is_final_and_the_retry_waits_for_the_attempt(
    tenants, workers, tmp_path, kind
):
    """The first attempt swallows its timeout and goes on for 4 s: it is recorded as timed out
    (not succeeded), the sweep does not start the retry while it still runs (two workers are
    free to take it), and its writes after the timeout are refused."""
    path = tmp_path / "marks"
    handle = jobs.overruns.enqueue(tenant="t1", tag="swallowed", marks=str(path), seconds=4)
    workers.start_class(kind, TIMEOUT_KILL_AFTER=60)
    workers.start_class(kind, TIMEOUT_KILL_AFTER=60)
    workers.wait_for("the retry", lambda: status(handle.run_id) == RunStatus.SUCCEEDED)

    # Today's sweep handed the run back after 1 s: the retry ran while this went on.
    workers.wait_for("the first attempt's end", lambda: "end" in events(path, 1))
    assert_attempts_never_overlap(path)
    assert attempts_of(handle.run_id) == [TIMED_OUT, (2, "succeeded", "")]
    first = JobAttempt.objects.get(run_id=handle.run_id, number=1)
    assert "caught the timeout and went on (it returned)" in first.error_message
    attempt_1 = events(path, 1)
    assert "caught JobTimeoutException" in attempt_1 and attempt_1[-1] == "end"
    assert "sql-refused" in attempt_1 and "sql-ran" not in attempt_1
    assert [p.tag for p in probes("t1")] == []  # nothing written after the timeout


@pytest.mark.parametrize("kind", WORKER_CLASSES)
def test_a_job_that_will_not_stop_is_ended_soon_after_its_timeout(tenants, workers, tmp_path, kind):
    """The first attempt would swallow its timeout for 60 s. The in-process worker records it
    as timed out and exits; the forking worker kills its work horse and goes on. Either way it
    ends long before 10 times its timeout (counted in its own 0.1 s ticks), and the retry
    starts after it."""
    path = tmp_path / "marks"
    handle = jobs.overruns.enqueue(tenant="t2", tag="stuck", marks=str(path), seconds=60)
    first = workers.start_class(kind, TIMEOUT_KILL_AFTER=1)
    workers.wait_for(
        "the first attempt's record",
        lambda: JobAttempt.objects.filter(run_id=handle.run_id, number=1).exists(),
    )
    if kind == "in-process":
        assert first.wait(60) == 1  # it left, like a crash; a supervisor starts a new one
        workers.start_class(kind, TIMEOUT_KILL_AFTER=1)
    else:
        assert first.poll() is None  # the forking worker itself keeps serving
    workers.wait_for("the retry", lambda: status(handle.run_id) == RunStatus.SUCCEEDED)

    assert attempts_of(handle.run_id) == [TIMED_OUT, (2, "succeeded", "")]
    record = JobAttempt.objects.get(run_id=handle.run_id, number=1).error_message
    assert "still running 1 s after its timeout" in record
    attempt_1 = events(path, 1)
    assert "end" not in attempt_1  # it never stopped on its own
    assert attempt_1.count("tick") < 100  # 10 s of ticks; left alone it would tick 600 times
    assert_attempts_never_overlap(path)


@pytest.mark.parametrize(
    ("then", "why"), [("raise", "it raised ValueError instead"), ("defer", "it returned")]
)
def test_whatever_a_job_does_after_swallowing_its_timeout_it_timed_out(
    tenants, tmp_path, then, why
):
    path = tmp_path / "marks"
    handle = jobs.overruns.enqueue(tenant="t3", tag=then, marks=str(path), seconds=1.5, then=then)
    work()  # the in-process worker, in this process: the retry (no delay) runs in the burst
    assert attempts_of(handle.run_id) == [TIMED_OUT, (2, "succeeded", "")]
    first = JobAttempt.objects.get(run_id=handle.run_id, number=1)
    assert why in first.error_message
    run = JobRun.objects.get(pk=handle.run_id)
    assert (run.defer_count, run.status) == (0, RunStatus.SUCCEEDED)


@override_settings(KUMIKO_JOBS={**settings.KUMIKO_JOBS, **SWEEPING})
def test_the_timeout_rule_waits_while_a_kumiko_worker_still_executes_the_run(tenants, redis_conn):
    """Past its timeout and grace: a run a kumiko worker beats for is left alone until the
    beats stop; a run of a live RQ worker of another class (no beats) is handed back."""
    from kumiko_jobs import transport
    from kumiko_jobs.transport import keys as transport_keys

    transport.get_queue("default").empty()
    _liveness_data(redis_conn)
    live = jobs.overruns.enqueue(tenant="t1", tag="live", marks="-", seconds=0)
    foreign = jobs.overruns.enqueue(tenant="t1", tag="foreign", marks="-", seconds=0)
    live_job, foreign_job = (f"kj-{h.run_id}-a1-d0-g0" for h in (live, foreign))
    _running(live, live_job, "busy", started_ago=30)
    _running(foreign, foreign_job, "plain-rq", started_ago=30)
    prefix = transport.SimpleWorkerBase.redis_worker_namespace_prefix
    redis_conn.hset(prefix + "plain-rq", mapping={"birth": "then"})  # alive, no liveness beats
    redis_conn.hset(prefix + "busy", mapping={"birth": "then", "kumiko": "1"})
    redis_conn.set(transport_keys.WORKER_KEY + "busy", live_job, ex=30)
    redis_conn.sadd(transport_keys.LIVE_WORKERS, "busy")

    assert sweep_abandoned() == (1, 0)
    assert status(live.run_id) == RunStatus.RUNNING
    handed_back = JobRun.objects.get(pk=foreign.run_id)
    assert handed_back.status == RunStatus.QUEUED
    assert "running for more than 1 s" in handed_back.error_message

    redis_conn.delete(transport_keys.WORKER_KEY + "busy")  # its beats stopped: proof it is gone
    assert sweep_abandoned() == (1, 0)
    assert status(live.run_id) == RunStatus.QUEUED


@override_settings(KUMIKO_JOBS={**settings.KUMIKO_JOBS, **SWEEPING})
def test_without_liveness_the_timeout_rule_hands_back_only_runs_outside_rq(tenants, redis_conn):
    """Right after Redis lost its data no worker has beaten yet: an overdue run of an RQ
    message may still be running on a kumiko worker and waits; one executed outside RQ (a boot
    gate, no RQ job id) has nothing else to end it and is handed back."""
    _liveness_data(redis_conn, age=1)
    in_rq = jobs.overruns.enqueue(tenant="t2", tag="rq", marks="-", seconds=0)
    outside = jobs.overruns.enqueue(tenant="t2", tag="boot", marks="-", seconds=0)
    _running(in_rq, f"kj-{in_rq.run_id}-a1-d0-g0", "ghost", started_ago=30)
    _running(outside, "", "", started_ago=30)

    assert sweep_abandoned() == (1, 0)
    assert status(in_rq.run_id) == RunStatus.RUNNING
    assert status(outside.run_id) == RunStatus.QUEUED


def test_the_timeout_bounds_the_job_body_not_the_record_after_it(tenants):
    """The worker's death penalty arms RQ's alarm around the whole message; once the body is
    done the runner cancels it, so recording the outcome is never cut short by the timeout."""
    from kumiko_jobs import transport
    from kumiko_jobs.run import entry as runner
    from kumiko_jobs.run.state import Alarm
    from kumiko_jobs.worker.timeouts import FinalTimeout

    alarm = Alarm()  # the run's alarm: the only part of its state the timeout uses
    with FinalTimeout(1, transport.JobTimeout):
        with runner._final_timeout(alarm):
            pass  # the body returns at once
        time.sleep(1.5)  # where the outcome is recorded: past the timeout, not interrupted
    assert alarm.fired is None
