"""A tampered message the dequeue script has already started, through a real burst worker.

The dequeue script writes RQ's start of the message it picks (transport/rq_start.py: the
execution's hash, the job's execution registry, ``StartedJobRegistry``, the worker's
execution set) in the same call as the pick, before the worker reads the job. When the worker
then refuses it (a job hash RQ cannot load, or a message that is not kumiko's to call), what
the script wrote is removed with the refusal: nothing of it is left for RQ's TTL cleanup to
find, the cap slots its pick took are free again, and the refusal is recorded as before
(``RejectedMessage``); no job body runs in any schema (``Batch.run``'s checks,
tests/integration/test_poison.py).
"""

from __future__ import annotations

from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings
from rq.executions import Execution, ExecutionRegistry

from kumiko_jobs import transport
from kumiko_jobs.models import JobRun, RejectedMessage, RunStatus
from kumiko_jobs.transport.fair_caps import CAP_PREFIX
from tests.conftest import probes, work
from tests.integration.test_poison import Batch, queue
from tests.testapp import jobs

pytestmark = pytest.mark.usefixtures("live_db")


def leftovers(job_id: str) -> dict[str, Any]:
    """Everything of RQ's start of ``job_id`` still in Redis (empty: nothing)."""
    q = queue()
    redis = q.connection
    found: dict[str, Any] = {}
    # (RQ's own reading of the registry splits every entry at ":": not for such an id)
    ids = q.started_job_registry.get_job_ids() if ":" not in job_id else []
    started = [m for m in ids if m.startswith(job_id)]
    started += [
        m.decode()
        for m in redis.zrange(q.started_job_registry.key, 0, -1)
        if m.decode().startswith(job_id)
    ]
    if started:
        found["StartedJobRegistry"] = started
    execution_key = Execution(id="*", job_id=job_id, connection=redis).key
    executions = [k.decode() for k in redis.scan_iter(match=execution_key)]
    if executions:
        found["execution hashes"] = executions
    registry = ExecutionRegistry(job_id=job_id, connection=redis).key
    if redis.exists(registry):
        found["execution registry"] = redis.zrange(registry, 0, -1)
    for key in redis.scan_iter(match="rq:worker:*"):
        if redis.type(key) == b"set":
            held = [m for m in redis.smembers(key) if m.decode().startswith(job_id)]
            if held:
                found[key.decode()] = held
    return found


@pytest.mark.parametrize(
    ("tamper", "reason"),
    [
        ({"created_at": "not a date"}, "RQ cannot load the job"),
        ({"failure_callback_name": "os.system"}, "failure_callback_name"),
    ],
    ids=["unreadable", "refused"],
)
def test_a_tampered_message_leaves_nothing_of_its_start(tenants: Any, tamper: Any, reason: str):
    """A real kumiko message of t1, its job hash tampered in Redis before a worker takes it
    (a field RQ cannot restore; an RQ hook, which kumiko refuses). The burst worker refuses
    it and runs the next message; the refusal is recorded; its run never started (still
    queued, no attempt: the relay signs it anew); and StartedJobRegistry, the execution's
    hash and registry and the worker's execution set hold nothing of it.

    Proven able to fail: without the removal (``worker_commands.forget_start``) the
    execution the script wrote stays in all four until RQ's TTL cleanup."""
    handle = jobs.probe.enqueue(tenant="t1", tag="tampered")
    job_id = JobRun.objects.get(pk=handle.run_id).rq_job_id
    q = queue()
    assert q.connection.exists(q.job_class.key_for(job_id))
    q.connection.hset(q.job_class.key_for(job_id), mapping=tamper)
    batch = Batch()
    batch.add(job_id)
    rejected, _ = batch.run()  # the control job ran after it, alone, in t2
    assert [r.rq_job_id for r in rejected] == [job_id]
    assert reason in rejected[0].reason
    run = JobRun.objects.get(pk=handle.run_id)
    assert run.status == RunStatus.QUEUED and run.attempts == 0
    assert not run.attempt_set.exists()
    assert leftovers(job_id) == {}
    # the refused one is failed in RQ (as before), the unreadable one removed
    if "callback" in reason:
        assert job_id in q.failed_job_registry.get_job_ids()
    else:
        assert not q.connection.exists(q.job_class.key_for(job_id))
    assert transport.queue_length("default") == 0


@pytest.mark.parametrize(
    "tamper",
    [{"created_at": "not a date"}, {"failure_callback_name": "os.system"}],
    ids=["unreadable", "refused"],
)
def test_a_tampered_message_gives_back_the_cap_slot_its_pick_took(tenants: Any, tamper: Any):
    """TENANT_CONCURRENCY=1: t1's first message is tampered, its second is not. The dequeue's
    pick of the first took t1's one slot; the worker refuses it and frees the slot, so t1's
    second run starts in the same burst and no slot is left taken. Proven able to fail:
    without the release (``worker_commands.free_caps``) t1 stays at its cap and the second run
    waits, queued, after the burst."""
    with override_settings(KUMIKO_JOBS={**settings.KUMIKO_JOBS, "TENANT_CONCURRENCY": 1}):
        first = jobs.probe.enqueue(tenant="t1", tag="tampered")
        second = jobs.probe.enqueue(tenant="t1", tag="next")
    job_id = JobRun.objects.get(pk=first.run_id).rq_job_id
    q = queue()
    q.connection.hset(q.job_class.key_for(job_id), mapping=tamper)
    work()
    assert [r.rq_job_id for r in RejectedMessage.objects.all()] == [job_id]
    assert JobRun.objects.get(pk=second.run_id).status == RunStatus.SUCCEEDED
    assert [p.tag for p in probes("t1")] == ["next"]
    assert q.connection.scard(CAP_PREFIX + "t:t1") == 0
    assert leftovers(job_id) == {}


@pytest.mark.parametrize("job_id", ["foreign:1", "a:b:c", "x:"], ids=["one", "two", "trailing"])
@pytest.mark.parametrize("kind", ["refused", "unreadable"])
def test_a_foreign_message_whose_id_has_a_colon_leaves_nothing_of_its_start(
    tenants: Any, job_id: str, kind: str
):
    """A foreign message pushed into a kumiko queue by hand (redis-py), its RQ job id with
    ":" in it, which no RQ enqueue makes (RQ reads such an id as an execution's composite key,
    ``<job id>:<execution id>``): a function kumiko does not call, or a hash RQ cannot load.
    The burst worker refuses it under its own id, removes it, and runs the next message, and
    nothing of the start the dequeue script wrote is left. Proven able to fail: without the
    check of the id (``one_trip_dequeue._restore_popped``) the worker built the job of id
    "foreign" from it, recorded that id, and the start of "foreign:1" stayed in all four
    places."""
    from tests.integration.test_poison import push_raw

    data = '["os.system", null, ["true"], {}]'
    fields = {"data": data} if kind == "refused" else {"data": data, "created_at": "bad"}
    batch = Batch()
    batch.add(push_raw(fields, job_id=job_id))
    rejected, runs = batch.run()
    assert [r.rq_job_id for r in rejected] == [job_id] and runs == []
    assert "is not an RQ job id" in rejected[0].reason
    assert leftovers(job_id) == {}
    redis = queue().connection
    assert not redis.exists(queue().job_class.key_for(job_id))
    # nor a hash of the id RQ would read in it (a refusal's status, written to the wrong job)
    assert not redis.exists(queue().job_class.key_for(job_id.split(":")[0]))


def _worker_states(redis: Any) -> list[str]:
    """Each live worker's state as ``rq info`` reads it (``Worker.all``: ``find_by_key``)."""
    from rq import Worker as RQWorker

    return [w.get_state() for w in RQWorker.all(connection=redis)]


@pytest.mark.parametrize(
    "fields",
    [{"failure_callback_name": "os.system"}, {"created_at": "bad"}],
    ids=["refused", "unreadable"],
)
def test_a_worker_that_refused_a_message_says_idle(tenants: Any, fields: dict[str, Any]):
    """A long-running worker process runs t1's message, then refuses a foreign one (failed in
    RQ, or removed as unreadable) and waits for more: ``rq info`` shows it idle, not busy
    until its next job. Proven able to fail: without the state written with the refusal
    (``worker_commands``) the dequeue script's ``busy`` stayed, as the worker believed it
    had written ``idle`` already."""
    import subprocess
    import time

    from tests.conftest import start_rqworker
    from tests.integration.test_poison import push_raw

    redis = queue().connection
    worker = start_rqworker("default")
    try:
        first = jobs.probe.enqueue(tenant="t1", tag="first")
        deadline = time.monotonic() + 60
        while JobRun.objects.get(pk=first.run_id).status != RunStatus.SUCCEEDED:
            assert time.monotonic() < deadline, "the worker did not run t1's message"
            time.sleep(0.1)
        time.sleep(0.3)  # (the finish's pipeline, which writes idle, follows the row)
        assert _worker_states(redis) == ["idle"]
        data = '["kumiko_jobs.runner.execute", null, ["x"], {}]'
        job_id = push_raw({"data": data, **fields})
        while not RejectedMessage.objects.filter(rq_job_id=job_id).exists():
            assert time.monotonic() < deadline + 30, "the worker did not refuse the message"
            time.sleep(0.1)
        time.sleep(0.5)
        assert _worker_states(redis) == ["idle"]
        assert leftovers(job_id) == {}
    finally:
        worker.terminate()
        try:
            worker.wait(timeout=20)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
