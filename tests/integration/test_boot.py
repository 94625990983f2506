"""Boot gates run inline at worker start; boot jobs are enqueued once per Redis dataset."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from kumiko_jobs import InvalidJob, transport
from kumiko_jobs.boot import BootGateFailed, enqueue_boot_jobs
from kumiko_jobs.models import JobRun, RunStatus
from kumiko_jobs.registry import build_definition
from tests.conftest import probes, work

pytestmark = pytest.mark.usefixtures("live_db")
calls: list[str] = []

JOB_PREFIX = "boot"  # conftest.declare names jobs "boot.<function>"


def _gate_ok(ctx) -> None:
    calls.append("gate")


def _gate_broken(ctx) -> None:
    raise ConnectionError("the payment provider is unreachable")


def _on_boot(ctx, **kwargs: object) -> None:
    from tests.testapp.models import Probe

    Probe.objects.create(tag="booted", schema_seen="t?")


@pytest.fixture
def declare(declare: Any) -> Iterator[Any]:
    """conftest's ``declare``, and the calls the boot jobs noted are forgotten."""
    yield declare
    calls.clear()


def test_a_boot_gate_runs_before_the_first_message(tenants, declare):
    declare(_gate_ok, system=True, boot_gate=True)
    from tests.testapp import jobs

    handle = jobs.probe.enqueue(tenant="t1", tag="after-gate")
    work()
    assert calls == ["gate"]
    gate_run = JobRun.objects.get(job_name="boot._gate_ok")
    assert gate_run.status == RunStatus.SUCCEEDED and gate_run.trigger == "boot"
    assert JobRun.objects.get(pk=handle.run_id).status == RunStatus.SUCCEEDED


def test_a_failing_boot_gate_stops_the_worker(tenants, declare):
    declare(_gate_broken, system=True, boot_gate=True)
    from tests.testapp import jobs

    handle = jobs.probe.enqueue(tenant="t1", tag="must-wait")
    with pytest.raises(BootGateFailed, match="payment provider"):
        work()
    # The message stays queued for a healthy worker; nothing ran.
    assert JobRun.objects.get(pk=handle.run_id).status == RunStatus.QUEUED
    assert transport.queue_length("default") == 1
    assert probes("t1") == []
    assert JobRun.objects.get(job_name="boot._gate_broken").status == RunStatus.FAILED


def test_run_on_boot_is_enqueued_once_per_redis_dataset(tenants, declare, redis_conn):
    declare(_on_boot, per_tenant=True, run_on_boot=True)
    assert len(enqueue_boot_jobs()) == 1
    assert enqueue_boot_jobs() == []  # a second worker starting: already done
    work()
    work()
    for schema in ("t1", "t2", "t3"):
        assert [p.tag for p in probes(schema)] == ["booted"]
    redis_conn.flushdb()  # a new Redis dataset
    assert len(enqueue_boot_jobs()) == 1


def test_boot_options_are_validated():
    with pytest.raises(InvalidJob, match="declare system=True"):
        build_definition(_gate_ok, {"boot_gate": True})
    with pytest.raises(InvalidJob, match="run_on_boot"):
        build_definition(_gate_ok, {"run_on_boot": True})
    with pytest.raises(InvalidJob, match="cannot be combined"):
        build_definition(_gate_ok, {"boot_gate": True, "system": True, "run_on_boot": True})
