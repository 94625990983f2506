"""Two real ``manage.py rqscheduler`` processes at once move a due cron tick exactly once.

Both schedulers poll every second against the test Redis database. kumiko's cron alarm for
``testapp.every_minute`` is registered due now, exactly as ``sync_schedules`` builds it (so the
schedulers' own sync at start-up leaves it as it is), once both schedulers are up. rq-scheduler's
lock lets only one of them ring it; the ringer writes the tick's run, pushes its message and
re-schedules the alarm for the next minute (a second ring of the same tick would find the run
and push nothing). A worker then runs the single tick: one parent run and one child per tenant.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import pytest

from kumiko_jobs import transport
from kumiko_jobs.enqueueing.schedules import cron_spec
from kumiko_jobs.models import JobRun, RunStatus
from tests.conftest import ROOT, TENANTS, probes, work, worker_env
from tests.testapp import jobs

pytestmark = pytest.mark.usefixtures("live_db")

DEADLINE = 15.0  # seconds any one wait may take before the test gives up
WATCH = 3.0  # seconds both schedulers keep polling after the tick was moved
# Everything from the schedulers' start to the end of WATCH must happen within one minute, or
# the next "* * * * *" tick would legitimately be moved as well.
MINUTE_MARGIN = 2 * DEADLINE + WATCH


def start_rqscheduler(log: IO[str]) -> subprocess.Popen[str]:
    """``manage.py rqscheduler --interval 1``, as the docs tell operators to start it."""
    return subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), "rqscheduler", "--interval", "1"],
        cwd=ROOT,
        env=worker_env(),
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
    )


def wait_until(condition: Callable[[], bool], what: str, logs: Callable[[], str]) -> None:
    deadline = time.monotonic() + DEADLINE
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"gave up waiting for {what}\n{logs()}")
        time.sleep(0.1)


def live_schedulers(redis_conn: Any) -> int:
    """rq-scheduler instances that registered their birth and not yet their death."""
    keys = redis_conn.keys(b"rq:scheduler_instance:*")
    return sum(1 for key in keys if not redis_conn.hexists(key, "death"))


def wait_for_room_in_this_minute() -> None:
    """Start early enough in a minute that its end cannot fall inside the test."""
    into_minute = time.time() % 60
    if 60 - into_minute < MINUTE_MARGIN:
        time.sleep(60 - into_minute + 0.5)


def test_two_rqschedulers_move_a_due_cron_tick_once(tenants, redis_conn, tmp_path: Path):
    spec = cron_spec(jobs.every_minute)
    wait_for_room_in_this_minute()
    log_paths = [tmp_path / f"rqscheduler-{i}.log" for i in (1, 2)]
    log_files = [path.open("w") for path in log_paths]
    schedulers = [start_rqscheduler(log) for log in log_files]

    def logs() -> str:
        for log in log_files:
            log.flush()
        return "\n".join(f"--- {p.name}\n{p.read_text()}" for p in log_paths)

    try:
        # Both have synced kumiko's schedules (Scheduler.run does it first) and are polling.
        wait_until(lambda: live_schedulers(redis_conn) == 2, "both schedulers to start", logs)
        assert all(proc.poll() is None for proc in schedulers), logs()
        assert transport.queue_length(spec.queue) == 0

        transport.register_cron(spec, first_delay=0)
        wait_until(lambda: transport.queue_length(spec.queue) >= 1, "the tick to be queued", logs)
        # Let both go on polling for a few rounds: neither moves the tick a second time.
        time.sleep(WATCH)
        assert all(proc.poll() is None for proc in schedulers), logs()
        queue = transport.get_queue(spec.queue)
        # One tick message (the tick's own run, not the alarm), written once.
        assert len(queue.job_ids) == 1 and queue.job_ids[0] != spec.schedule_id, logs()
        # rq-scheduler put the cron entry back, for the next minute, unchanged.
        due = redis_conn.zscore("rq:scheduler:scheduled_jobs", spec.schedule_id)
        assert due is not None and due > time.time(), logs()
        assert transport.cron_entries()[spec.schedule_id] == spec
    finally:
        for proc in schedulers:
            proc.terminate()  # rq-scheduler registers its death and drops its lock on SIGTERM
        for proc in schedulers:
            try:
                proc.wait(timeout=DEADLINE)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for log in log_files:
            log.close()

    work()
    work()
    parents = JobRun.objects.filter(job_name="testapp.every_minute", schema_name="")
    assert parents.count() == 1
    parent = parents.get()
    assert parent.trigger == "cron" and parent.status == RunStatus.SUCCEEDED
    children = JobRun.objects.filter(parent_run_id=parent.run_id)
    assert sorted(children.values_list("schema_name", flat=True)) == list(TENANTS)
    assert set(children.values_list("status", flat=True)) == {RunStatus.SUCCEEDED}
    for schema in TENANTS:
        assert [(p.tag, p.note) for p in probes(schema)] == [("cron", "cron")]
