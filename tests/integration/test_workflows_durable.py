"""Workflows survive what runs survive: a worker killed mid-step (the sweep hands the step
back, its retry finishes it, the callback fires once) and two workers finishing a group's
members at the same time (the callback's counter reaches 0 once). Real ``manage.py rqworker``
processes, as in test_reliability.py."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

import kumiko_jobs
from bench import soak
from kumiko_jobs.models import JobRun, RunStatus, WorkflowStep
from tests.conftest import probes
from tests.integration.test_reliability import Workers, attempts_of, status
from tests.testapp import workflow_jobs as wf

pytestmark = pytest.mark.usefixtures("live_db", "clean_workflows")


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Workers]:
    pool = Workers(tmp_path)
    yield pool
    pool.stop_all()


@pytest.fixture
def clean_workflows(live_db: None) -> None:
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE kumiko_jobs_workflowstep, kumiko_jobs_workflow")


def callbacks(schema: str, tag: str = "cb") -> int:
    return sum(p.tag == tag for p in probes(schema))


def finished(handle: Any) -> bool:
    return handle.status != RunStatus.RUNNING


def test_a_worker_killed_mid_step_loses_nothing_and_the_callback_fires_once(
    tenants: Any, workers: Workers
) -> None:
    sleeper = soak.job("soak.sleeper").step(tag="crash", seconds=60, key="sleeper")
    flow = kumiko_jobs.group(
        [sleeper, wf.record.step(tag="m1"), wf.record.step(tag="m2")],
        then=wf.summary.step(tag="cb", key="cb"),
    )
    handle = kumiko_jobs.workflow(flow, name="crash").enqueue(tenant="t1")
    run_id = str(WorkflowStep.objects.get(workflow_id=handle.workflow_id, key="sleeper").run_id)
    victim = workers.start()
    workers.wait_for("the step to start", lambda: status(run_id) == RunStatus.RUNNING)
    victim.send_signal(signal.SIGKILL)
    assert victim.wait() == -signal.SIGKILL
    workers.start()  # the survivor: sweeps, relays, runs the retry and the callback
    workers.wait_for("the workflow to finish", lambda: finished(handle))
    assert handle.status == RunStatus.SUCCEEDED
    assert attempts_of(run_id) == [(1, "failed", "Abandoned"), (2, "succeeded", "")]
    assert callbacks("t1") == 1
    cb = JobRun.objects.get(
        pk=WorkflowStep.objects.get(workflow_id=handle.workflow_id, key="cb").run_id
    )
    assert cb.status == RunStatus.SUCCEEDED and cb.attempts == 1


def test_two_workers_finishing_members_at_once_fire_the_callback_once(
    tenants: Any, workers: Workers
) -> None:
    members = [wf.record.step(tag=f"m{i}") for i in range(60)]
    handle = kumiko_jobs.workflow(
        kumiko_jobs.group(members, then=wf.summary.step(tag="cb")), name="race"
    ).enqueue(tenant="t2")
    first, second = workers.start("--burst"), workers.start("--burst")
    workers.wait_for("the workflow to finish", lambda: finished(handle))
    first.wait()
    second.wait()
    assert callbacks("t2") == 1
    assert handle.status == RunStatus.SUCCEEDED
    workflow = handle.refresh()
    assert (workflow.steps_pending, workflow.steps_total) == (0, 61)
    # Both workers took part (else this would not test the race).
    workers_seen = set(
        JobRun.objects.filter(workflow_id=handle.workflow_id).values_list(
            "attempt_set__worker", flat=True
        )
    )
    print("workers that ran members:", workers_seen)
