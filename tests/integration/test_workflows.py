"""Workflows through real workers: chains, groups with a callback, dependencies, the failure
rules (docs/workflows.md, one test each), cancellation, the enqueue on commit, and the denied
paths (a step waiting for another workflow's or another tenant's step)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.conf import settings
from django.db import connection, transaction
from django.test import override_settings

import kumiko_jobs
from kumiko_jobs import InvalidJob, transport
from kumiko_jobs.enqueueing import workflow_release
from kumiko_jobs.models import JobRun, RunStatus, StepState, Workflow, WorkflowStep
from kumiko_jobs.operations import cancel_run
from kumiko_jobs.worker.relay import relay_pending
from tests.conftest import probes, work
from tests.integration.test_run_sql import _kind, recording
from tests.testapp import jobs
from tests.testapp import workflow_jobs as wf

pytestmark = pytest.mark.usefixtures("live_db", "clean_workflows")


@pytest.fixture
def clean_workflows(live_db: None) -> None:
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE kumiko_jobs_workflowstep, kumiko_jobs_workflow")


def tags(schema: str) -> list[str]:
    return [p.tag for p in probes(schema)]


def steps_of(handle: Any) -> dict[str, str]:
    return handle.steps()


def note_of(schema: str, tag: str) -> Any:
    (probe,) = [p for p in probes(schema) if p.tag == tag]
    return json.loads(probe.note) if probe.note else None


def run_of(handle: Any, key: str) -> JobRun:
    step = WorkflowStep.objects.get(workflow_id=handle.workflow_id, key=key)
    return JobRun.objects.get(pk=step.run_id)


def test_a_chain_runs_in_order_and_its_middle_step_retries(tenants: Any) -> None:
    flow = kumiko_jobs.chain(
        wf.record.step(tag="a", key="a"),
        wf.flaky.step(tag="b", fail_times=1, key="b"),
        wf.record.step(tag="c", key="c"),
    )
    handle = kumiko_jobs.workflow(flow, name="import").enqueue(tenant="t1")
    # Only the first step has a run until it finishes.
    assert JobRun.objects.filter(workflow_id=handle.workflow_id).count() == 1
    work()
    assert tags("t1") == ["a", "b", "b", "c"]  # b's first attempt failed, its retry succeeded
    assert handle.status == RunStatus.SUCCEEDED
    assert steps_of(handle) == {"a": "succeeded", "b": "succeeded", "c": "succeeded"}
    assert run_of(handle, "b").attempts == 2
    # c asked for its predecessor's result: b's, and only b's.
    assert note_of("t1", "c") == {"b": "b ok"}
    workflow = handle.refresh()
    assert (workflow.steps_pending, workflow.steps_failed, workflow.steps_total) == (0, 0, 3)
    assert workflow.finished_at is not None
    assert all(r.schema_name == "t1" for r in JobRun.objects.filter(workflow_id=handle.workflow_id))


def test_a_group_callback_fires_once_given_failed_succeeded_and_cancelled_members(
    tenants: Any,
) -> None:
    members = [
        wf.record.step(tag="ok1", key="ok1"),
        wf.fail.step(tag="bad", key="bad"),
        wf.record.step(tag="gone", key="gone"),
        wf.record.step(tag="ok2", key="ok2"),
    ]
    handle = kumiko_jobs.workflow(
        kumiko_jobs.group(members, then=wf.summary.step(tag="cb", key="cb")), name="batch"
    ).enqueue(tenant="t1")
    # An operator cancels one member before it starts (outside any run's finish).
    assert cancel_run(run_of(handle, "gone")) == "cancelled"
    work()
    # The cancelled member was closed by no finish: the reconciler (maintenance) closes it.
    assert "cb" not in tags("t1")
    assert workflow_release.reconcile() == 1
    assert workflow_release.reconcile() == 0  # closed once
    work()
    assert tags("t1").count("cb") == 1
    assert note_of("t1", "cb")["outcomes"] == {
        "total": 4,
        "succeeded": 2,
        "failed": 1,
        "cancelled": 1,
    }
    assert steps_of(handle) == {
        "ok1": "succeeded",
        "bad": "failed",
        "gone": "cancelled",
        "ok2": "succeeded",
        "cb": "succeeded",
    }
    assert run_of(handle, "bad").attempts == 2  # failed only once its retries were exhausted
    assert handle.status == RunStatus.FAILED
    work()
    assert tags("t1").count("cb") == 1


def test_a_failed_steps_dependents_are_skipped_with_a_reason(tenants: Any) -> None:
    flow = kumiko_jobs.chain(
        wf.unrecoverable.step(tag="a", key="a"),
        wf.record.step(tag="b", key="b"),
        wf.record.step(tag="c", key="c"),
    )
    handle = kumiko_jobs.workflow(flow, name="chain").enqueue(tenant="t1")
    work()
    assert tags("t1") == ["a"]
    assert steps_of(handle) == {"a": "failed", "b": "cancelled", "c": "cancelled"}
    b = WorkflowStep.objects.get(workflow_id=handle.workflow_id, key="b")
    assert b.run_id is None and "did not succeed" in b.reason
    assert handle.status == RunStatus.FAILED
    assert handle.refresh().steps_pending == 0


def test_a_cancelled_steps_dependents_are_skipped(tenants: Any) -> None:
    flow = kumiko_jobs.chain(wf.record.step(tag="a", key="a"), wf.record.step(tag="b", key="b"))
    handle = kumiko_jobs.workflow(flow, name="chain").enqueue(tenant="t1")
    cancel_run(run_of(handle, "a"))
    workflow_release.reconcile()
    work()
    assert tags("t1") == []
    assert steps_of(handle) == {"a": "cancelled", "b": "cancelled"}
    assert handle.status == RunStatus.FAILED


def test_a_step_waits_for_the_steps_it_names(tenants: Any) -> None:
    s1 = wf.record.step(tag="s1", key="s1")
    s2 = wf.flaky.step(tag="s2", fail_times=2, key="s2")
    d = wf.record.step(tag="d", key="d", after=[s1, s2])
    handle = kumiko_jobs.workflow(kumiko_jobs.group([s1, s2, d]), name="dag").enqueue(tenant="t2")
    work()
    assert tags("t2")[-1] == "d" and tags("t2").count("d") == 1
    assert note_of("t2", "d") == {"s1": {"tag": "s1", "schema": "t2"}, "s2": "s2 ok"}
    assert handle.status == RunStatus.SUCCEEDED


def test_stop_on_failure_cancels_the_rest_on_the_first_failure(tenants: Any) -> None:
    flow = kumiko_jobs.group(
        [
            wf.unrecoverable.step(tag="bad", key="bad"),
            wf.record.step(tag="x", key="x"),
            kumiko_jobs.chain(wf.record.step(tag="y", key="y"), wf.record.step(tag="z", key="z")),
        ],
        then=wf.summary.step(tag="cb", key="cb"),
    )
    handle = kumiko_jobs.workflow(flow, name="strict", stop_on_failure=True).enqueue(tenant="t1")
    work()
    # bad ran first (queue order) and stopped the rest, its callback included.
    assert tags("t1") == ["bad"]
    assert steps_of(handle) == {
        "bad": "failed",
        "x": "cancelled",
        "y": "cancelled",
        "z": "cancelled",
        "cb": "cancelled",
    }
    assert run_of(handle, "x").status == RunStatus.CANCELLED
    workflow = handle.refresh()
    assert workflow.status == RunStatus.CANCELLED and workflow.steps_pending == 0
    assert "stop_on_failure" in workflow.reason


def test_without_stop_on_failure_the_rest_goes_on(tenants: Any) -> None:
    flow = kumiko_jobs.group(
        [wf.unrecoverable.step(tag="bad"), wf.record.step(tag="x")],
        then=wf.summary.step(tag="cb"),
    )
    handle = kumiko_jobs.workflow(flow, name="lenient").enqueue(tenant="t1")
    work()
    assert sorted(tags("t1")) == ["bad", "cb", "x"]
    assert handle.status == RunStatus.FAILED


def test_cancel_a_whole_workflow_from_the_api(tenants: Any) -> None:
    flow = kumiko_jobs.chain(
        kumiko_jobs.group([wf.record.step(tag="a"), wf.record.step(tag="b")]),
        wf.record.step(tag="c"),
    )
    handle = kumiko_jobs.workflow(flow, name="doomed").enqueue(tenant="t1")
    assert kumiko_jobs.cancel_workflow(handle.workflow_id, by="ops") is True
    assert kumiko_jobs.cancel_workflow(handle.workflow_id) is False  # already finished
    work()
    assert tags("t1") == []
    assert set(steps_of(handle).values()) == {"cancelled"}
    assert handle.status == RunStatus.CANCELLED
    runs = JobRun.objects.filter(workflow_id=handle.workflow_id)
    assert {r.status for r in runs} == {RunStatus.CANCELLED}


def test_enqueue_is_on_commit_and_a_rollback_leaves_nothing(tenants: Any) -> None:
    flow = kumiko_jobs.chain(wf.record.step(tag="a"), wf.record.step(tag="b"))
    with pytest.raises(RuntimeError), transaction.atomic():
        kumiko_jobs.workflow(flow, name="rolled back").enqueue(tenant="t1")
        raise RuntimeError("the request fails")
    assert not Workflow.objects.exists() and not JobRun.objects.exists()
    flow = kumiko_jobs.chain(wf.record.step(tag="a"), wf.record.step(tag="b"))
    with transaction.atomic():
        handle = kumiko_jobs.workflow(flow, name="committed").enqueue(tenant="t1")
        assert transport.get_queue("default").count == 0  # nothing pushed before the commit
    assert transport.get_queue("default").count == 1  # the first step only
    work()
    assert tags("t1") == ["a", "b"] and handle.status == RunStatus.SUCCEEDED


def test_a_released_step_whose_push_is_lost_is_pushed_by_the_relay(
    tenants: Any, redis_conn: Any
) -> None:
    """Redis loses everything (a restart) after each commit: the rows are the outbox."""
    flow = kumiko_jobs.group(
        [wf.record.step(tag="a"), wf.record.step(tag="b")], then=wf.summary.step(tag="cb")
    )
    handle = kumiko_jobs.workflow(flow, name="outbox").enqueue(tenant="t1")
    redis_conn.flushdb()
    assert relay_pending(grace=0).pushed == 2
    work()
    assert tags("t1").count("cb") in (0, 1)
    redis_conn.flushdb()  # the callback's message, pushed after its release, lost too
    relay_pending(grace=0)
    work()
    assert tags("t1").count("cb") == 1
    relay_pending(grace=0)
    work()
    assert tags("t1").count("cb") == 1 and handle.status == RunStatus.SUCCEEDED


def test_two_tenants_run_the_same_workflow_without_seeing_each_other(tenants: Any) -> None:
    handles = {}
    for schema in ("t1", "t2"):
        flow = kumiko_jobs.chain(
            wf.record.step(tag=f"{schema}-a", key="a"), wf.record.step(tag="b", key="b")
        )
        handles[schema] = kumiko_jobs.workflow(flow, name="same").enqueue(tenant=schema)
    work()
    for schema in ("t1", "t2"):
        assert tags(schema) == [f"{schema}-a", "b"]
        assert note_of(schema, "b") == {"a": {"tag": f"{schema}-a", "schema": schema}}
        assert {p.schema_seen for p in probes(schema)} == {schema}
    assert tags("t3") == []


# --------------------------------------------------------------------------- denied paths


def test_a_step_cannot_wait_for_another_tenants_workflow_step(tenants: Any) -> None:
    """Cross-tenant fan-in is refused: a step waits only for steps of its own workflow, and a
    workflow runs in one tenant. (Proved able to fail: without the membership check in
    ``_ordered`` the t1 workflow is enqueued, its step waiting for a t2 step.)"""
    theirs = wf.record.step(tag="t2-secret")
    kumiko_jobs.workflow(theirs, name="theirs").enqueue(tenant="t2")
    mine = wf.summary.step(tag="fan-in", after=[theirs])
    with pytest.raises(InvalidJob, match="not a step of this workflow"):
        kumiko_jobs.workflow(kumiko_jobs.group([mine]), name="mine").enqueue(tenant="t1")
    # Not even by putting the other tenant's (already enqueued) step in the workflow.
    with pytest.raises(InvalidJob, match="already enqueued"):
        kumiko_jobs.workflow(kumiko_jobs.group([theirs, mine]), name="mine").enqueue(tenant="t1")
    assert Workflow.objects.filter(schema_name="t1").count() == 0
    assert not JobRun.objects.filter(schema_name="t1").exists()


def test_a_step_cannot_choose_another_tenant(tenants: Any) -> None:
    with pytest.raises(InvalidJob, match="tenant"):
        kumiko_jobs.workflow(wf.record.step(tag="x", tenant="t2"), name="w").enqueue(tenant="t1")
    with pytest.raises(InvalidJob, match="system job"):
        kumiko_jobs.workflow(wf.system_step.step(tag="x"), name="w").enqueue(tenant="t1")
    assert not Workflow.objects.exists()


def test_bad_workflows_are_refused_with_the_fix(tenants: Any) -> None:
    a, b = wf.record.step(tag="a"), wf.record.step(tag="b")
    kumiko_jobs.chain(a, b)
    a.after.append(b)
    with pytest.raises(InvalidJob, match="cycle"):
        kumiko_jobs.workflow(kumiko_jobs.group([a, b]), name="loop").enqueue(tenant="t1")
    with pytest.raises(InvalidJob, match="workflow_results is filled in"):
        wf.record.step(tag="a", workflow_results={})
    with pytest.raises(InvalidJob, match="unique=, max_per_tenant= or concurrency"):
        kumiko_jobs.workflow(jobs.skip_while_busy.step(tag="s"), name="w").enqueue(tenant="t1")
    with pytest.raises(InvalidJob):
        kumiko_jobs.workflow(wf.record.step(nope=1), name="w").enqueue(tenant="t1")
    assert not Workflow.objects.exists() and not JobRun.objects.exists()


# --------------------------------------------------------------------------- statements


@override_settings(KUMIKO_JOBS={**settings.KUMIKO_JOBS, "DB_ROLES": False})
def test_statements_of_a_plain_run_and_of_a_workflow_step(tenants: Any) -> None:
    plain = jobs.probe.enqueue(tenant="t1", tag="plain")
    handle = kumiko_jobs.workflow(
        kumiko_jobs.chain(wf.record.step(tag="a", key="a"), wf.record.step(tag="b", key="b")),
        name="count",
    ).enqueue(tenant="t1")
    with recording() as statements:
        work()
    plain_run = JobRun.objects.get(pk=plain.run_id)
    # A plain run: unchanged, its start and its finish (and its tenant, its job and the session
    # reset between).
    assert [_kind(s) for s in statements.of(plain_run.rq_job_id)] == [
        "start",
        'SET search_path = "t1","public"',
        "job",
        "reset",
        "finish",
    ]
    a = statements.of(run_of(handle, "a").rq_job_id)
    b = statements.of(run_of(handle, "b").rq_job_id)
    print("workflow step a:", len(a), [_kind(s)[:60] for s in a])
    print("workflow step b (last):", len(b), [_kind(s)[:60] for s in b])
    assert handle.status == RunStatus.SUCCEEDED
    assert (
        WorkflowStep.objects.get(workflow_id=handle.workflow_id, key="b").state
        == StepState.SUCCEEDED
    )


# --------------------------------------------------------------------------- admin


def _admin_clients() -> tuple[Any, Any]:
    from tests.integration.test_admin import client_for, make_user

    operator = client_for("localhost", "public", make_user("public", "operator", superuser=True))
    tenant_admin = client_for("t1.localhost", "t1", make_user("t1", "boss", superuser=True))
    return operator, tenant_admin


def test_the_admin_lists_workflows_and_only_operators_cancel_them(tenants: Any) -> None:
    """A tenant's view of its own workflows: tests/integration/test_workflows_admin.py."""
    handle = kumiko_jobs.workflow(
        kumiko_jobs.chain(wf.record.step(tag="a", key="a"), wf.record.step(tag="b", key="b")),
        name="admin-visible",
    ).enqueue(tenant="t1")
    operator, tenant_admin = _admin_clients()
    url = "/admin/kumiko_jobs/workflow/"
    page = operator.get(url)
    assert page.status_code == 200 and "admin-visible" in page.content.decode()
    detail = operator.get(f"{url}{handle.workflow_id}/change/")
    assert detail.status_code == 200 and "record" in detail.content.decode()
    # A tenant's superuser, on its own domain, sees its own workflow but cannot cancel it.
    own = tenant_admin.get(url)
    assert own.status_code == 200 and "admin-visible" in own.content.decode()
    refused = tenant_admin.post(
        url, {"action": "cancel_selected", "_selected_action": [handle.workflow_id]}
    )
    assert refused.status_code in (200, 302, 403, 404)  # no such action for a tenant
    assert handle.status == RunStatus.RUNNING
    done = operator.post(
        url, {"action": "cancel_selected", "_selected_action": [handle.workflow_id]}
    )
    assert done.status_code == 302
    assert handle.status == RunStatus.CANCELLED
    work()
    assert tags("t1") == []


# --------------------------------------------------------------------------- sequencing


def test_a_sequential_workflow_waits_for_the_previous_one_of_its_tenant(tenants: Any) -> None:
    def make(schema: str, n: int) -> Any:
        flow = kumiko_jobs.chain(
            wf.record.step(tag=f"w{n}-a", key="a"), wf.record.step(tag=f"w{n}-b", key="b")
        )
        return kumiko_jobs.workflow(flow, name="nightly", sequential=True).enqueue(tenant=schema)

    first, second, third = make("t1", 1), make("t1", 2), make("t1", 3)
    other = make("t2", 9)  # another tenant's turn is its own
    assert [h.status for h in (first, second, third, other)] == [
        RunStatus.RUNNING,
        RunStatus.QUEUED,
        RunStatus.QUEUED,
        RunStatus.RUNNING,
    ]
    assert not JobRun.objects.filter(workflow_id=second.workflow_id).exists()
    work()
    assert tags("t1") == ["w1-a", "w1-b", "w2-a", "w2-b", "w3-a", "w3-b"]
    assert tags("t2") == ["w9-a", "w9-b"]
    assert {h.status for h in (first, second, third, other)} == {RunStatus.SUCCEEDED}


def test_a_cancelled_queued_sequential_workflow_leaves_the_turn_to_the_next(
    tenants: Any,
) -> None:
    def make(n: int) -> Any:
        return kumiko_jobs.workflow(
            wf.record.step(tag=f"w{n}"), name="nightly", sequential=True
        ).enqueue(tenant="t1")

    first, second, third = make(1), make(2), make(3)
    assert second.cancel() is True
    assert second.status == RunStatus.CANCELLED and third.status == RunStatus.QUEUED
    work()
    assert tags("t1") == ["w1", "w3"]
    assert first.status == third.status == RunStatus.SUCCEEDED


@override_settings(KUMIKO_JOBS={**settings.KUMIKO_JOBS, "WORKER_HEARTBEAT": 1})
def test_cancelling_a_workflow_asks_its_running_step_to_stop(tenants: Any) -> None:
    """The running step ends cancelled (it checks ``ctx.cancel_requested``); its dependent and
    the other waiting steps never run."""
    from tests.integration.test_cancel_running import _when_running

    flow = kumiko_jobs.chain(
        jobs.cancellable.step(tag="long", key="long"), wf.record.step(tag="after", key="after")
    )
    handle = kumiko_jobs.workflow(flow, name="stoppable").enqueue(tenant="t1")
    run = run_of(handle, "long")
    thread, results = _when_running(str(run.run_id), lambda: handle.cancel(by="ops"))
    work()
    thread.join()
    assert results == [True]
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED and run.cancel_requested_by == "workflow"
    assert steps_of(handle) == {"long": "cancelled", "after": "cancelled"}
    assert tags("t1") == ["long"]
    workflow = handle.refresh()
    assert workflow.status == RunStatus.CANCELLED and workflow.steps_pending == 0


def test_a_step_closed_by_the_reconciler_is_not_advanced_again_by_its_late_finish(
    tenants: Any,
) -> None:
    """An atomic step's success commits with its body, its finish a moment later; a reconciler
    round in between closes the step first. The late finish must change nothing (the step is
    closed once). Proved able to fail: without ``state = 'released'`` in ``close``, the late
    finish counts the step a second time (steps_pending -1)."""
    member = wf.record.step(tag="m", key="m")
    handle = kumiko_jobs.workflow(
        kumiko_jobs.group([member], then=wf.summary.step(tag="cb", key="cb")), name="late"
    ).enqueue(tenant="t1")
    run = run_of(handle, "m")
    JobRun.objects.filter(pk=run.pk).update(status=RunStatus.SUCCEEDED)  # the body's commit
    assert workflow_release.reconcile() == 1
    link = workflow_release.WorkflowLink(workflow_id=run.workflow_id)
    with transaction.atomic():  # the finish, late
        workflow_release.advance(link, run.run_id.hex, RunStatus.SUCCEEDED)
    assert link.released == []
    assert JobRun.objects.filter(workflow_id=handle.workflow_id, job_name="wf.summary").count() == 1
    assert handle.refresh().steps_pending == 1  # the callback, still to run
    transport.get_queue("default").empty()
    relay_pending(grace=0)
    work()
    assert tags("t1") == ["cb"]
    assert handle.refresh().steps_pending == 0 and handle.status == RunStatus.SUCCEEDED


def test_run_jobs_runs_a_workflow_without_a_worker(tenants: Any) -> None:
    """kumiko_jobs.testing.run_jobs (users' tests): released steps are queued runs like any."""
    from kumiko_jobs.testing import run_jobs

    flow = kumiko_jobs.group(
        [wf.record.step(tag="a"), wf.unrecoverable.step(tag="b")], then=wf.summary.step(tag="cb")
    )
    handle = kumiko_jobs.workflow(flow, name="in a test").enqueue(tenant="t1")
    ran = run_jobs()
    assert len(ran) == 3
    assert sorted(tags("t1")) == ["a", "b", "cb"]
    assert handle.status == RunStatus.FAILED


def test_the_workflow_tables_are_kumikos_history_to_the_guard(tenants: Any) -> None:
    """kumiko's workflow tables hold every tenant's step arguments: to a job body (a step's
    too) they are the run history (docs/guard.md, "Two walls"): with DB_ROLES not even
    readable, without it readable and never written, like ``kumiko_jobs_jobrun``. The suite
    runs this in both modes (KUMIKO_TEST_DB_ROLES)."""
    kumiko_jobs.workflow(wf.record.step(tag="other's"), name="theirs").enqueue(tenant="t2")
    handle = kumiko_jobs.workflow(wf.peek.step(tag="p", key="p"), name="nosy").enqueue(tenant="t1")
    work()
    run = run_of(handle, "p")
    if settings.KUMIKO_JOBS["DB_ROLES"]:
        assert run.status == RunStatus.FAILED and run.error_type == "DatabaseAccessDenied"
        assert run.result is None
    else:
        assert run.status == RunStatus.SUCCEEDED  # the documented limit of the first wall


def test_a_step_cannot_write_the_workflow_tables(tenants: Any) -> None:
    """Refused in both modes: a step cannot release or close another tenant's steps."""
    theirs = kumiko_jobs.workflow(
        kumiko_jobs.chain(wf.record.step(tag="x", key="x"), wf.record.step(tag="y", key="y")),
        name="theirs",
    ).enqueue(tenant="t2")
    handle = kumiko_jobs.workflow(wf.tamper.step(tag="t", key="t"), name="bad").enqueue(tenant="t1")
    work()
    run = run_of(handle, "t")
    assert run.status == RunStatus.FAILED and run.error_type == "DatabaseAccessDenied"
    assert theirs.status == RunStatus.SUCCEEDED and tags("t2") == ["x", "y"]
