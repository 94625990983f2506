"""emit() runs listeners for the emitting tenant only (issue 17, item 3).

Real PostgreSQL (three tenant schemas), real Redis, a real RQ worker. What the other tenants
hold is read through a second database connection, not through the ORM the jobs used.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from django.db import connection, transaction
from django_tenants.utils import schema_context, tenant_context
from psycopg import sql

from kumiko_jobs import InvalidJob, emit, transport
from kumiko_jobs.models import JobRun, RunStatus
from tests.conftest import TENANTS, work

pytestmark = pytest.mark.usefixtures("live_db")
EVENT = "limits.invoice_paid"

JOB_PREFIX = "limits"  # conftest.declare names jobs "limits.<function>"


def _record(ctx: Any, kind: str, tag: str) -> None:
    from tests.testapp.models import Probe

    Probe.objects.create(tag=f"{kind}:{tag}", schema_seen=connection.schema_name, note="emit")


def fan_listener(ctx: Any, *, tag: str) -> None:
    _record(ctx, "fan", tag)


def plain_listener(ctx: Any, *, tag: str) -> None:
    _record(ctx, "plain", tag)


def system_listener(ctx: Any, *, tag: str) -> None:
    pass


def tags_seen_by_another_connection(schema: str) -> list[str]:
    """The schema's probe rows as a separate PostgreSQL session sees them (committed data)."""
    s = connection.settings_dict
    with psycopg.connect(
        dbname=s["NAME"],
        user=s["USER"],
        password=s["PASSWORD"],
        host=s["HOST"],
        port=s["PORT"] or None,
    ) as other:
        rows = other.execute(
            sql.SQL("SELECT tag FROM {}.testapp_probe ORDER BY tag").format(sql.Identifier(schema))
        ).fetchall()
    return [row[0] for row in rows]


def test_a_tenant_event_runs_its_listeners_in_that_tenant_only(tenants, declare):
    declare(fan_listener, on=EVENT, per_tenant=True)
    declare(plain_listener, on=EVENT)
    with tenant_context(tenants["t1"]), transaction.atomic():
        handles = emit(EVENT, tag="t1-payload")
    work()
    assert tags_seen_by_another_connection("t2") == []
    assert tags_seen_by_another_connection("t3") == []
    assert tags_seen_by_another_connection("t1") == ["fan:t1-payload", "plain:t1-payload"]
    assert sorted((h.job_name, h.schema_name) for h in handles) == [
        ("limits.fan_listener", "t1"),
        ("limits.plain_listener", "t1"),
    ]
    # No fan-out parent in the public schema, and every run belonged to t1.
    runs = JobRun.objects.filter(job_name__startswith="limits.")
    assert sorted(runs.values_list("schema_name", "status")) == [
        ("t1", RunStatus.SUCCEEDED),
        ("t1", RunStatus.SUCCEEDED),
    ]


def test_tenant_given_explicitly_is_the_event_owner(tenants, declare):
    declare(fan_listener, on=EVENT, per_tenant=True)
    emit(EVENT, tenant="t2", tag="for-t2")
    work()
    assert [tags_seen_by_another_connection(s) for s in TENANTS] == [[], ["fan:for-t2"], []]


def test_calibration_a_public_event_does_fan_out_and_the_reader_sees_it(tenants, declare):
    """The same listener and the same second-connection reader: from the public schema (an
    operator's command, a cron job) the fan-out reaches every tenant, so the empty t2/t3 above
    are a real result, not a blind reader."""
    declare(fan_listener, on=EVENT, per_tenant=True)
    with schema_context("public"):
        handles = emit(EVENT, tag="broadcast")
    assert [(h.job_name, h.schema_name) for h in handles] == [("limits.fan_listener", None)]
    work()
    for schema in TENANTS:
        assert tags_seen_by_another_connection(schema) == ["fan:broadcast"]


def test_a_tenant_event_never_starts_a_system_listener(tenants, declare):
    declare(fan_listener, on=EVENT, per_tenant=True)
    declare(system_listener, on=EVENT, system=True)
    refused = pytest.raises(InvalidJob, match="is a system job, and a tenant's event never")
    with tenant_context(tenants["t1"]), refused:
        emit(EVENT, tag="t1-payload")
    # All or nothing: the fan listener, checked first, was not enqueued either.
    assert not JobRun.objects.exists()
    assert transport.queue_length("default") == 0
    # From the public schema both run: a system run and a fan-out.
    with schema_context("public"):
        handles = emit(EVENT, tag="ops")
    assert sorted(h.job_name for h in handles) == ["limits.fan_listener", "limits.system_listener"]


def test_a_public_event_with_tenant_listeners_needs_a_tenant(tenants, declare):
    declare(fan_listener, on=EVENT, per_tenant=True)
    declare(plain_listener, on=EVENT)
    refused = pytest.raises(InvalidJob, match=r"listener 'limits\.plain_listener' runs in a tenant")
    with schema_context("public"), refused:
        emit(EVENT, tag="x")
    assert not JobRun.objects.exists()


def emits_from_a_run(ctx: Any, *, tag: str) -> None:
    emit(EVENT, tag=tag)


def test_an_event_emitted_inside_a_tenant_run_stays_in_that_tenant(tenants, declare):
    declare(fan_listener, on=EVENT, per_tenant=True)
    emitter = declare(emits_from_a_run)
    handle = emitter.enqueue(tenant="t3", tag="from-a-run")
    work()
    assert JobRun.objects.get(pk=handle.run_id).status == RunStatus.SUCCEEDED
    assert [tags_seen_by_another_connection(s) for s in TENANTS] == [[], [], ["fan:from-a-run"]]


def test_an_event_emitted_inside_a_tenant_run_never_starts_a_system_listener(tenants, declare):
    declare(system_listener, on=EVENT, system=True)
    emitter = declare(emits_from_a_run)
    handle = emitter.enqueue(tenant="t3", tag="from-a-run")
    work()
    run = JobRun.objects.get(pk=handle.run_id)
    assert run.status == RunStatus.FAILED and "is a system job" in run.error_message
    assert JobRun.objects.count() == 1


def test_a_per_tenant_job_enqueued_in_a_tenant_runs_for_that_tenant_only(tenants, declare):
    """As emit() and ctx.enqueue(): from a tenant's request (its connection on the tenant's
    schema) a per_tenant job enqueued without tenant= is that tenant's run; a view passing its
    user's input no longer writes it into every tenant's schema. Only the public schema fans
    out (calibration: the same job, the same reader)."""
    fan = declare(fan_listener, per_tenant=True)
    with tenant_context(tenants["t1"]), transaction.atomic():
        handles = [fan.enqueue(tag="t1-input"), fan.enqueue_in(0, tag="t1-later")]
    assert [h.schema_name for h in handles] == ["t1", "t1"]
    work(scheduler_rounds=1)
    seen = [tags_seen_by_another_connection(s) for s in TENANTS]
    assert seen == [["fan:t1-input", "fan:t1-later"], [], []]
    assert not JobRun.objects.filter(schema_name="").exists()  # no fan-out parent

    with schema_context("public"):
        (parent,) = [fan.enqueue(tag="broadcast")]
    assert parent.schema_name is None
    work()
    for schema in TENANTS:
        assert "fan:broadcast" in tags_seen_by_another_connection(schema)
