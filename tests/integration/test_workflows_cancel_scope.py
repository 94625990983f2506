"""A workflow's cancel is scoped as its reads are: from a tenant's context (a tenant's request
in ``schema_context``, a run's body) only that tenant's workflows can be cancelled; another
tenant's id, or a system workflow's, is answered as an id no workflow has (False), and that
workflow goes on. Operators (the public schema) cancel any."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django_tenants.utils import schema_context

import kumiko_jobs
from kumiko_jobs.enqueueing.workflows import WorkflowHandle
from kumiko_jobs.models import JobRun, RunStatus, Workflow
from tests.testapp import workflow_jobs as wf

pytestmark = pytest.mark.usefixtures("live_db", "clean_workflows")


@pytest.fixture
def clean_workflows(live_db: None) -> None:
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE kumiko_jobs_workflowstep, kumiko_jobs_workflow")


def _of(tenant: str | None) -> Any:
    step = wf.record if tenant else wf.system_step  # a system workflow: system steps
    flow = kumiko_jobs.chain(step.step(tag="a"), step.step(tag="b"))
    return kumiko_jobs.workflow(flow, name=f"of {tenant}").enqueue(tenant=tenant)


def _still_going(handle: Any) -> None:
    row = Workflow.objects.get(pk=handle.workflow_id)
    assert row.status in (RunStatus.QUEUED, RunStatus.RUNNING)
    statuses = set(
        JobRun.objects.filter(workflow_id=handle.workflow_id).values_list("status", flat=True)
    )
    assert RunStatus.CANCELLED not in statuses


@pytest.mark.parametrize("how", ["cancel_workflow", "handle"])
def test_a_tenant_cannot_cancel_another_tenants_workflow(tenants: Any, how: str) -> None:
    theirs = _of("t2")
    with schema_context("t1"):
        if how == "handle":
            forged = WorkflowHandle(theirs.workflow_id, "of t2", "t1")
            with pytest.raises(Workflow.DoesNotExist):
                forged.refresh()  # reads were scoped already
            assert forged.cancel(by="someone of t1") is False
        else:
            assert kumiko_jobs.cancel_workflow(theirs.workflow_id, by="someone of t1") is False
    _still_going(theirs)


def test_a_tenant_cannot_cancel_a_system_workflow(tenants: Any) -> None:
    system = _of(None)
    with schema_context("t1"):
        assert kumiko_jobs.cancel_workflow(system.workflow_id) is False
    _still_going(system)


def test_a_tenant_cancels_its_own_and_an_operator_any(tenants: Any) -> None:
    own, other = _of("t1"), _of("t2")
    with schema_context("t1"):
        assert kumiko_jobs.cancel_workflow(own.workflow_id, by="someone of t1") is True
    assert Workflow.objects.get(pk=own.workflow_id).status == RunStatus.CANCELLED
    assert kumiko_jobs.cancel_workflow(other.workflow_id, by="ops") is True  # public schema
    assert Workflow.objects.get(pk=other.workflow_id).status == RunStatus.CANCELLED
