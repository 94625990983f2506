"""Fan-out, cron, events and concurrency control, on real Redis, RQ and rq-scheduler."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime

import pytest
from django.db import connection, connections, transaction
from django.test import override_settings
from django_tenants.utils import tenant_context

from kumiko_jobs import emit, signals, transport
from kumiko_jobs.core.envelope import Envelope
from kumiko_jobs.definition.cron import latest_tick, seconds_until_next
from kumiko_jobs.definition.registry import registry
from kumiko_jobs.enqueueing.messages import message_for
from kumiko_jobs.enqueueing.schedules import schedule_id, sync_schedules
from kumiko_jobs.models import JobRun, RunStatus
from tests.conftest import probes, work
from tests.testapp import jobs

pytestmark = pytest.mark.usefixtures("live_db")
TENANTS = ("t1", "t2", "t3")


def test_per_tenant_fan_out_runs_once_in_every_tenant(tenants):
    handle = jobs.fanned.enqueue(tag="all")
    assert handle.schema_name is None
    work()
    work()
    parent = JobRun.objects.get(pk=handle.run_id)
    assert parent.status == RunStatus.SUCCEEDED and parent.schema_name == ""
    children = JobRun.objects.filter(parent_run_id=handle.run_id)
    assert sorted(children.values_list("schema_name", flat=True)) == list(TENANTS)
    assert set(children.values_list("status", flat=True)) == {RunStatus.SUCCEEDED}
    for schema in TENANTS:
        assert [(p.tag, p.schema_seen) for p in probes(schema)] == [("all", schema)]


def test_a_retried_fan_out_creates_no_duplicates(tenants):
    handle = jobs.fanned.enqueue(tag="again")
    body = transport.get_queue("default").jobs[0].args[0]
    work()
    work()
    # The same fan-out message delivered again after the parent finished, and once more as a
    # retry of a parent that is queued again (e.g. its worker died after pushing the children).
    JobRun.objects.filter(pk=handle.run_id).update(status=RunStatus.QUEUED)
    from kumiko_jobs.core.envelope import decode

    transport.push(message_for(jobs.fanned, decode(body), 0))
    work()
    work()
    assert JobRun.objects.filter(parent_run_id=handle.run_id).count() == 3
    for schema in TENANTS:
        assert len(probes(schema)) == 1


def test_fan_out_for_one_tenant_is_a_plain_run(tenants):
    handle = jobs.fanned.enqueue(tenant="t2", tag="one")
    work()
    assert JobRun.objects.get(pk=handle.run_id).status == RunStatus.SUCCEEDED
    assert [p.schema_seen for p in probes("t2")] == ["t2"] and probes("t1") == []


def test_cron_schedules_are_registered_idempotently(tenants):
    first = sync_schedules()
    expected = {schedule_id(d) for d in registry if d.cron}
    assert set(first.created) == expected
    assert sync_schedules().unchanged == first.created  # nothing to do the second time
    spec = transport.cron_entries()[schedule_id(jobs.nightly_cleanup)]
    assert spec.timezone == "Europe/Berlin" and spec.cron == "0 3 * * *"

    # A schedule whose job no longer exists is removed; a changed one is updated.
    stale = transport.CronSpec(
        schedule_id="kj-cron-testapp_removed",
        cron="0 * * * *",
        timezone="UTC",
        body=spec.body,
        queue="default",
        timeout=60,
    )
    transport.register_cron(stale, 3600)
    changed = transport.cron_entries()[schedule_id(jobs.every_minute)]
    transport.cancel_scheduled(changed.schedule_id)
    transport.register_cron(
        transport.CronSpec(
            changed.schedule_id, "*/5 * * * *", "UTC", changed.body, changed.queue, changed.timeout
        ),
        60,
    )
    result = sync_schedules()
    assert result.removed == ("kj-cron-testapp_removed",)
    assert result.updated == (schedule_id(jobs.every_minute),)
    assert transport.cron_entries()[schedule_id(jobs.every_minute)].cron == "* * * * *"


def test_registering_the_cron_schedules_warns_nothing(tenants):
    """rq-scheduler's cron() asks the crontab package for a first time in a way that prints a
    FutureWarning (eight lines at every ``rqscheduler`` start, a newcomer's pass found); that
    time is replaced and each tick is kumiko's own, so the registration silences it, and only
    it: the same call outside still warns (calibration)."""
    import warnings

    from rq_scheduler.utils import get_next_scheduled_time

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        created = sync_schedules().created
        assert created
        assert not [w for w in caught if issubclass(w.category, FutureWarning)], caught
        get_next_scheduled_time("* * * * *")
    assert [w.category for w in caught] == [FutureWarning]


def test_cron_timezone_is_respected():
    # 01:30 UTC in January is 02:30 in Berlin: the 03:00 Berlin tick is 30 minutes away.
    winter = datetime(2026, 1, 15, 1, 30, tzinfo=UTC)
    assert seconds_until_next("0 3 * * *", "Europe/Berlin", winter) == 30 * 60
    # In July Berlin is UTC+2: 00:30 UTC is 02:30 local, again 30 minutes away.
    summer = datetime(2026, 7, 15, 0, 30, tzinfo=UTC)
    assert seconds_until_next("0 3 * * *", "Europe/Berlin", summer) == 30 * 60


@pytest.mark.parametrize(
    ("now", "tick"),
    [
        (datetime(2026, 1, 15, 3, 0, 0, tzinfo=UTC), datetime(2026, 1, 15, 3, 0, tzinfo=UTC)),
        (datetime(2026, 1, 15, 3, 0, 41, tzinfo=UTC), datetime(2026, 1, 15, 3, 0, tzinfo=UTC)),
        # Before its second, a tick has not fired: a ring then takes the tick before (whose
        # row, already written, makes it push nothing), never the one still ahead (issue 23).
        (
            datetime(2026, 1, 15, 2, 59, 59, 999999, tzinfo=UTC),
            datetime(2026, 1, 15, 2, 59, tzinfo=UTC),
        ),
    ],
)
def test_the_tick_is_the_latest_time_the_crontab_fired(now, tick):
    assert latest_tick("* * * * *", "UTC", now) == tick


def test_the_tick_is_read_in_the_job_s_time_zone():
    # 03:10 in Berlin in January is 02:10 UTC: the 03:00 Berlin tick was 02:00 UTC.
    assert latest_tick("0 3 * * *", "Europe/Berlin", datetime(2026, 1, 15, 2, 10, tzinfo=UTC)) == (
        datetime(2026, 1, 15, 2, 0, tzinfo=UTC)
    )


def test_a_cron_tick_fans_out_once_even_if_its_alarm_rings_twice(tenants, redis_conn):
    into_minute = time.time() % 60
    if into_minute > 50:  # both rings must fall in one minute, else the second is a new tick
        time.sleep(60 - into_minute + 0.5)
    sync_schedules()
    alarm = schedule_id(jobs.every_minute)
    # Two schedulers that both rang the same tick (rq-scheduler's lock prevents it).
    for _ in range(2):
        redis_conn.zadd("rq:scheduler:scheduled_jobs", {alarm: int(time.time()) - 1})
        assert transport.move_due_scheduled_jobs("default") == 1
    assert transport.queue_length("default") == 1
    work()
    work()
    parents = JobRun.objects.filter(job_name="testapp.every_minute", schema_name="")
    assert parents.count() == 1
    assert parents.get().trigger == "cron"
    for schema in TENANTS:
        assert [(p.tag, p.note) for p in probes(schema)] == [("cron", "cron")]


def test_two_schedulers_never_hold_the_lock_at_once(tenants, redis_conn):
    assert transport.acquire_scheduler_lock("default") is True
    assert transport.acquire_scheduler_lock("default") is False
    redis_conn.delete("rq:scheduler_lock")


def test_events_run_matching_jobs_on_commit_only(tenants):
    with tenant_context(tenants["t1"]):
        with pytest.raises(RuntimeError), transaction.atomic():
            emit("invoices.paid", invoice_id=1, status="paid")
            raise RuntimeError("rolled back")
        assert JobRun.objects.count() == 0
        with transaction.atomic():
            handles = emit("invoices.paid", invoice_id=2, status="paid")
            emit("invoices.paid", invoice_id=3, status="open")  # where= does not match on_paid
        assert transport.queue_length("default") == 3
    assert sorted(h.job_name for h in handles) == [
        "testapp.on_any_invoice_event",
        "testapp.on_paid",
    ]
    work()
    assert sorted((p.tag, p.note) for p in probes("t1")) == [
        ("any-2", "invoices.paid"),
        ("any-3", "invoices.paid"),
        ("paid-2", "invoices.paid"),
    ]
    assert probes("t2") == []


def test_skip_returns_a_skipped_handle_while_a_run_is_waiting(tenants):
    first = jobs.skip_while_busy.enqueue(tenant="t1", tag="first")
    second = jobs.skip_while_busy.enqueue(tenant="t1", tag="second")
    other_tenant = jobs.skip_while_busy.enqueue(tenant="t2", tag="other")
    assert not first.skipped and second.skipped and not other_tenant.skipped
    work()
    assert [p.tag for p in probes("t1")] == ["first"]
    assert jobs.skip_while_busy.enqueue(tenant="t1", tag="after").skipped is False


def test_replace_cancels_the_waiting_run(tenants):
    dropped = []

    def on_drop(**kwargs):
        dropped.append(kwargs["run_id"])

    signals.job_dropped.connect(on_drop)
    try:
        old = jobs.latest_wins.enqueue(tenant="t1", tag="old")
        new = jobs.latest_wins.enqueue(tenant="t1", tag="new")
        work()
    finally:
        signals.job_dropped.disconnect(on_drop)
    assert JobRun.objects.get(pk=old.run_id).status == RunStatus.CANCELLED
    assert JobRun.objects.get(pk=new.run_id).status == RunStatus.SUCCEEDED
    assert old.run_id in dropped
    assert [p.tag for p in probes("t1")] == ["new"]


def test_debounce_runs_only_the_last_enqueue_after_the_quiet_period(tenants):
    handles = [jobs.debounced.enqueue(tenant="t1", tag=f"d{i}") for i in range(3)]
    assert transport.queue_length("default") == 0  # all delayed by the debounce
    statuses = [JobRun.objects.get(pk=h.run_id).status for h in handles]
    assert statuses == [RunStatus.CANCELLED, RunStatus.CANCELLED, RunStatus.QUEUED]
    work(scheduler_rounds=3)
    assert [p.tag for p in probes("t1")] == ["d2"]


def test_sequential_admits_one_run_per_job_and_tenant_in_order(tenants):
    for i in range(3):
        jobs.one_at_a_time.enqueue(tenant="t1", tag=f"s{i}")
    jobs.one_at_a_time.enqueue(tenant="t2", tag="t2-s0")
    # All four wait on the queue (the cap is the dequeue's: transport/fair_caps.py); t2 is
    # not held back by t1.
    assert transport.queue_length("default") == 4
    for _ in range(4):
        work()
    assert [p.tag for p in probes("t1")] == ["s0", "s1", "s2"]
    assert [p.tag for p in probes("t2")] == ["t2-s0"]


@override_settings(KUMIKO_JOBS={"TENANT_CONCURRENCY": 1})
def test_tenant_concurrency_lets_other_tenants_pass(tenants):
    for i in range(3):
        jobs.probe.enqueue(tenant="t1", tag=f"a{i}")
    jobs.probe.enqueue(tenant="t2", tag="b0")
    assert transport.queue_length("default") == 4  # the cap holds them at the dequeue
    for _ in range(4):
        work()
    assert [p.tag for p in probes("t1")] == ["a0", "a1", "a2"]
    assert [p.tag for p in probes("t2")] == ["b0"]


def test_max_per_tenant_is_atomic_under_concurrent_enqueues(tenants):
    results: list[bool] = []
    barrier = threading.Barrier(8)

    def enqueue_one(i: int) -> None:
        try:
            barrier.wait()
            with transaction.atomic():
                handle = jobs.capped.enqueue(tenant="t1", tag=f"c{i}")
            results.append(handle.capped)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=enqueue_one, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [False, False] + [True] * 6
    runs = JobRun.objects.filter(job_name="testapp.capped")
    assert runs.filter(status=RunStatus.QUEUED).count() == 2
    # Each refused enqueue is on record as capped (not "skipped": that is concurrency="skip").
    assert runs.filter(status=RunStatus.CAPPED).count() == 6
    assert connection.schema_name == "public"


def test_a_per_tenant_cron_without_system_or_per_tenant_is_refused():
    from kumiko_jobs import InvalidJob
    from kumiko_jobs.definition.options import build_definition

    def report(ctx):
        return None

    with pytest.raises(InvalidJob, match="declare system=True"):
        build_definition(report, {"cron": "0 3 * * *"})
    with pytest.raises(InvalidJob, match="not a crontab"):
        build_definition(report, {"cron": "every day", "system": True})
    with pytest.raises(InvalidJob, match="IANA"):
        build_definition(report, {"cron": "0 3 * * *", "system": True, "timezone": "Mars/Base"})
    with pytest.raises(InvalidJob, match="boot_gate"):
        build_definition(report, {"boot_gate": True, "run_on_boot": True})
    with pytest.raises(InvalidJob, match="debounce"):
        build_definition(report, {"concurrency": "debounce"})
    assert isinstance(Envelope, type)


def test_schedule_command_reports_what_it_did(tenants, capsys):
    from django.core.management import call_command

    call_command("kumiko_jobs", "schedule")
    call_command("kumiko_jobs", "schedule")
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("created: kj-cron-")
    assert out[4] == "created: -" and out[7].startswith("unchanged: kj-cron-")
