"""WORKER_CONCURRENCY: several runs at once in one worker process (kumiko_jobs/worker/slots.py).

Real ``manage.py rqworker`` processes (as in test_reliability.py, with its fast liveness
settings) started with ``KUMIKO_JOBS_WORKER_CONCURRENCY``; real PostgreSQL and Redis. Every
wait has a deadline far below the jobs' timeouts; no test asserts how long anything took.

Calibrated: with ``KUMIKO_JOBS_WORKER_CONCURRENCY=1`` the first test never sees its four runs
running at once (it fails waiting); with the slots' timeout taken out (``SiblingSlot``'s
``death_penalty_class`` set back to ``FinalTimeout``) the sibling's timeout test fails
(SIGALRM cannot be armed outside the main thread, and the run is not recorded timed out).
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rq import Worker as RQWorker
from rq.registry import StartedJobRegistry

from bench import soak
from kumiko_jobs import transport
from kumiko_jobs.core import conf
from kumiko_jobs.models import JobAttempt, JobRun, RunStatus
from tests.conftest import work, worker_env
from tests.integration.test_reliability import DEADLINE, Workers, attempts_of, effects, status
from tests.testapp import jobs

pytestmark = pytest.mark.usefixtures("live_db")


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Workers]:
    pool = Workers(tmp_path)
    yield pool
    pool.stop_all()


def _slotted(count: int) -> dict[str, str]:
    env = worker_env()
    env[conf.CONCURRENCY_ENV] = str(count)
    return env


def _sleepers(count: int, seconds: float, tag: str) -> list[Any]:
    schemas = ["t1", "t2", "t3"]
    return [
        soak.job("soak.sleeper").enqueue(
            tenant=schemas[n % len(schemas)], tag=f"{tag}{n}", seconds=seconds
        )
        for n in range(count)
    ]


def _all_running(handles: list[Any]) -> bool:
    return all(status(h.run_id) == RunStatus.RUNNING for h in handles)


def test_four_slots_run_four_runs_at_once_and_rq_sees_each(tenants, workers, redis_conn):
    handles = _sleepers(4, 60, "slot")
    victim = workers.start(env=_slotted(4))
    workers.wait_for("four runs at once", lambda: _all_running(handles))

    # RQ's own bookkeeping: every run in flight is in the started registry, and each is the
    # current job of one registered worker (the process's four slots).
    started = set(StartedJobRegistry("default", connection=redis_conn).get_job_ids())
    rq_ids = {JobRun.objects.get(pk=h.run_id).rq_job_id for h in handles}
    assert rq_ids <= started
    current = {w.get_current_job_id() for w in RQWorker.all(connection=redis_conn)}
    assert rq_ids <= current
    names = {w.name for w in RQWorker.all(connection=redis_conn)}
    assert len(names) == 4 and sum(".s" in n for n in names) == 3

    # Killed with four runs in flight: none is lost, none stays running.
    victim.send_signal(signal.SIGKILL)
    assert victim.wait() == -signal.SIGKILL
    workers.start(env=_slotted(4))  # the survivor sweeps and runs the retries
    workers.wait_for(
        "every retry to succeed",
        lambda: all(status(h.run_id) == RunStatus.SUCCEEDED for h in handles),
    )
    for n, h in enumerate(handles):
        assert attempts_of(h.run_id) == [(1, "failed", "Abandoned"), (2, "succeeded", "")]
        schema = ["t1", "t2", "t3"][n % 3]
        assert f"slot{n} a2 {schema}" in effects(schema, "sleeper")


def test_warm_shutdown_waits_for_every_slot(tenants, workers):
    handles = _sleepers(3, 3, "warm")
    proc = workers.start(env=_slotted(3))
    workers.wait_for("three runs at once", lambda: _all_running(handles))
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(DEADLINE) == 0
    for h in handles:
        run = JobRun.objects.get(pk=h.run_id)
        assert (run.status, run.attempts) == (RunStatus.SUCCEEDED, 1)


def test_cold_shutdown_leaves_every_slots_run_to_the_sweep(tenants, workers):
    import time

    handles = _sleepers(2, 60, "cold")
    proc = workers.start(env=_slotted(2))
    workers.wait_for("two runs at once", lambda: _all_running(handles))
    proc.send_signal(signal.SIGTERM)
    time.sleep(1.5)  # RQ ignores a second signal within one second of the first
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(DEADLINE) == 1
    assert _all_running(handles)  # nothing recorded: a crash
    workers.start(env=_slotted(2))
    workers.wait_for(
        "the retries", lambda: all(status(h.run_id) == RunStatus.SUCCEEDED for h in handles)
    )
    for h in handles:
        assert attempts_of(h.run_id) == [(1, "failed", "Abandoned"), (2, "succeeded", "")]


def _marks(path: Path) -> list[tuple[int, str, float]]:
    lines = [line.split(" ") for line in path.read_text().splitlines()]
    return [(int(a), " ".join(rest[:-1]), float(rest[-1])) for a, *rest in lines]


def test_a_timeout_in_a_sibling_slot_is_final(tenants, tmp_path, monkeypatch):
    """Two overrunning runs at once in a 2-slot in-process worker: one of them in the sibling
    slot (they overlap), whose timeout is the slot's timer. Each catches the timeout and goes
    on; each is recorded timed out all the same, and its SQL after the timeout is refused."""
    monkeypatch.setenv(conf.CONCURRENCY_ENV, "2")
    paths = [tmp_path / "a.marks", tmp_path / "b.marks"]
    handles = [
        jobs.overruns.enqueue(tenant=t, tag=f"over-{t}", marks=str(p), seconds=3)
        for t, p in zip(("t1", "t2"), paths, strict=True)
    ]
    work()
    a, b = (_marks(p) for p in paths)
    first = [m for m in a if m[0] == 1], [m for m in b if m[0] == 1]
    # They ran at once: each first attempt started before the other's ended.
    assert first[0][0][2] < first[1][-1][2] and first[1][0][2] < first[0][-1][2]
    for handle, marks in zip(handles, first, strict=True):
        events = [event for _, event, _ in marks]
        assert "caught JobTimeoutException" in events
        assert "sql-refused" in events and "sql-ran" not in events
        attempt = JobAttempt.objects.get(run_id=handle.run_id, number=1)
        assert attempt.outcome == "retrying" and "exceeded its timeout" in attempt.error_message
        run = JobRun.objects.get(pk=handle.run_id)
        assert (run.status, run.attempts) == (RunStatus.SUCCEEDED, 2)


def test_one_slot_is_todays_worker(tenants, redis_conn):
    """The default (1): no sibling is made, the process registers one RQ worker."""
    assert conf.worker_concurrency() == 1
    jobs.probe.enqueue(tenant="t1", tag="one")
    work()
    assert transport.get_queue("default").count == 0
    assert RQWorker.all(connection=redis_conn) == []  # the burst worker left, alone


def test_mixed_tenants_in_four_slots_each_run_sees_only_its_own(tenants, monkeypatch):
    """Thirty runs over three tenants, four at once: each run writes in its own tenant and reads
    only its own tenant's rows, whichever slot (thread, connections, tenant login) ran it and
    whatever ran beside it. Calibrated: with the siblings handed the main thread's Django
    connections (one connection shared by the slots), runs fail or see the wrong schema."""
    from tests.conftest import probes

    monkeypatch.setenv(conf.CONCURRENCY_ENV, "4")
    schemas = ["t1", "t2", "t3"]
    handles = [
        jobs.list_tags.enqueue(tenant=schemas[n % 3], tag=f"{schemas[n % 3]}-{n}")
        for n in range(30)
    ]
    work()
    assert {JobRun.objects.get(pk=h.run_id).status for h in handles} == {RunStatus.SUCCEEDED}
    for schema in schemas:
        rows = probes(schema)
        assert len(rows) == 10
        for row in rows:
            assert row.schema_seen == schema
            seen = [tag for tag in row.note.split(",") if tag]
            assert all(tag.startswith(f"{schema}-") for tag in seen), (schema, seen)
