"""A system step's fan-in from tenants' workflows (``ctx.workflow_results``): allowed only to
a system job that declares ``cross_tenant_reads`` (and reported to the audit), refused to one
that does not and to a tenant's job, through real workers, both ways."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection

import kumiko_jobs
from kumiko_jobs.models import EscapeHatchUse, JobRun, RunStatus, WorkflowStep
from tests.conftest import work
from tests.testapp import workflow_jobs as wf

pytestmark = pytest.mark.usefixtures("live_db", "clean_workflows")


@pytest.fixture
def clean_workflows(live_db: None) -> None:
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE kumiko_jobs_workflowstep, kumiko_jobs_workflow")


@pytest.fixture
def tenant_workflows(tenants: Any) -> dict[str, str]:
    """A finished two-step workflow in t1 and in t2 (the second step of t2's fails)."""
    handles = {
        "t1": kumiko_jobs.workflow(
            kumiko_jobs.chain(wf.record.step(tag="a", key="a"), wf.record.step(tag="b", key="b")),
            name="per-tenant",
        ).enqueue(tenant="t1"),
        "t2": kumiko_jobs.workflow(
            kumiko_jobs.chain(
                wf.record.step(tag="a", key="a"), wf.unrecoverable.step(tag="b", key="b")
            ),
            name="per-tenant",
        ).enqueue(tenant="t2"),
    }
    work()
    return {schema: h.workflow_id for schema, h in handles.items()}


def _only_run(handle: Any) -> JobRun:
    step = WorkflowStep.objects.get(workflow_id=handle.workflow_id)
    return JobRun.objects.get(pk=step.run_id)


def test_a_system_step_with_the_grant_reads_every_tenants_results(
    tenant_workflows: dict[str, str],
) -> None:
    ids = [tenant_workflows["t1"], tenant_workflows["t2"]]
    handle = kumiko_jobs.workflow(wf.fan_in.step(workflow_ids=ids), name="fan-in").enqueue()
    work()
    run = _only_run(handle)
    assert run.status == RunStatus.SUCCEEDED, run.error_message
    assert run.result == {
        tenant_workflows["t1"]: {
            "a": {"tag": "a", "schema": "t1"},
            "b": {"tag": "b", "schema": "t1"},
        },
        tenant_workflows["t2"]: {"a": {"tag": "a", "schema": "t2"}, "b": None},
    }
    assert EscapeHatchUse.objects.filter(job_name="wf.fan_in", grant="cross_tenant_reads").exists()


def test_a_system_step_without_the_grant_is_refused(tenant_workflows: dict[str, str]) -> None:
    ids = [tenant_workflows["t1"]]
    handle = kumiko_jobs.workflow(
        wf.fan_in_undeclared.step(workflow_ids=ids), name="fan-in"
    ).enqueue()
    work()
    run = _only_run(handle)
    assert run.status == RunStatus.FAILED
    assert run.error_type == "InvalidJob"
    assert "without declaring it" in run.error_message
    assert "cross_tenant_reads" in run.error_message
    assert run.result is None


def test_a_tenants_step_is_refused_even_with_the_grant(tenant_workflows: dict[str, str]) -> None:
    handle = kumiko_jobs.workflow(
        wf.fan_in_tenant.step(workflow_ids=[tenant_workflows["t2"]]), name="fan-in"
    ).enqueue(tenant="t1")
    work()
    run = _only_run(handle)
    assert run.status == RunStatus.FAILED
    assert "system job's fan-in" in run.error_message
    assert run.result is None
