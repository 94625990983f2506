"""The pauses of a tenant that hold the system runs its runs started, through real workers on
real Redis and PostgreSQL: a job paused in one tenant, and what a tenant's deletion leaves.

A system run a tenant's run started (``@job(system=True, tenant_may_start=True)``) waits in
that tenant's bucket (``Envelope.flow_tenant``), so ``pause --job X --tenant t1`` holds t1's
system runs of X, and nobody else's (test_flow_tenant_started.py covers the tenant's pause).
"""

from __future__ import annotations

from collections.abc import Iterator
from io import StringIO
from typing import Any

import pytest
from django.conf import settings
from django.core.management import call_command
from django.db import connection
from django.db.models import Q
from django.test import override_settings

from kumiko_jobs import transport
from kumiko_jobs.models import FlowPause, JobAttempt, JobRun, RunStatus
from tests.conftest import work
from tests.testapp import jobs

pytestmark = pytest.mark.usefixtures("live_db")

SYSTEM = jobs.tenant_started_system.name
LEAVING = "t_leaving"


def command(*args: str) -> str:
    out = StringIO()
    call_command("kumiko_jobs", *args, stdout=out)
    return out.getvalue()


def start_one_each() -> None:
    """t1's run starts two system runs, t2's one (only the starters run here)."""
    jobs.starts_system_runs.enqueue(tenant="t1", tag="t1", count=2)
    jobs.starts_system_runs.enqueue(tenant="t2", tag="t2")


def statuses() -> dict[str, list[str]]:
    """The system runs' statuses by whose flow they are in ("" for the system's own)."""
    found: dict[str, list[str]] = {}
    for run in JobRun.objects.filter(job_name=SYSTEM).order_by("queued_at"):
        found.setdefault(run.flow_schema, []).append(run.status)
    return found


def test_a_job_paused_in_one_tenant_holds_that_tenant_s_system_runs_of_it(
    tenants: Any,
) -> None:
    """``pause --job tenant_started_system --tenant t1`` holds the system runs t1's runs
    started (queued, no attempt, shown as paused by the job in t1) and neither t2's nor the
    system's own; ``resume`` lets them run, in order. Proven able to fail: with the messages in
    the system's bucket (``message_for``'s bucket of ``envelope.schema``) t1's ran while the
    job was paused in t1."""
    from kumiko_jobs.admin.display import RunDisplay

    assert command("pause", "--job", SYSTEM, "--tenant", "t1") == f"paused {SYSTEM} in t1\n"
    start_one_each()
    own = jobs.tenant_started_system.enqueue(tag="system")
    work()
    assert statuses() == {
        "t1": [RunStatus.QUEUED] * 2,
        "t2": [RunStatus.SUCCEEDED],
        "": [RunStatus.SUCCEEDED],
    }
    held = list(JobRun.objects.filter(job_name=SYSTEM, flow_schema="t1"))
    assert not any(r.attempt_set.exists() for r in held)
    assert all(f"{SYSTEM} in t1" in RunDisplay().status_label(r) for r in held)
    assert JobRun.objects.get(pk=own.run_id).result == "public"

    assert command("resume", "--job", SYSTEM, "--tenant", "t1") == f"resumed {SYSTEM} in t1\n"
    work()
    runs = list(JobRun.objects.filter(job_name=SYSTEM, flow_schema="t1").order_by("queued_at"))
    assert [r.status for r in runs] == [RunStatus.SUCCEEDED] * 2, [r.error_message for r in runs]
    assert [r.payload["tag"] for r in runs] == ["t1-0", "t1-1"]
    first, second = (r.attempt_set.get() for r in runs)
    assert first.started_at <= second.started_at  # in their order
    assert all(r.result == "public" for r in runs)  # still system runs


def test_a_job_paused_in_another_tenant_does_not_hold_them(tenants: Any) -> None:
    """The denied side: the pause of the job in t2 holds t2's system run only."""
    assert command("pause", "--job", SYSTEM, "--tenant", "t2") == f"paused {SYSTEM} in t2\n"
    start_one_each()
    work()
    assert statuses() == {"t1": [RunStatus.SUCCEEDED] * 2, "t2": [RunStatus.QUEUED]}
    command("resume", "--job", SYSTEM, "--tenant", "t2")
    work()
    assert statuses() == {"t1": [RunStatus.SUCCEEDED] * 2, "t2": [RunStatus.SUCCEEDED]}


@pytest.fixture
def leaving(tenants: Any) -> Iterator[Any]:
    """A tenant with a real schema, for a test to delete (its schema is dropped after)."""
    from example_project.customers.models import Client

    tenant = Client(schema_name=LEAVING, name="Leaving")
    tenant.save()  # creates and migrates the schema
    try:
        yield tenant
    finally:
        for left in Client.objects.filter(schema_name=LEAVING):
            left.delete(force_drop=True)
        with connection.cursor() as cursor:
            cursor.execute(f'DROP SCHEMA IF EXISTS "{LEAVING}" CASCADE')


def redis_pauses(redis: Any) -> set[str]:
    """Every member of the pause sets the dequeue reads."""
    found: set[str] = set()
    for key in redis.scan_iter(match=f"{transport.keys.PAUSE_PREFIX}*"):
        found |= {m.decode() for m in redis.smembers(key)}
    return found


@pytest.mark.parametrize("mode", ["purge", "anonymise"])
def test_deleting_a_paused_tenant_removes_its_pauses_and_leaves_nothing_parked(
    leaving: Any, redis_conn: Any, mode: str
) -> None:
    """The leaving tenant is paused, and its system job in it; its own run and the two system
    runs its run started wait. Deleting it (the tenant model's ``delete()``) removes both
    pauses, from PostgreSQL and Redis, and t3's pause stays. A worker then leaves nothing
    waiting: its own run fails closed (no tenant), the system runs never run (purge: their
    rows are gone; anonymise: cancelled, and none of the tenant's data comes back into the
    scrubbed rows). Proven able to fail: without ``pauses.forget_tenant`` the pauses stayed
    and the three messages stayed parked, in both modes; without the cancellation in
    ``retention.forget_tenant`` the anonymised system runs ran after the deletion."""
    assert (
        command("pause", "--job", SYSTEM, "--tenant", LEAVING) == f"paused {SYSTEM} in {LEAVING}\n"
    )
    jobs.starts_system_runs.enqueue(tenant=LEAVING, tag="card-4242", count=2)
    jobs.starts_system_runs.enqueue(tenant="t2", tag="t2")
    work()
    assert statuses() == {LEAVING: [RunStatus.QUEUED] * 2, "t2": [RunStatus.SUCCEEDED]}
    assert command("pause", "--tenant", LEAVING) == f"paused tenant {LEAVING}\n"
    assert command("pause", "--tenant", "t3") == "paused tenant t3\n"
    own = jobs.probe.enqueue(tenant=LEAVING, tag="card-4242-own")
    work()
    assert JobRun.objects.get(pk=own.run_id).status == RunStatus.QUEUED
    assert {LEAVING, f"{SYSTEM}\t{LEAVING}"} <= redis_pauses(redis_conn)

    with override_settings(KUMIKO_JOBS={**settings.KUMIKO_JOBS, "TENANT_DELETION": mode}):
        leaving.delete(force_drop=True)
    assert list(FlowPause.objects.values_list("schema_name", flat=True)) == ["t3"]
    assert redis_pauses(redis_conn) == {"t3"}  # the deleted tenant's are gone at once

    work()
    assert transport.waiting_job_ids("default") == []  # nothing parked, nothing held
    started = JobRun.objects.filter(flow_schema=LEAVING)
    if mode == "purge":
        assert not started.exists() and not JobRun.objects.filter(schema_name=LEAVING).exists()
    else:
        assert [r.status for r in started] == [RunStatus.CANCELLED] * 2
        assert not JobAttempt.objects.filter(run__in=started).exists()  # never ran
        assert JobRun.objects.get(pk=own.run_id).status == RunStatus.FAILED  # fails closed
        rows = list(JobRun.objects.filter(Q(flow_schema=LEAVING) | Q(schema_name=LEAVING)).values())
        assert "card-4242" not in repr(rows)  # not bare digits: ids and times may hold them
    assert statuses()["t2"] == [RunStatus.SUCCEEDED]
