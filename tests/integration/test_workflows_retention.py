"""Workflow retention: a workflow that ended before ``RETENTION_DAYS`` goes with its steps in
the same pass that deletes its runs; a running, waiting or recent one stays; a deleted
tenant's workflows are purged (or their steps' arguments blanked) with its runs."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.db import connection
from django.test import override_settings
from django.utils import timezone

import kumiko_jobs
from kumiko_jobs.history import retention
from kumiko_jobs.models import JobRun, RunStatus, Workflow, WorkflowStep
from tests.conftest import work
from tests.testapp import workflow_jobs as wf

pytestmark = pytest.mark.usefixtures("live_db", "clean_workflows")


@pytest.fixture
def clean_workflows(live_db: None) -> None:
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE kumiko_jobs_workflowstep, kumiko_jobs_workflow")


def _two_steps(name: str, schema: str = "t1") -> Any:
    flow = kumiko_jobs.chain(wf.record.step(tag="a", key="a"), wf.record.step(tag="b", key="b"))
    return kumiko_jobs.workflow(flow, name=name).enqueue(tenant=schema)


def _age(handle: Any, days: int) -> None:
    """Back-date the workflow and its runs, as if it had ended ``days`` ago."""
    then = timezone.now() - timedelta(days=days)
    Workflow.objects.filter(pk=handle.workflow_id).update(created_at=then, finished_at=then)
    JobRun.objects.filter(workflow_id=handle.workflow_id).update(queued_at=then, finished_at=then)


def test_an_old_finished_workflow_goes_with_its_steps_and_runs(tenants: Any) -> None:
    old = _two_steps("old")
    _two_steps("recent")
    work()
    running = _two_steps("running")  # its first step queued, the second waiting
    _age(old, 40)
    Workflow.objects.filter(pk=running.workflow_id).update(
        created_at=timezone.now() - timedelta(days=40)
    )
    deleted = retention.delete_expired()
    assert deleted.workflows == 1
    assert set(Workflow.objects.values_list("name", flat=True)) == {"recent", "running"}
    assert not WorkflowStep.objects.filter(workflow_id=old.workflow_id).exists()
    assert not JobRun.objects.filter(workflow_id=old.workflow_id).exists()
    assert WorkflowStep.objects.filter(workflow_id=running.workflow_id).count() == 2
    assert running.status == RunStatus.RUNNING
    work()  # the kept one still finishes
    assert running.status == RunStatus.SUCCEEDED


@override_settings(KUMIKO_JOBS={**settings.KUMIKO_JOBS, "RETENTION_DAYS": 0})
def test_retention_days_zero_keeps_every_workflow(tenants: Any) -> None:
    old = _two_steps("old")
    work()
    _age(old, 400)
    assert retention.delete_expired().workflows == 0
    assert Workflow.objects.filter(pk=old.workflow_id).exists()


def test_a_deleted_tenants_workflows_are_purged(tenants: Any) -> None:
    mine, theirs = _two_steps("mine", "t1"), _two_steps("theirs", "t2")
    work()
    retention.forget_tenant("t1")
    assert not Workflow.objects.filter(pk=mine.workflow_id).exists()
    assert not WorkflowStep.objects.filter(workflow_id=mine.workflow_id).exists()
    assert Workflow.objects.filter(pk=theirs.workflow_id).exists()


@override_settings(KUMIKO_JOBS={**settings.KUMIKO_JOBS, "TENANT_DELETION": "anonymise"})
def test_anonymising_a_tenant_blanks_its_steps_arguments(tenants: Any) -> None:
    mine, theirs = _two_steps("mine", "t1"), _two_steps("theirs", "t2")
    work()
    retention.forget_tenant("t1")
    kept = WorkflowStep.objects.filter(workflow_id=mine.workflow_id)
    assert kept.count() == 2 and all(s.kwargs == {} for s in kept)
    assert all(s.kwargs for s in WorkflowStep.objects.filter(workflow_id=theirs.workflow_id))
