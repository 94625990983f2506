"""Django 6 ``@task`` functions, run by kumiko_jobs.tasks.KumikoBackend (test_tasks_backend,
test_task_jobs, test_task_results_by_id). Found at start-up: kumiko imports every installed
app's tasks module."""

from __future__ import annotations

from typing import Any

from asgiref.sync import sync_to_async
from django.db import connection
from django.tasks import default_task_backend, task
from django.tasks.exceptions import TaskResultDoesNotExist

from kumiko_jobs.enqueueing.handle import RunHandle
from kumiko_jobs.models import JobRun

from .models import Probe


def _schema() -> str:
    return str(connection.schema_name)


@task
def add(a: int, b: int) -> int:
    """Add two numbers for the tests.

    The second paragraph is not part of the title."""
    Probe.objects.create(tag=f"add {a}+{b}", schema_seen=connection.schema_name)
    return a + b


@task(takes_context=True)
def flaky_with_context(context, tag: str) -> int:  # type: ignore[no-untyped-def]
    Probe.objects.create(tag=tag, schema_seen=connection.schema_name, attempt=context.attempt)
    if context.attempt == 1:
        raise ConnectionError("first attempt fails")
    return int(context.attempt)


@task
def always_fails() -> None:
    raise ValueError("never works")


@task
async def async_count(tag: str) -> dict:
    await Probe.objects.acreate(tag=tag, schema_seen=await sync_to_async(_schema)())
    return {"count": await Probe.objects.acount()}


@task(queue_name="low", priority=-5)
def low_lane(tag: str) -> str:
    Probe.objects.create(tag=tag, schema_seen=connection.schema_name)
    return tag


def _seen(result_id: str) -> dict[str, Any]:
    try:
        result = default_task_backend.get_result(result_id)
    except TaskResultDoesNotExist:
        return {"found": False}
    seen: dict[str, Any] = {"found": True, "status": str(result.status), "args": result.args}
    if result.is_finished and not result.errors:
        seen["value"] = result.return_value
    return seen


@task
def reads_result(result_id: str) -> dict[str, Any]:
    """Read a task result by id during the run (test_task_results_by_id)."""
    return _seen(result_id)


@task
async def areads_result(result_id: str) -> dict[str, Any]:
    """Read a task result by id during an async run (aget_result)."""
    try:
        result = await default_task_backend.aget_result(result_id)
    except TaskResultDoesNotExist:
        return {"found": False}
    return {"found": True, "status": str(result.status)}


@task
def reads_result_as(schema: str, result_id: str) -> dict[str, Any]:
    """Switch the connection to another schema, then read a result by id."""
    from django_tenants.utils import schema_context

    with schema_context(schema):
        return _seen(result_id)


@task(takes_context=True)
def reads_own_result(context) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    """Read its own result during its run."""
    return _seen(context.task_result.id)


@task
def refreshes_run(run_id: str) -> dict[str, Any]:
    """Refresh a RunHandle by id during the run."""
    try:
        row = RunHandle(run_id=run_id, job_name="", schema_name=None).refresh()
    except JobRun.DoesNotExist:
        return {"found": False}
    return {"found": True, "status": row.status, "result": row.result}


@task
def counts_runs_by_sql() -> int:
    """Read kumiko's history with SQL of its own: the tenant's login may not."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM kumiko_jobs_jobrun")
        return int(cursor.fetchone()[0])


@task
def returns(kind: str) -> Any:
    """Return a value that is JSON, or is not (test_task_jobs)."""
    values: dict[str, Any] = {
        "set": lambda: {1, 2},
        "nan": lambda: float("nan"),
        "object": object,
        "nul": lambda: {"text": "a\x00b"},
        "tuple": lambda: (1, [2, 3]),
        "huge": lambda: "x" * 100_000,
    }
    Probe.objects.create(tag=f"returns {kind}", schema_seen=connection.schema_name)
    return values[kind]()


@task
def undocumented() -> None:
    pass
