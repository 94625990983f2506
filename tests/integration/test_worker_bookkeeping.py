"""The kumiko worker's RQ bookkeeping, seen through RQ's own tools.

``transport.BookkeepingSimpleWorker`` writes RQ's keys in fewer round trips (one start and one
finish transaction, the worker's state only when it changes). Whatever an operator reads with
``rq info``, django-rq's pages (``django_rq.utils.get_statistics``) or RQ's registries must be
what RQ's own worker leaves there: the worker, its state and current job, the started job
while it runs, the finished job, its result and the worker's counters afterwards. Dependents
and ``rq suspend``, which RQ's finish and loop handle with extra reads, still work.

Real PostgreSQL, Redis and RQ worker; the observations are made by a job body while it runs.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import django_rq
import pytest
from rq import Queue, get_current_job
from rq import SimpleWorker as RQSimpleWorker
from rq.job import Job, JobStatus
from rq.registry import DeferredJobRegistry, FinishedJobRegistry, StartedJobRegistry
from rq.serializers import JSONSerializer
from rq.suspension import resume, suspend
from rq.worker import Worker as RQWorker

from kumiko_jobs import transport
from kumiko_jobs.models import JobRun, RunStatus
from kumiko_jobs.worker import Worker
from tests.conftest import ROOT, work

pytestmark = pytest.mark.usefixtures("live_db")

JOB_PREFIX = "bookkeeping"
# What a job body saw of RQ's bookkeeping while it ran, by tag.
SEEN: dict[str, dict[str, Any]] = {}


@pytest.fixture(autouse=True)
def _forget_observations() -> Iterator[None]:
    SEEN.clear()
    yield
    SEEN.clear()


def _rq_info(connection: Any) -> str:
    """``rq info`` (RQ's own command-line monitor) on the test Redis database."""
    kwargs = connection.connection_pool.connection_kwargs
    url = f"redis://{kwargs['host']}:{kwargs['port']}/{kwargs['db']}"
    done = subprocess.run(
        [os.path.join(os.path.dirname(sys.executable), "rq"), "info", "--url", url, "-S", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        check=True,
    )
    return done.stdout


def observes_rq(ctx: Any, *, tag: str) -> str:
    job = get_current_job()
    assert job is not None
    conn = job.connection
    queue = Queue(job.origin, connection=conn, serializer=JSONSerializer)
    stored = Job.fetch(job.id, connection=conn, serializer=JSONSerializer)
    stats = next(q for q in django_rq.utils.get_statistics()["queues"] if q["name"] == queue.name)
    SEEN[tag] = {
        "job_id": job.id,
        "started": StartedJobRegistry(queue=queue).get_job_ids(),
        "status": stored.get_status(),
        "worker_name": stored.worker_name,
        "started_at": stored.started_at,
        "workers": {
            w.name: (w.get_state(), w.get_current_job_id()) for w in RQWorker.all(queue=queue)
        },
        "intermediate": [x.decode() for x in conn.lrange(queue.intermediate_queue_key, 0, -1)],
        "stats": stats,
        "rq_info": _rq_info(conn) if tag == "with-rq-info" else "",
    }
    return tag


def test_while_a_job_runs_rq_s_tools_show_the_busy_worker_and_the_started_job(tenants, declare):
    job = declare(observes_rq)
    handle = job.enqueue(tenant="t1", tag="with-rq-info")
    queue = transport.get_queue("default")
    worker = Worker([queue], connection=queue.connection)
    worker.work(burst=True)
    assert JobRun.objects.get(pk=handle.run_id).status == RunStatus.SUCCEEDED

    seen = SEEN["with-rq-info"]
    rq_job_id = seen["job_id"]
    assert seen["started"] == [rq_job_id]  # StartedJobRegistry
    assert seen["status"] == JobStatus.STARTED
    assert seen["worker_name"] == worker.name and seen["started_at"] is not None
    assert seen["workers"] == {worker.name: ("busy", rq_job_id)}  # RQ's Worker.all()
    assert seen["intermediate"] == []  # taken out of the intermediate queue with the start
    # django-rq's statistics (its queue page and the stats API read this)
    assert (seen["stats"]["workers"], seen["stats"]["started_jobs"]) == (1, 1)
    assert seen["stats"]["finished_jobs"] == 0
    # rq info: the queue has one job executing, and the worker is listed busy on it
    info = seen["rq_info"]
    assert re.search(r"^default +\| 0, 1 executing, 0 finished, 0 failed$", info, re.M), info
    assert re.search(rf"^{worker.name} \(.*\): busy default\. jobs: 0 finished", info, re.M), info


def test_after_the_jobs_rq_s_tools_show_them_finished_and_the_worker_idle(tenants, declare):
    job = declare(observes_rq)
    handles = [job.enqueue(tenant="t1", tag=f"after-{i}") for i in range(3)]
    queue = transport.get_queue("default")
    worker = Worker([queue], connection=queue.connection)
    # Not a burst: the worker stays registered, as a running rqworker does.
    worker.work(max_jobs=3)
    assert all(JobRun.objects.get(pk=h.run_id).status == RunStatus.SUCCEEDED for h in handles)
    conn = queue.connection

    ids = [SEEN[f"after-{i}"]["job_id"] for i in range(3)]
    assert sorted(FinishedJobRegistry(queue=queue).get_job_ids()) == sorted(ids)
    assert StartedJobRegistry(queue=queue).get_job_ids() == []
    for job_id in ids:
        stored = Job.fetch(job_id, connection=conn, serializer=JSONSerializer)
        assert stored.get_status() == JobStatus.FINISHED
        assert stored.ended_at is not None and stored.started_at is not None
        assert stored.ended_at >= stored.started_at
        assert stored.last_heartbeat is not None and stored.last_heartbeat >= stored.started_at
        assert stored.worker_name == worker.name
        result = stored.latest_result()  # django-rq's job page shows it
        assert result is not None and result.type == result.Type.SUCCESSFUL
        assert conn.ttl(stored.key) > 0  # expires after RESULT_TTL, as RQ's finish sets it

    # The worker after max_jobs has registered its death; what its hash said before that is
    # what RQ's own worker leaves: idle, three successes, working time counted.
    fields = {k.decode(): v.decode() for k, v in conn.hgetall(worker.key).items()}
    assert fields["state"] == "idle"
    assert fields["successful_job_count"] == "3"
    assert float(fields["total_working_time"]) > 0
    assert "death" in fields
    stats = next(q for q in django_rq.utils.get_statistics()["queues"] if q["name"] == "default")
    assert (stats["finished_jobs"], stats["started_jobs"], stats["jobs"]) == (3, 0, 0)


def test_a_registered_worker_between_jobs_is_listed_idle_by_rq_info(tenants, declare):
    job = declare(observes_rq)
    job.enqueue(tenant="t1", tag="one")
    queue = transport.get_queue("default")
    worker = Worker([queue], connection=queue.connection)
    worker.register_birth()
    try:
        # One message through the worker's own loop steps, as rqworker runs them.
        result = worker.dequeue_job_and_maintain_ttl(None)
        assert result is not None
        worker.execute_job(*result)
        worker.heartbeat()
        info = _rq_info(queue.connection)
        assert re.search(r"^default +\| 0, 0 executing, 1 finished, 0 failed$", info, re.M), info
        pattern = rf"^{worker.name} \(.*\): idle default\. jobs: 1 finished, 0 failed$"
        assert re.search(pattern, info, re.M), info
        stored = RQWorker.find_by_key(worker.key, connection=queue.connection)
        assert stored is not None and stored.get_state() == "idle"
        assert stored.successful_job_count == 1
    finally:
        worker.register_death()


# --- dependents: RQ's finish moves them; kumiko's reads their count in the finish ----------------


def plain_dependent(marker: str) -> str:
    """A plain RQ job (not a kumiko message) that depends on a kumiko message."""
    return marker


def enqueues_a_dependent(ctx: Any, *, tag: str) -> None:
    job = get_current_job()
    assert job is not None
    low = Queue("low", connection=job.connection, serializer=JSONSerializer)
    dependent = low.enqueue(
        f"{__name__}.plain_dependent", tag, depends_on=job.id, job_id=f"dependent-{tag}"
    )
    SEEN[tag] = {"status_while_running": dependent.get_status()}


def test_a_dependent_added_while_the_job_runs_is_enqueued_when_it_finishes(tenants, declare):
    job = declare(enqueues_a_dependent)
    handle = job.enqueue(tenant="t1", tag="dep")
    work()
    assert JobRun.objects.get(pk=handle.run_id).status == RunStatus.SUCCEEDED
    # Calibration: while the parent ran, RQ deferred the dependent (the finish has work to do).
    assert SEEN["dep"]["status_while_running"] == JobStatus.DEFERRED
    low = transport.get_queue("low")
    assert low.job_ids == ["dependent-dep"]
    assert DeferredJobRegistry(queue=low).get_job_ids() == []
    RQSimpleWorker([low], connection=low.connection, serializer=JSONSerializer).work(burst=True)
    dependent = Job.fetch("dependent-dep", connection=low.connection, serializer=JSONSerializer)
    assert dependent.get_status() == JobStatus.FINISHED and dependent.return_value() == "dep"


def test_a_dependent_enqueued_after_the_job_finished_is_enqueued_at_once(tenants, declare):
    job = declare(observes_rq)
    job.enqueue(tenant="t1", tag="parent")
    work()
    low = transport.get_queue("low")
    low.enqueue(
        f"{__name__}.plain_dependent",
        "late",
        depends_on=SEEN["parent"]["job_id"],
        job_id="dependent-late",
    )
    assert low.job_ids == ["dependent-late"]


# --- rq suspend ---------------------------------------------------------------------------------


def suspends_workers(ctx: Any, *, tag: str, suspend_now: bool) -> None:
    job = get_current_job()
    assert job is not None
    if suspend_now:
        suspend(job.connection)
    SEEN[tag] = {}


@pytest.mark.parametrize("suspend_now", [True, False], ids=["suspended", "calibration"])
def test_rq_suspend_during_a_message_stops_the_burst_before_the_next(
    tenants, declare, redis_conn, suspend_now
):
    job = declare(suspends_workers)
    for i in range(3):
        job.enqueue(tenant="t1", tag=f"s{i}", suspend_now=suspend_now and i == 0)
    try:
        work()
    finally:
        resume(redis_conn)
    # RQ's burst worker quits when it finds workers suspended, before taking another message;
    # the answer kumiko's worker read with the first message's finish is the one it acts on.
    expected = ["s0"] if suspend_now else ["s0", "s1", "s2"]
    assert sorted(SEEN) == expected
    assert transport.queue_length("default") == 3 - len(expected)


# --- RQ's start, written by the dequeue script (transport/rq_start.py) --------------------------


def _start_shape(job: Job) -> dict[str, Any]:
    """What RQ's start left in Redis for ``job``, seen from its body: every key, field and TTL of
    the execution, its registries, the worker's hash and the job's hash, relative to the job's
    timeout and the clock (so that two workers' starts compare)."""
    conn = job.connection
    clock = int(conn.time()[0])
    (execution_key,) = conn.keys(f"rq:execution:{job.id}:*")
    execution_id = execution_key.decode().rsplit(":", 1)[1]
    execution = {k.decode(): v.decode() for k, v in conn.hgetall(execution_key).items()}
    worker_key = f"rq:worker:{execution['worker_name']}"
    worker_executions = f"{worker_key}:executions"
    registry = f"rq:executions:{job.id}"
    composite = f"{job.id}:{execution_id}"
    wip = StartedJobRegistry(queue=Queue(job.origin, connection=conn)).key
    names = ("timeout", "status", "started_at", "last_heartbeat", "worker_name")
    stored = dict(zip(names, (v.decode() for v in conn.hmget(job.key, names)), strict=True))
    timeout = int(stored["timeout"])

    def near(value: float) -> int:  # seconds relative to the job's timeout, to within a second
        return round(value - timeout)

    return {
        "execution_fields": sorted(execution),
        "execution_ids": (execution["id"], execution["job_id"]) == (execution_id, job.id),
        "execution_ttl": near(conn.ttl(execution_key)),
        "registry": [m.decode() for m in conn.zrange(registry, 0, -1)] == [execution_id],
        "registry_score": near(conn.zscore(registry, execution_id) - clock),
        "registry_ttl": near(conn.ttl(registry)),
        "started_score": near(conn.zscore(wip, composite) - clock),
        "worker_executions": conn.smembers(worker_executions) == {composite.encode()},
        "worker_executions_ttl": near(conn.ttl(worker_executions)),
        "worker_state": conn.hget(worker_key, "state"),
        "worker_ttl": near(conn.ttl(worker_key)),
        "worker_beat": conn.hget(worker_key, "last_heartbeat") is not None,
        "job_status": stored["status"],
        "job_started": stored["started_at"] == stored["last_heartbeat"] != "",
        "job_worker": stored["worker_name"] == execution["worker_name"],
        "job_ttl": conn.ttl(job.key),
        "intermediate": conn.lrange(
            Queue(job.origin, connection=conn).intermediate_queue_key, 0, 9
        ),
    }


def observes_start(ctx: Any, *, tag: str) -> str:
    job = get_current_job()
    assert job is not None
    SEEN[tag] = _start_shape(job)
    return tag


def plain_observes_start(tag: str) -> str:
    """The same observation in a plain RQ job, under RQ's own SimpleWorker (the calibration)."""
    job = get_current_job()
    assert job is not None
    SEEN[tag] = _start_shape(job)
    return tag


def test_the_dequeue_script_writes_rq_s_start_as_rq_s_own_worker_does(tenants, declare):
    """One round trip for the pick and the start (rq_start.py), and Redis holds what RQ's own
    SimpleWorker's start pipeline leaves: the same keys, fields and TTLs."""
    job = declare(observes_start)
    handle = job.enqueue(tenant="t1", tag="kumiko")
    work()
    assert JobRun.objects.get(pk=handle.run_id).status == RunStatus.SUCCEEDED
    queue = transport.get_queue("default")
    queue.enqueue(plain_observes_start, "rq", job_timeout=180, result_ttl=60)
    RQSimpleWorker([queue], connection=queue.connection, serializer=queue.serializer).work(
        burst=True
    )
    kumiko, rq = SEEN["kumiko"], SEEN["rq"]
    assert kumiko["execution_ids"] and kumiko["registry"] and kumiko["worker_executions"]
    assert kumiko["job_status"] == JobStatus.STARTED and kumiko["job_ttl"] == -1
    assert kumiko["worker_state"] == b"busy" and kumiko["intermediate"] == []
    assert kumiko == rq, {k: (kumiko[k], rq[k]) for k in kumiko if kumiko[k] != rq[k]}
