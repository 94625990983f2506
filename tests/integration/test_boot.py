"""Boot gates run inline at worker start; boot jobs are enqueued once per Redis dataset."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from kumiko_jobs import InvalidJob, transport
from kumiko_jobs.core.exceptions import BootGateFailed
from kumiko_jobs.definition.options import build_definition
from kumiko_jobs.models import JobRun, RunStatus
from kumiko_jobs.worker.boot import enqueue_boot_jobs
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


# --- issue 14: boot safety -------------------------------------------------------------------


def test_a_boot_job_survives_a_worker_that_died_before_its_push(tenants, declare, redis_conn):
    from kumiko_jobs.transport.keys import BOOT_DATASET_KEY as DATASET_KEY
    from kumiko_jobs.worker.boot import boot_run_id
    from kumiko_jobs.worker.relay import relay_pending

    definition = declare(_on_boot, per_tenant=True, run_on_boot=True)
    [run_id] = enqueue_boot_jobs()
    # The state a worker leaves when it dies after committing the run and before the push:
    # the row is there, the message is not.
    transport.get_queue("default").empty()
    assert transport.queue_length("default") == 0
    token = redis_conn.get(DATASET_KEY).decode()
    assert run_id == boot_run_id(definition.name, token)
    # The next worker to start enqueues nothing twice; the relay pushes the committed run.
    assert enqueue_boot_jobs() == []
    assert relay_pending(grace=0).pushed == 1
    work()
    work()
    for schema in ("t1", "t2", "t3"):
        assert [p.tag for p in probes(schema)] == ["booted"]
    assert JobRun.objects.filter(job_name=definition.name, schema_name="").count() == 1


def test_a_boot_job_is_enqueued_by_the_next_worker_if_the_first_died_before_its_row(
    tenants, declare, redis_conn
):

    declare(_on_boot, per_tenant=True, run_on_boot=True)
    # The first worker got as far as identifying the dataset, then died.
    transport.boot_dataset_token("first-worker")
    assert len(enqueue_boot_jobs()) == 1
    assert enqueue_boot_jobs() == []


def _gate_slow(ctx) -> None:
    import time

    time.sleep(3)
    calls.append("slow gate done")


def _gate_hangs(ctx) -> None:
    import time

    time.sleep(60)
    calls.append("hung gate woke up")


def _gate_not_ready_once(ctx) -> object:
    calls.append("gate")
    if calls.count("gate") == 1:
        return ctx.defer(0.2)
    return None


BOOT_SETTINGS = {"DB_GUARD": "enforce", "DEFAULT_RETRIES": 0, "PUSH_FAILURE_PAUSE": 0}


def test_a_boot_gate_that_runs_long_is_warned_about(tenants, declare, caplog):
    from django.test import override_settings

    declare(_gate_slow, system=True, boot_gate=True)
    with override_settings(KUMIKO_JOBS={**BOOT_SETTINGS, "BOOT_GATE_WARN_AFTER": 1}):
        work()
    assert calls == ["slow gate done"]
    assert any("has been running for 1 s" in r.getMessage() for r in caplog.records)


def test_a_boot_gate_is_bounded_by_its_timeout(tenants, declare):
    from django.test import override_settings

    declare(_gate_hangs, system=True, boot_gate=True)
    with (
        override_settings(KUMIKO_JOBS={**BOOT_SETTINGS, "BOOT_GATE_TIMEOUT": 1}),
        pytest.raises(BootGateFailed, match="JobTimeoutException"),
    ):
        work()
    assert calls == []
    run = JobRun.objects.get(job_name="boot._gate_hangs")
    assert run.status == RunStatus.FAILED and run.error_type == "JobTimeoutException"


def test_a_boot_gate_runs_only_on_workers_of_its_queue(tenants, declare):
    declare(_gate_broken, system=True, boot_gate=True, queue="low")
    from tests.testapp import jobs

    handle = jobs.probe.enqueue(tenant="t1", tag="default-queue")
    work("default")  # this worker does not serve "low": the gate is not its concern
    assert JobRun.objects.get(pk=handle.run_id).status == RunStatus.SUCCEEDED
    assert not JobRun.objects.filter(job_name="boot._gate_broken").exists()
    with pytest.raises(BootGateFailed, match="payment provider"):
        work("low")


def test_a_deferral_in_a_boot_gate_means_not_ready_yet(tenants, declare, redis_conn):
    declare(_gate_not_ready_once, system=True, boot_gate=True)
    work()
    assert calls == ["gate", "gate"]  # waited, ran again, and the worker started
    run = JobRun.objects.get(job_name="boot._gate_not_ready_once")
    assert run.status == RunStatus.SUCCEEDED and run.defer_count == 1
    # No resumption message anywhere: not on a queue, not with rq-scheduler.
    assert transport.scheduled_job_ids("default") == []
    assert transport.queue_length("default") == 0
    assert redis_conn.keys("rq:job:kj-*") == []
