"""The fenced finish after an atomic success that did not carry it: the success function
(migration 0029) marked the run ``succeeded`` in the body's transaction, and the records step
writes the rest (the attempt row, the escape-hatch audit, a workflow's next step) in its own
transaction, fenced on that success. A fence on ``running`` refused it: no attempt row, no
audit, a workflow stalled. Found by a reviewer; red without ``expected`` in the finish."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection

import kumiko_jobs
from kumiko_jobs.models import EscapeHatchUse, JobAttempt, JobRun, RunStatus, WorkflowStep
from tests.conftest import probes, work
from tests.testapp import jobs
from tests.testapp import workflow_jobs as wf

pytestmark = pytest.mark.usefixtures("live_db")

JOB_PREFIX = "fenced_atomic"


def _attempts(run_id: Any) -> list[tuple[int, str]]:
    return list(JobAttempt.objects.filter(run_id=run_id).values_list("number", "outcome"))


def test_an_atomic_workflow_step_moves_its_workflow_on(tenants: Any) -> None:
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE kumiko_jobs_workflowstep, kumiko_jobs_workflow")
    flow = kumiko_jobs.chain(
        jobs.atomic_write.step(tag="a", key="a"), wf.record.step(tag="b", key="b")
    )
    handle = kumiko_jobs.workflow(flow, name="atomic chain").enqueue(tenant="t1")
    work()
    work()
    step = WorkflowStep.objects.get(workflow_id=handle.workflow_id, key="a")
    run = JobRun.objects.get(pk=step.run_id)
    assert run.status == RunStatus.SUCCEEDED and run.duration_ms is not None
    assert _attempts(run.pk) == [(1, "succeeded")]
    assert handle.steps() == {"a": "succeeded", "b": "succeeded"}
    assert "b" in [p.tag for p in probes("t1")]


def atomic_hatch(ctx: Any, *, tag: str) -> str:
    from django.db import connection as body_connection

    jobs._probe(ctx, tag, note="raw")
    with ctx.unsafe_raw(), body_connection.cursor() as cursor:
        cursor.execute("SET LOCAL work_mem = '4MB'")
    return tag


def test_an_atomic_runs_escape_hatch_use_is_audited(tenants: Any, declare: Any) -> None:
    EscapeHatchUse.objects.all().delete()
    job = declare(atomic_hatch, atomic=True, escape_hatch=jobs._RAW)
    handle = job.enqueue(tenant="t1", tag="hatch")
    work()
    run = JobRun.objects.get(pk=handle.run_id)
    assert run.status == RunStatus.SUCCEEDED
    assert _attempts(run.pk) == [(1, "succeeded")]
    assert EscapeHatchUse.objects.filter(job_name=job.name, grant="unsafe_raw").exists()
