"""RQ's finish sent as one script (transport/rq_finish.py) leaves what the transaction left.

The worker's finish lets RQ's own code queue its commands on a pipeline, then sends them as the
arguments of one script instead of a ``MULTI``/``EXEC``. The claim is "the same commands, in the
same order, as atomic": checked here by running the same job once through the script and once
with the script switched off (the pipeline executed as the transaction it was), and comparing
every key the finish writes; and by the script's two edges, a server that forgot it
(``NOSCRIPT``) and a command that fails inside it.

Real PostgreSQL, Redis and RQ worker.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from redis.exceptions import ResponseError
from rq.job import Job, JobStatus
from rq.registry import FinishedJobRegistry, StartedJobRegistry
from rq.serializers import JSONSerializer

from kumiko_jobs import transport
from kumiko_jobs.models import JobRun, RunStatus
from kumiko_jobs.transport import rq_finish
from tests.conftest import work

pytestmark = pytest.mark.usefixtures("live_db")

JOB_PREFIX = "finish_script"

_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$|^\d{10}(\.\d+)?$")


def returns_a_value(ctx: Any, *, n: int) -> dict[str, int]:
    return {"n": n}


def _plain(value: bytes) -> str:
    """A stored value with what differs between two runs (times, ids) made comparable."""
    text = value.decode(errors="replace")
    return "<time>" if _TIME.match(text) else text


def _finish_shape(rq_job_id: str, run_id: str) -> dict[str, Any]:
    queue = transport.get_queue("default")
    conn = queue.connection
    job = Job.fetch(rq_job_id, connection=conn, serializer=JSONSerializer)
    stored = conn.hgetall(job.key)
    worker = stored[b"worker_name"].decode()
    ids = {rq_job_id: "<job>", run_id: "<run>", worker: "<worker>"}

    def same(text: str) -> str:
        for value, name in ids.items():
            text = text.replace(value, name)
        return text

    results = conn.xrange(f"rq:results:{rq_job_id}")
    worker_key = f"rq:worker:{worker}"
    return {
        # The payload (its signature and ids differ from run to run): there, and intact.
        "job": {
            k.decode(): "<payload>" if k in {b"data", b"description"} else same(_plain(v))
            for k, v in stored.items()
        },
        "payload": job.kwargs == {} and job.func_name == "kumiko_jobs.runner.execute",
        "job_ttl": round(conn.ttl(job.key), -1),
        "status": job.get_status(),
        "results": [
            {k.decode(): same(_plain(v)) for k, v in fields.items() if b"execution" not in k}
            for _id, fields in results
        ],
        "results_ttl": round(conn.ttl(f"rq:results:{rq_job_id}"), -1),
        "finished": rq_job_id in FinishedJobRegistry(queue=queue).get_job_ids(),
        "started": StartedJobRegistry(queue=queue).get_job_ids(),
        "executions": sorted(k.decode() for k in conn.keys(f"rq:execution*:{rq_job_id}*")),
        "worker_executions": conn.smembers(f"{worker_key}:executions"),
        "worker": {
            k.decode(): _plain(v)
            for k, v in conn.hgetall(worker_key).items()
            if k in {b"state", b"successful_job_count", b"failed_job_count"}
        },
        "worker_time": float(conn.hget(worker_key, "total_working_time") or 0) > 0,
        "done": [v.decode() for v in conn.lrange(f"kumiko:done:{run_id}", 0, -1)],
        "done_ttl": round(conn.ttl(f"kumiko:done:{run_id}"), -1),
        "fair_means": sorted(
            k.decode() for k in conn.hkeys("kumiko:fair:default:0:mean") if not k.startswith(b"~")
        ),
    }


def _run_one(job: Any, n: int) -> dict[str, Any]:
    handle = job.enqueue(tenant="t1", n=n)
    work()
    run = JobRun.objects.get(pk=handle.run_id)
    assert run.status == RunStatus.SUCCEEDED
    return _finish_shape(run.rq_job_id, handle.run_id)


def test_the_finish_script_leaves_what_the_transaction_leaves(tenants, declare, monkeypatch):
    job = declare(returns_a_value)
    by_script = _run_one(job, 1)
    transport.get_queue("default").connection.flushdb()
    # The calibration: the same finish as the MULTI/EXEC it replaced.
    monkeypatch.setattr(rq_finish, "_words", lambda pipeline: None)
    by_transaction = _run_one(job, 1)

    assert by_script["status"] == JobStatus.FINISHED and by_script["finished"]
    assert by_script["job"]["status"] == "finished" and by_script["started"] == []
    assert by_script["results"] and by_script["results"][0]["type"] == "1"
    assert by_script["executions"] == [] and by_script["worker_executions"] == set()
    assert by_script["worker"]["state"] == "idle" and by_script["worker_time"]
    assert by_script["done"] == ["1"] and by_script["fair_means"] == ["t1"]
    assert by_script["payload"] is True
    assert by_script == by_transaction, {
        k: (by_script[k], by_transaction[k]) for k in by_script if by_script[k] != by_transaction[k]
    } | {
        f"job.{k}": (v, by_transaction["job"].get(k))
        for k, v in by_script["job"].items()
        if by_transaction["job"].get(k) != v
    }


def test_a_server_that_forgot_the_script_loads_it_again(tenants, declare):
    job = declare(returns_a_value)
    first = _run_one(job, 1)
    transport.get_queue("default").connection.script_flush()
    second = _run_one(job, 2)
    assert first["finished"] and second["finished"]
    assert second["job"]["status"] == "finished" and second["done"] == ["1"]


def test_a_failing_command_does_not_stop_the_others_and_raises_after(tenants):
    conn = transport.get_queue("default").connection
    conn.set("finish-script:string", "x")
    pipeline = conn.pipeline()
    pipeline.hset("finish-script:hash", "a", 1)
    pipeline.hincrby("finish-script:string", "f", 1)  # WRONGTYPE
    pipeline.hset("finish-script:hash", "b", b"\x00\xff")
    with pytest.raises(ResponseError, match="WRONGTYPE"):
        rq_finish.execute(conn, pipeline)
    assert conn.hgetall("finish-script:hash") == {b"a": b"1", b"b": b"\x00\xff"}
