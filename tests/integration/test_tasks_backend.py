"""Django 6's task framework on kumiko (``kumiko_jobs.tasks.KumikoBackend``), with real
workers, Redis and PostgreSQL: ``@task`` functions become kumiko runs in their tenant."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.db import transaction
from django.tasks import TaskResultStatus, task_backends
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist, TaskResultMismatch
from django.utils import timezone
from django_tenants.utils import schema_context

from kumiko_jobs import transport
from kumiko_jobs.models import JobRun, RunStatus
from kumiko_jobs.operations import cancel_run
from kumiko_jobs.tasks import KumikoBackend
from tests.conftest import probes, work
from tests.testapp import tasks

pytestmark = pytest.mark.usefixtures("live_db")

backend = task_backends["default"]


def test_the_backend_is_kumikos_and_says_what_it_supports() -> None:
    assert isinstance(backend, KumikoBackend)
    assert backend.supports_defer
    assert backend.supports_async_task
    assert backend.supports_get_result
    assert backend.supports_priority


def test_a_task_runs_in_the_tenant_it_was_enqueued_in(tenants: Any) -> None:
    with schema_context("t2"):
        result = tasks.add.enqueue(2, 3)
    # What Django's own tests expect of a queued result (tests/tasks, dummy backend).
    assert result.status == TaskResultStatus.READY and not result.is_finished
    assert result.args == [2, 3] and result.kwargs == {}
    assert result.enqueued_at is not None and result.backend == "default"
    assert result.started_at is None and result.last_attempted_at is None
    assert result.finished_at is None and result.errors == [] and result.worker_ids == []
    with pytest.raises(ValueError, match="not finished"):
        result.return_value  # noqa: B018
    run = JobRun.objects.get(pk=result.id)
    assert run.schema_name == "t2" and run.status == RunStatus.QUEUED

    work()

    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 5
    assert result.errors == [] and result.attempts == 1
    assert result.finished_at is not None and result.started_at is not None
    assert [(p.tag, p.schema_seen) for p in probes("t2")] == [("add 2+3", "t2")]
    assert probes("t1") == [] and probes("t3") == []
    fetched = tasks.add.get_result(result.id)
    assert fetched.return_value == 5 and fetched.task.func is tasks.add.func


def test_a_task_enqueued_from_public_without_a_tenant_is_refused(tenants: Any) -> None:
    """The error names the way in a Django task has (the tenant's context around the call), not
    ``tenant=``, which Django's ``enqueue()`` cannot take (it was "Pass tenant=" before)."""
    with pytest.raises(InvalidTask, match="from the public schema") as refused:
        tasks.add.enqueue(1, 1)
    message = str(refused.value)
    assert "tenant_context(tenant)" in message and "schema_context(" in message
    assert "Pass tenant=" not in message and "takes no tenant=" in message
    assert JobRun.objects.count() == 0 and transport.queue_length("default") == 0


def test_retries_and_context(tenants: Any) -> None:
    with schema_context("t1"):
        result = tasks.flaky_with_context.enqueue(tag="ctx")
    work(scheduler_rounds=2)
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 2  # TaskContext.attempt is the run's attempt
    assert result.attempts == 2
    assert [e.exception_class for e in result.errors] == [ConnectionError]
    assert "first attempt fails" in result.errors[0].traceback
    assert [p.attempt for p in probes("t1")] == [1, 2]


def test_a_failing_task_is_failed_with_one_error_per_attempt(tenants: Any) -> None:
    with schema_context("t3"):
        result = tasks.always_fails.enqueue()
    work(scheduler_rounds=3)
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert [e.exception_class for e in result.errors] == [ValueError] * 3  # RETRIES=2
    with pytest.raises(ValueError, match="Task failed"):
        result.return_value  # noqa: B018


def test_an_async_task_runs_under_the_guard_in_its_tenant(tenants: Any) -> None:
    with schema_context("t1"):
        result = async_to_sync(tasks.async_count.aenqueue)(tag="aio")
    work()
    fetched = async_to_sync(tasks.async_count.aget_result)(result.id)
    assert fetched.status == TaskResultStatus.SUCCESSFUL
    assert fetched.return_value == {"count": 1}
    assert [(p.tag, p.schema_seen) for p in probes("t1")] == [("aio", "t1")]


def test_queue_name_priority_and_run_after(tenants: Any) -> None:
    with schema_context("t1"):
        first = tasks.add.enqueue(1, 0)
        urgent = tasks.add.using(priority=10).enqueue(9, 9)
        low = tasks.low_lane.enqueue("slow")
        later = tasks.add.using(run_after=timezone.now() + timedelta(hours=1)).enqueue(0, 0)
    runs = {r.run_id.hex: r for r in JobRun.objects.all()}
    # priority 10: a higher level than the earlier enqueue's 0 (the fair dequeue's), so it
    # starts first; RQ counts both as waiting.
    assert transport.get_queue("default").count == 2
    assert runs[urgent.id].priority == 10 and runs[first.id].priority == 0
    assert runs[low.id].queue == "low" and transport.queue_length("low") == 1
    assert runs[later.id].scheduled_for is not None
    assert runs[later.id].rq_job_id in transport.scheduled_job_ids("default")
    assert tasks.add.get_result(urgent.id).task.priority == 10
    assert tasks.low_lane.get_result(low.id).task.queue_name == "low"
    assert backend.get_result(later.id).task.run_after is not None

    work()
    work("low")
    started = JobRun.objects.filter(pk__in=[first.id, urgent.id]).order_by("started_at")
    assert [r.run_id.hex for r in started] == [urgent.id, first.id]
    assert tasks.add.get_result(urgent.id).return_value == 18
    assert tasks.low_lane.get_result(low.id).return_value == "slow"
    assert backend.get_result(later.id).status == TaskResultStatus.READY


def test_cancelled_and_unknown_results(tenants: Any) -> None:
    with schema_context("t2"):
        result = tasks.add.enqueue(4, 4)
    assert cancel_run(JobRun.objects.get(pk=result.id))
    work()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert [e.exception_class_path for e in result.errors] == ["kumiko_jobs.tasks.TaskCancelled"]
    assert probes("t2") == []

    with pytest.raises(TaskResultMismatch):
        tasks.always_fails.get_result(result.id)
    for unknown in ("not-a-uuid", "0" * 32):
        with pytest.raises(TaskResultDoesNotExist):
            backend.get_result(unknown)


def test_an_invalid_queue_is_refused_and_a_rolled_back_enqueue_leaves_nothing(
    tenants: Any,
) -> None:
    with pytest.raises(InvalidTask, match="Queue 'nowhere' is not valid"):
        tasks.add.using(queue_name="nowhere")
    with schema_context("t1"), transaction.atomic():
        tasks.add.enqueue(1, 2)
        transaction.set_rollback(True)
    assert JobRun.objects.count() == 0
    assert transport.queue_length("default") == 0  # pushed on commit only
