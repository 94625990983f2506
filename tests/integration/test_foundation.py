"""A job enqueued in one tenant runs in that tenant's schema, through real RQ workers."""

from __future__ import annotations

import pytest
from django.db import connection, transaction
from django_tenants.utils import schema_context, tenant_context

from kumiko_jobs import InvalidJob, JobNotRegistered
from kumiko_jobs import enqueue as enqueue_by_name
from kumiko_jobs.models import JobAttempt, JobFailure, JobRun, RunStatus
from tests.conftest import probes, start_rqworker, work
from tests.testapp import jobs

pytestmark = pytest.mark.usefixtures("live_db")


def test_run_executes_in_the_enqueuing_tenant(tenants):
    with tenant_context(tenants["t1"]):
        handle = jobs.probe.enqueue(tag="hello")
    assert handle.schema_name == "t1"
    assert JobRun.objects.get(pk=handle.run_id).status == RunStatus.QUEUED

    work()

    run = JobRun.objects.get(pk=handle.run_id)
    assert run.status == RunStatus.SUCCEEDED
    assert run.attempts == 1 and run.subject == "tag=hello"
    assert [(p.tag, p.schema_seen) for p in probes("t1")] == [("hello", "t1")]
    assert probes("t2") == []
    assert connection.schema_name == "public"


def test_enqueue_by_name_with_explicit_tenant(tenants):
    handle = enqueue_by_name("testapp.probe", tenant="t2", tag="named")
    work()
    assert JobRun.objects.get(pk=handle.run_id).status == RunStatus.SUCCEEDED
    assert [p.schema_seen for p in probes("t2")] == ["t2"]


def test_public_schema_without_tenant_is_refused(tenants):
    with pytest.raises(InvalidJob, match="public schema without tenant="):
        jobs.probe.enqueue(tag="nowhere")
    assert JobRun.objects.count() == 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"tag": object()}, "not JSON"),
        (
            {"tag": "x", "payload": {"when": __import__("datetime").datetime(2026, 1, 1)}},
            "isoformat",
        ),
        ({"tag": "x", "payload": {"n": float("nan")}}, "JSON cannot carry"),
        ({"tag": "x", "payload": {1: "int key"}}, "non-string key"),
        ({"tag": "x", "tga": "typo"}, "unexpected keyword argument"),
        ({}, "missing a required keyword-only argument"),
    ],
)
def test_bad_arguments_fail_at_enqueue(tenants, kwargs, message):
    with pytest.raises(InvalidJob, match=message):
        jobs.probe.enqueue(tenant=tenants["t1"], **kwargs)
    assert JobRun.objects.count() == 0


def test_unknown_job_name_fails_at_enqueue(tenants):
    with pytest.raises(JobNotRegistered):
        enqueue_by_name("testapp.nope", tenant="t1")


def test_unknown_tenant_schema_fails_at_enqueue(tenants):
    with pytest.raises(InvalidJob, match="No tenant"):
        jobs.probe.enqueue(tenant="ghost", tag="x")


def test_enqueue_waits_for_commit_and_rollback_enqueues_nothing(tenants, redis_conn):
    from kumiko_jobs import transport

    with transaction.atomic():
        committed = jobs.probe.enqueue(tenant="t1", tag="committed")
        assert transport.queue_length("default") == 0  # not before commit
    assert transport.queue_length("default") == 1

    with pytest.raises(RuntimeError), transaction.atomic():
        jobs.probe.enqueue(tenant="t1", tag="rolled-back")
        jobs.probe.enqueue_in(30, tenant="t1", tag="rolled-back-later")
        raise RuntimeError("request failed")
    assert transport.queue_length("default") == 1
    assert transport.scheduled_job_ids("default") == []
    assert list(JobRun.objects.values_list("pk", flat=True)) == [
        __import__("uuid").UUID(committed.run_id)
    ]


def test_enqueue_in_goes_through_the_scheduler(tenants):
    from kumiko_jobs import transport

    handle = jobs.probe.enqueue_in(1, tenant="t1", tag="later")
    assert transport.queue_length("default") == 0
    assert len(transport.scheduled_job_ids("default")) == 1
    assert JobRun.objects.get(pk=handle.run_id).scheduled_for is not None
    moved = work(scheduler_rounds=1)
    assert moved == 1
    assert JobRun.objects.get(pk=handle.run_id).status == RunStatus.SUCCEEDED


def test_retries_then_success_records_every_attempt(tenants):
    handle = jobs.flaky.enqueue(tenant="t1", tag="f", fail_times=1)
    work(scheduler_rounds=2)
    run = JobRun.objects.get(pk=handle.run_id)
    assert run.status == RunStatus.SUCCEEDED
    assert run.attempts == 2
    outcomes = list(JobAttempt.objects.filter(run=run).values_list("number", "outcome"))
    assert outcomes == [(1, "retrying"), (2, "succeeded")]
    assert [p.note for p in probes("t1")] == ["final=False", "final=False"]
    assert not JobFailure.objects.exists()


def test_final_attempt_fails_for_good_and_is_tenant_visible(tenants):
    handle = jobs.flaky.enqueue(tenant="t2", tag="bad", fail_times=99)
    work(scheduler_rounds=3)
    run = JobRun.objects.get(pk=handle.run_id)
    assert run.status == RunStatus.FAILED
    assert run.attempts == 3 and run.max_attempts == 3
    assert "boom on attempt 3" in run.error_message
    assert [p.note for p in probes("t2")] == ["final=False", "final=False", "final=True"]
    failure = JobFailure.objects.get()
    assert (failure.schema_name, failure.subject, failure.message_key) == (
        "t2",
        "tag=bad",
        "testapp.flaky_failed",
    )


def test_unrecoverable_fails_at_once(tenants):
    handle = jobs.gives_up.enqueue(tenant="t1", tag="u")
    work(scheduler_rounds=1)
    run = JobRun.objects.get(pk=handle.run_id)
    assert (run.status, run.attempts, run.error_type) == (RunStatus.FAILED, 1, "Unrecoverable")
    assert len(probes("t1")) == 1


def test_schema_leak_does_not_reach_the_next_run(tenants):
    jobs.leaks_schema.enqueue(tenant="t1", tag="leak", other="t2")
    after = jobs.probe.enqueue(tenant="t3", tag="after")
    public_after = jobs.list_tags.enqueue(tenant="t1", tag="check")
    work()
    assert connection.schema_name == "public"
    assert JobRun.objects.get(pk=after.run_id).status == RunStatus.SUCCEEDED
    assert [p.schema_seen for p in probes("t3")] == ["t3"]
    assert JobRun.objects.get(pk=public_after.run_id).status == RunStatus.SUCCEEDED
    assert [p.tag for p in probes("t2")] == []


def test_failed_connection_use_does_not_break_the_next_run(tenants):
    jobs.crashes_connection.enqueue(tenant="t1", tag="crash")
    nxt = jobs.probe.enqueue(tenant="t1", tag="next")
    work()
    assert JobRun.objects.get(pk=nxt.run_id).status == RunStatus.SUCCEEDED


def test_each_run_sees_only_its_own_tenant_rows(tenants):
    for schema in ("t1", "t2"):
        with schema_context(schema):
            from tests.testapp.models import Probe

            Probe.objects.create(tag=f"own-{schema}", schema_seen=schema)
    jobs.list_tags.enqueue(tenant="t1", tag="look")
    jobs.list_tags.enqueue(tenant="t2", tag="look")
    work()
    assert probes("t1")[-1].note == "own-t1"
    assert probes("t2")[-1].note == "own-t2"


def test_followups_are_sent_only_when_the_parent_succeeds(tenants):
    ok = jobs.with_followup.enqueue(tenant="t1", tag="p")
    bad = jobs.with_followup.enqueue(tenant="t2", tag="q", fail=True)
    work()
    work()
    assert sorted(p.tag for p in probes("t1")) == ["p", "p-child"]
    assert [p.tag for p in probes("t2")] == ["q"]
    child = JobRun.objects.get(parent_run_id=ok.run_id)
    assert child.status == RunStatus.SUCCEEDED and child.schema_name == "t1"
    assert child.correlation_id == JobRun.objects.get(pk=ok.run_id).correlation_id
    assert not JobRun.objects.filter(parent_run_id=bad.run_id).exists()


def test_system_job_runs_in_public(tenants):
    handle = jobs.system_tick.enqueue(tag="sys")
    work()
    assert JobRun.objects.get(pk=handle.run_id).status == RunStatus.SUCCEEDED
    with pytest.raises(InvalidJob, match="system job"):
        jobs.system_tick.enqueue(tenant="t1", tag="sys")


def test_cancelled_run_is_dropped(tenants):
    handle = jobs.probe.enqueue(tenant="t1", tag="cancel-me")
    JobRun.objects.filter(pk=handle.run_id).update(status=RunStatus.CANCELLED)
    work()
    assert probes("t1") == []
    assert JobRun.objects.get(pk=handle.run_id).status == RunStatus.CANCELLED


def test_duplicate_delivery_runs_once(tenants):
    from kumiko_jobs import transport
    from kumiko_jobs.core.envelope import decode
    from kumiko_jobs.enqueueing.messages import message_for

    handle = jobs.probe.enqueue(tenant="t1", tag="once")
    q = transport.get_queue("default")
    body = q.jobs[0].args[0]
    transport.push(message_for(jobs.probe, decode(body), 0))  # the same message again
    work()
    assert [p.tag for p in probes("t1")] == ["once"]
    assert JobRun.objects.get(pk=handle.run_id).status == RunStatus.SUCCEEDED


@pytest.mark.parametrize(
    "worker_class", ["kumiko_jobs.worker.Worker", "kumiko_jobs.worker.ForkingWorker"]
)
def test_manage_py_rqworker_runs_jobs(tenants, worker_class):
    handles = [jobs.reports_pid.enqueue(tenant=s, tag=f"w-{s}") for s in ("t1", "t2")]
    proc = start_rqworker("default", "--burst", "--worker-class", worker_class)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    for handle in handles:
        assert JobRun.objects.get(pk=handle.run_id).status == RunStatus.SUCCEEDED, out
    pids = {probes(s)[0].note for s in ("t1", "t2")}
    if worker_class.endswith("ForkingWorker"):
        assert len(pids) == 2  # one work horse per job
    else:
        assert len(pids) == 1  # same process


def test_plain_rq_forking_worker_with_json_serializer(tenants):
    handle = jobs.probe.enqueue(tenant="t2", tag="plain-fork")
    proc = start_rqworker(
        "default",
        "--burst",
        "--worker-class",
        "rq.worker.Worker",
        "--serializer",
        "rq.serializers.JSONSerializer",
    )
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    assert JobRun.objects.get(pk=handle.run_id).status == RunStatus.SUCCEEDED, out


def test_two_worker_processes_at_once_keep_tenants_apart(tenants):
    expected = {}
    for i in range(30):
        schema = ("t1", "t2", "t3")[i % 3]
        jobs.probe.enqueue(tenant=schema, tag=f"{schema}-{i}")
        expected.setdefault(schema, set()).add(f"{schema}-{i}")
    workers = [start_rqworker("default", "--burst") for _ in range(2)]
    for proc in workers:
        out, _ = proc.communicate(timeout=180)
        assert proc.returncode == 0, out
    for schema, tags in expected.items():
        rows = probes(schema)
        assert {p.tag for p in rows} == tags
        assert {p.schema_seen for p in rows} == {schema}
    assert JobRun.objects.filter(status=RunStatus.SUCCEEDED).count() == 30


def test_nul_characters_fail_at_enqueue(tenants):
    with pytest.raises(InvalidJob, match="NUL"):
        jobs.probe.enqueue(tenant="t1", tag="a\x00b")
