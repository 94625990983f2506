"""Deferral, the sweep of abandoned runs, retention, signals and the management command."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.test import override_settings
from django.utils import timezone

from kumiko_jobs import signals, transport
from kumiko_jobs.models import JobAttempt, JobRun, RejectedMessage, RunStatus
from kumiko_jobs.transport import keys as transport_keys
from kumiko_jobs.worker.sweep import sweep
from tests.conftest import probes, work
from tests.testapp import jobs

pytestmark = pytest.mark.usefixtures("live_db")


def _no_worker_beats_for_it() -> None:
    """Liveness data collected for an hour, in which no kumiko worker beats for the run: the
    proof the sweep needs that its worker is gone (an overdue run a worker may still execute
    is left to that worker; docs/reliability.md, Timeouts)."""

    transport.connection_for("default").set(transport_keys.WORKERS_SINCE_KEY, time.time() - 3600)


def test_deferral_resumes_the_same_run_in_the_same_tenant(tenants):
    handle = jobs.defers_once.enqueue(tenant="t2", tag="d")
    work()
    run = JobRun.objects.get(pk=handle.run_id)
    assert run.status == RunStatus.DEFERRED
    assert run.scheduled_for is not None and run.started_at is not None
    assert run.scheduled_for >= run.started_at + timedelta(seconds=1)
    assert transport.scheduled_job_ids("default")  # waiting in rq-scheduler

    work(scheduler_rounds=1)

    run.refresh_from_db()
    assert run.status == RunStatus.SUCCEEDED
    assert run.attempts == 1  # a deferral is not an attempt
    assert run.defer_count == 1
    assert [p.tag for p in probes("t2")] == ["d", "d-resumed"]
    assert {p.schema_seen for p in probes("t2")} == {"t2"}
    assert list(JobAttempt.objects.filter(run=run).values_list("outcome", flat=True)) == [
        "deferred",
        "succeeded",
    ]


def test_max_defers_fails_the_run_for_good(tenants):
    handle = jobs.defers_forever.enqueue(tenant="t1", tag="again")
    work(scheduler_rounds=4)
    run = JobRun.objects.get(pk=handle.run_id)
    assert run.status == RunStatus.FAILED
    assert "max_defers=2" in run.error_message, list(
        JobAttempt.objects.values_list("outcome", "error_message")
    )
    assert len(probes("t1")) == 3  # first run + two resumptions


def test_sweep_retries_an_abandoned_run_with_attempts_left(tenants):
    handle = jobs.flaky.enqueue(tenant="t1", tag="abandoned", fail_times=0)
    transport.get_queue("default").empty()  # the message died with its worker
    # What a worker killed mid-run leaves behind: running, started long ago.
    JobRun.objects.filter(pk=handle.run_id).update(
        status=RunStatus.RUNNING, attempts=1, started_at=timezone.now() - timedelta(hours=2)
    )
    _no_worker_beats_for_it()

    result = sweep()

    assert (result.retried, result.abandoned) == (1, 0)
    run = JobRun.objects.get(pk=handle.run_id)
    assert run.status == RunStatus.QUEUED and run.error_type == "Abandoned"
    work()
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCEEDED and run.attempts == 2
    assert list(JobAttempt.objects.filter(run=run).values_list("number", "outcome")) == [
        (1, "failed"),
        (2, "succeeded"),
    ]


def test_sweep_fails_an_abandoned_run_on_its_last_attempt(tenants):
    handle = jobs.probe.enqueue(tenant="t1", tag="last")
    transport.get_queue("default").empty()
    JobRun.objects.filter(pk=handle.run_id).update(
        status=RunStatus.RUNNING, attempts=1, started_at=timezone.now() - timedelta(hours=2)
    )
    _no_worker_beats_for_it()
    recent = jobs.probe.enqueue(tenant="t1", tag="still-running")
    JobRun.objects.filter(pk=recent.run_id).update(
        status=RunStatus.RUNNING, attempts=1, started_at=timezone.now()
    )

    result = sweep()

    assert (result.retried, result.abandoned) == (0, 1)
    run = JobRun.objects.get(pk=handle.run_id)
    assert run.status == RunStatus.FAILED and "abandoned" in run.error_message
    assert JobRun.objects.get(pk=recent.run_id).status == RunStatus.RUNNING


@override_settings(KUMIKO_JOBS={"RETENTION_DAYS": 30})
def test_retention_deletes_only_old_finished_runs(tenants):
    old = jobs.probe.enqueue(tenant="t1", tag="old")
    new = jobs.probe.enqueue(tenant="t1", tag="new")
    waiting = jobs.probe.enqueue_in(3600, tenant="t1", tag="waiting")
    work()
    long_ago = timezone.now() - timedelta(days=31)
    JobRun.objects.filter(pk=old.run_id).update(finished_at=long_ago)
    JobRun.objects.filter(pk=waiting.run_id).update(queued_at=long_ago)
    RejectedMessage.objects.create(reason="old poison")
    RejectedMessage.objects.update(received_at=long_ago)

    result = sweep()

    assert result.deleted_runs >= 1 and result.deleted_rejections == 1
    remaining = set(JobRun.objects.values_list("pk", flat=True))
    assert {str(pk).replace("-", "") for pk in remaining} == {new.run_id, waiting.run_id}
    assert not JobAttempt.objects.filter(run_id=old.run_id).exists()


def test_a_raising_signal_receiver_never_fails_the_run(tenants, caplog):
    seen = []

    def broken(**kwargs):
        seen.append(kwargs["outcome"])
        raise RuntimeError("receiver bug")

    signals.job_succeeded.connect(broken)
    try:
        handle = jobs.probe.enqueue(tenant="t1", tag="sig")
        work()
    finally:
        signals.job_succeeded.disconnect(broken)
    assert seen == ["succeeded"]
    assert JobRun.objects.get(pk=handle.run_id).status == RunStatus.SUCCEEDED
    assert "receiver bug" in caplog.text


@pytest.mark.parametrize("target", ["t1", "t2"])
def test_a_receiver_that_enqueues_after_a_run_gets_a_real_run(tenants, target):
    """A ``job_succeeded`` receiver runs after the run's history is written (in public,
    unguarded: docs/signals). An enqueue there is an ordinary one: a row and a message, run by
    the next worker, in its own tenant or another. (It used to join the run's follow-ups after
    they had been written: for the run's tenant the message went out without a row and was
    refused, the enqueue lost; for another tenant it was refused as a follow-up.)"""
    handles = []

    def chain(**kwargs):
        # Once: the run it enqueues succeeds too, and would enqueue again.
        if kwargs["job_name"] == jobs.probe.name and not handles:
            handles.append(jobs.probe.enqueue(tenant=target, tag="from-receiver"))

    signals.job_succeeded.connect(chain)
    try:
        jobs.probe.enqueue(tenant="t1", tag="first")
        work()
    finally:
        signals.job_succeeded.disconnect(chain)
    (handle,) = handles
    assert JobRun.objects.get(pk=handle.run_id).status == RunStatus.SUCCEEDED
    tags = [p.tag for p in probes("t1")] + [p.tag for p in probes("t2")]
    assert sorted(tags) == ["first", "from-receiver"]
    assert [p.tag for p in probes(target)][-1] == "from-receiver"
    assert not RejectedMessage.objects.exists()


def test_signals_follow_the_state_machine(tenants):
    events = []

    def record(signal_name):
        def receiver(**kwargs):
            events.append((signal_name, kwargs["job_name"], kwargs["attempt"]))

        return receiver

    receivers = {
        name: record(name) for name in ("job_queued", "job_started", "job_failed", "job_succeeded")
    }
    for name, receiver in receivers.items():
        getattr(signals, name).connect(receiver)
    try:
        jobs.flaky.enqueue(tenant="t1", tag="s", fail_times=1)
        work(scheduler_rounds=1)
    finally:
        for name, receiver in receivers.items():
            getattr(signals, name).disconnect(receiver)
    assert events == [
        ("job_queued", "testapp.flaky", 1),
        ("job_started", "testapp.flaky", 1),
        ("job_failed", "testapp.flaky", 1),
        ("job_started", "testapp.flaky", 2),
        ("job_succeeded", "testapp.flaky", 2),
    ]


def test_management_command_enqueue_list_and_sweep(tenants, capsys):
    call_command(
        "kumiko_jobs", "enqueue", "testapp.probe", "--tenant", "t3", "--kwargs", '{"tag": "cli"}'
    )
    call_command("kumiko_jobs", "list")
    call_command("kumiko_jobs", "sweep")
    out = capsys.readouterr().out
    assert "queued run" in out and "testapp.probe" in out and "retried 0" in out
    work()
    assert [p.tag for p in probes("t3")] == ["cli"]
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="unexpected keyword"):
        call_command(
            "kumiko_jobs",
            "enqueue",
            "testapp.probe",
            "--tenant",
            "t3",
            "--kwargs",
            '{"tag": "x", "nope": 1}',
        )


def test_housekeeping_runs_as_a_system_cron_job(tenants):
    from kumiko_jobs.definition.registry import registry
    from kumiko_jobs.enqueueing.schedules import fire, schedule_id

    sweeper = registry.get("kumiko_jobs.sweep_abandoned")
    assert sweeper.system and sweeper.cron == "* * * * *"
    handle = jobs.probe.enqueue(tenant="t1", tag="stuck")
    transport.get_queue("default").empty()
    JobRun.objects.filter(pk=handle.run_id).update(
        status=RunStatus.RUNNING, attempts=1, started_at=timezone.now() - timedelta(hours=2)
    )
    _no_worker_beats_for_it()

    firing = fire(schedule_id(sweeper))  # what the scheduler does when the alarm rings
    assert firing.message is not None
    transport.push(firing.message)
    work()

    tick = JobRun.objects.get(job_name="kumiko_jobs.sweep_abandoned")
    assert tick.status == RunStatus.SUCCEEDED and tick.trigger == "cron"
    stuck = JobRun.objects.get(pk=handle.run_id)
    assert stuck.status == RunStatus.FAILED and "abandoned" in stuck.error_message
