"""Dead workers noticed fast, live slow ones never (issue 28).

A killed worker's run restarts within ``WORKER_DEAD_AFTER`` + ``WORKER_HEARTBEAT`` seconds: every
long-running worker's maintenance thread looks each beat for a worker whose beat key Redis
expired (``transport.vanished_workers``) and sweeps at once (``maintenance.sweep_if_dead``),
instead of waiting for the next ``MAINTENANCE_INTERVAL`` round. The timing itself is measured in
bench/dead_worker.py; these tests assert the mechanism: the bound is the key's TTL (Redis's
clock), an expired key makes the sweep hand the run back at once, a key that is still there never
does, and a real worker with a body three times longer than ``WORKER_DEAD_AFTER`` is not swept
however often anyone looks. No assertion is on how long anything took.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.test import override_settings
from django.utils import timezone

from bench import soak
from kumiko_jobs import transport
from kumiko_jobs.models import JobRun, RunStatus
from kumiko_jobs.transport import JsonJob
from kumiko_jobs.transport import keys as transport_keys
from kumiko_jobs.worker.maintenance import sweep_if_dead
from kumiko_jobs.worker.sweep import sweep_abandoned
from tests.chaos.workers import Processes, chaos_settings
from tests.integration.test_reliability import attempts_of, effects, status
from tests.testapp import jobs

pytestmark = pytest.mark.usefixtures("live_db")


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Processes]:
    pool = Processes(tmp_path)
    yield pool
    pool.stop_all()


DEAD_AFTER = 2


def _running(handle: Any, rq_job_id: str, worker: str, started_ago: float) -> None:
    """The run as its worker left it: running attempt 1, the message taken by ``worker``."""
    JobRun.objects.filter(pk=handle.run_id).update(
        status=RunStatus.RUNNING,
        attempts=1,
        started_at=timezone.now() - timedelta(seconds=started_ago),
        rq_job_id=rq_job_id,
    )
    transport.connection_for("default").hset(JsonJob.key_for(rq_job_id), "worker_name", worker)


@override_settings(KUMIKO_JOBS=chaos_settings(WORKER_HEARTBEAT=1, WORKER_DEAD_AFTER=DEAD_AFTER))
def test_an_expired_beat_key_makes_the_next_look_sweep_its_run(tenants, redis_conn):
    """Before the key expires the look does nothing (however old the run); once Redis expired it
    (deleting it is the same state), the next look sweeps and the run is queued for attempt 2.

    Proved able to fail: with ``sweep_if_dead`` returning False unconditionally the second look
    sweeps nothing and the run stays running.
    """
    transport.get_queue("default").empty()
    redis_conn.set(transport_keys.WORKERS_SINCE_KEY, time.time() - 100)  # liveness is known
    handle = jobs.flaky.enqueue(tenant="t1", tag="dead", fail_times=0)
    job_id = f"kj-{handle.run_id.replace('-', '')}-a1-d0-g0"
    _running(handle, job_id, "victim", started_ago=60)
    transport.beat(redis_conn, "victim", job_id, DEAD_AFTER)
    # The bound: Redis drops the key DEAD_AFTER s after the last beat, whoever's clock is late.
    assert 0 < redis_conn.pttl(transport_keys.WORKER_KEY + "victim") <= DEAD_AFTER * 1000

    assert transport.vanished_workers(redis_conn) == []
    assert sweep_if_dead(redis_conn, "observer", 1) is False
    assert status(handle.run_id) == RunStatus.RUNNING

    redis_conn.delete(transport_keys.WORKER_KEY + "victim")  # what the TTL does DEAD_AFTER s later
    assert transport.vanished_workers(redis_conn) == ["victim"]
    assert sweep_if_dead(redis_conn, "observer", 1) is True
    run = JobRun.objects.get(pk=handle.run_id)
    assert (run.status, run.attempts, run.error_type) == (RunStatus.QUEUED, 1, "Abandoned")
    assert "stopped (no liveness for 2 s)" in (run.error_message or "")
    # The sweep dropped the dead name: the next look has nothing to do.
    assert transport.vanished_workers(redis_conn) == []
    assert sweep_if_dead(redis_conn, "observer", 1) is False


@override_settings(KUMIKO_JOBS=chaos_settings(WORKER_HEARTBEAT=1, WORKER_DEAD_AFTER=DEAD_AFTER))
def test_one_worker_sweeps_per_beat_however_many_look(tenants, redis_conn):
    redis_conn.set(transport_keys.WORKERS_SINCE_KEY, time.time() - 100)
    redis_conn.sadd(transport_keys.LIVE_WORKERS, "gone")  # its key already expired
    looks = [sweep_if_dead(redis_conn, f"w{i}", 30) for i in range(5)]
    assert looks == [True, False, False, False, False]


def _live_settings(**extra: Any) -> dict[str, Any]:
    return {"WORKER_HEARTBEAT": 1, "WORKER_DEAD_AFTER": DEAD_AFTER, **extra}


def test_a_live_worker_with_a_slow_body_is_never_swept(tenants, workers: Processes, redis_conn):
    """A real worker runs a body three times WORKER_DEAD_AFTER long; its beat thread keeps its
    key alive, so every look and every sweep meanwhile (here, as fast as this loop goes, on top
    of the worker's own) leaves the run alone: one attempt, one effect.

    Proved able to fail: with the beat thread returning after its first beat, the key expires
    during the body and the look sees the worker as vanished.
    """
    handle = soak.job("soak.sleeper").enqueue(tenant="t2", tag="slow", seconds=3 * DEAD_AFTER)
    with override_settings(KUMIKO_JOBS=chaos_settings(**_live_settings())):
        workers.start(overrides=_live_settings())
        workers.wait_for("the run to start", lambda: status(handle.run_id) == RunStatus.RUNNING)
        looks = 0
        while status(handle.run_id) == RunStatus.RUNNING:
            assert transport.vanished_workers(redis_conn) == []
            sweep_if_dead(redis_conn, "observer", 1)
            sweep_abandoned()
            looks += 1
            time.sleep(0.2)
    workers.wait_for("the run to end", lambda: status(handle.run_id) == RunStatus.SUCCEEDED)
    assert looks > 5  # the loop did look while the body ran
    assert attempts_of(handle.run_id) == [(1, "succeeded", "")]
    assert effects("t2", "sleeper") == ["slow a1 t2"]


def test_a_killed_workers_run_is_restarted_by_the_look_not_a_round(tenants, workers: Processes):
    """The survivor's maintenance rounds are an hour apart, so what hands the run back within
    the test's deadline is its per-beat look; its log says so.

    Proved able to fail: with ``sweep_if_dead`` returning False, the run stays running until the
    wait gives up.
    """
    overrides = _live_settings(MAINTENANCE_INTERVAL=3600)
    handle = soak.job("soak.sleeper").enqueue(tenant="t1", tag="killed", seconds=60)
    victim = workers.start(overrides=overrides)
    workers.wait_for("the run to start", lambda: status(handle.run_id) == RunStatus.RUNNING)
    workers.start(overrides=overrides, log_level="INFO")  # the survivor
    time.sleep(DEAD_AFTER + 1)  # its first beat must be old enough for liveness to be known
    victim.send_signal(signal.SIGKILL)
    assert victim.wait() == -signal.SIGKILL
    workers.wait_for("the retry to succeed", lambda: status(handle.run_id) == RunStatus.SUCCEEDED)
    assert attempts_of(handle.run_id) == [(1, "failed", "Abandoned"), (2, "succeeded", "")]
    assert effects("t1", "sleeper") == ["killed a2 t1"]
    assert "stopped beating; sweeping" in workers.logs()
