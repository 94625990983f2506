"""Django 6 ``@task`` functions, run by kumiko_jobs.tasks.KumikoBackend (test_tasks_backend)."""

from __future__ import annotations

from asgiref.sync import sync_to_async
from django.db import connection
from django.tasks import task

from .models import Probe


def _schema() -> str:
    return str(connection.schema_name)


@task
def add(a: int, b: int) -> int:
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
