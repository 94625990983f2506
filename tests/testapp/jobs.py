"""Jobs used by the integration tests. Each writes a Probe row in the schema it ran in."""

from __future__ import annotations

import os

from django.db import connection

from kumiko_jobs import TenantVisibleError, Unrecoverable, job

from .models import Probe


def _probe(ctx, tag: str, note: str = "") -> Probe:
    return Probe.objects.create(
        tag=tag, schema_seen=connection.schema_name, attempt=ctx.attempt, note=note
    )


@job(tenant_visible_run=["tag"])
def probe(ctx, *, tag: str, payload: dict | None = None) -> str:
    _probe(ctx, tag, note=repr(payload) if payload else "")
    return tag


@job
def list_tags(ctx, *, tag: str) -> None:
    """Record every tag this run can see: proves a run reads only its own tenant's rows."""
    seen = sorted(Probe.objects.values_list("tag", flat=True))
    _probe(ctx, tag, note=",".join(seen))


@job(
    retries=2,
    backoff={"type": "fixed", "delay": 0},
    tenant_visible_failure={"message_key": "testapp.flaky_failed", "subject_fields": ["tag"]},
)
def flaky(ctx, *, tag: str, fail_times: int) -> None:
    _probe(ctx, tag, note=f"final={ctx.final_attempt}")
    if ctx.attempt <= fail_times:
        raise RuntimeError(f"boom on attempt {ctx.attempt}")


@job(retries=3, backoff={"type": "fixed", "delay": 0})
def gives_up(ctx, *, tag: str) -> None:
    _probe(ctx, tag)
    raise Unrecoverable("the input can never work")


@job(tenant_visible_failure={"message_key": "testapp.generic", "subject_fields": ["tag"]})
def visible_error(ctx, *, tag: str, key: str) -> None:
    _probe(ctx, tag)
    raise TenantVisibleError(key)


@job
def leaks_schema(ctx, *, tag: str, other: str) -> None:
    """Switches the connection to another schema and does not switch back."""
    _probe(ctx, tag)
    connection.set_schema(other)


@job
def crashes_connection(ctx, *, tag: str) -> None:
    """Leaves the connection in a failed transaction state."""
    _probe(ctx, tag)
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    raise RuntimeError("after using the connection")


@job
def with_followup(ctx, *, tag: str, fail: bool = False) -> None:
    _probe(ctx, tag)
    ctx.enqueue(probe, tag=f"{tag}-child")
    if fail:
        raise RuntimeError("parent fails, so the follow-up must not be sent")


@job
def defers_once(ctx, *, tag: str) -> object:
    if not Probe.objects.filter(tag=tag).exists():
        _probe(ctx, tag, note="deferring")
        return ctx.defer(1)
    _probe(ctx, f"{tag}-resumed")
    return None


@job(max_defers=2)
def defers_forever(ctx, *, tag: str) -> object:
    _probe(ctx, tag)
    return ctx.defer(0.001)


@job
def reports_pid(ctx, *, tag: str) -> None:
    _probe(ctx, tag, note=str(os.getpid()))


@job(system=True)
def system_tick(ctx, *, tag: str) -> None:
    assert connection.schema_name == "public"
