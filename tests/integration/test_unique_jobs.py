"""Unique jobs (@job(unique=..., unique_for=...)), end to end: real PostgreSQL, Redis and
workers. The race between two enqueues is settled by PostgreSQL's unique index, tried here with
two real connections racing in two threads; the calibration tests show the same calls make two
runs when the job is not unique (so the checks can fail)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connection, connections, transaction

from kumiko_jobs import transport
from kumiko_jobs.models import JobRun, RejectedMessage, RunStatus
from tests.conftest import work
from tests.testapp import jobs
from tests.testapp.models import Probe

pytestmark = pytest.mark.usefixtures("live_db")


def _runs(job: Any, schema: str = "t1") -> list[JobRun]:
    return list(JobRun.objects.filter(job_name=job.name, schema_name=schema).order_by("queued_at"))


def _probes(schema: str) -> list[Probe]:
    from django_tenants.utils import schema_context

    with schema_context(schema):
        return list(Probe.objects.order_by("id"))


def test_a_second_enqueue_of_the_same_key_returns_the_waiting_run(tenants):
    first = jobs.unique_sync.enqueue(tenant="t1", invoice_id=7, note="a")
    again = jobs.unique_sync.enqueue(tenant="t1", invoice_id=7, note="b")
    # Defaults count with their value: force=False spelled out is the same run.
    spelled = jobs.unique_sync.enqueue(tenant="t1", invoice_id=7, force=False)
    other_key = jobs.unique_sync.enqueue(tenant="t1", invoice_id=8)
    other_tenant = jobs.unique_sync.enqueue(tenant="t2", invoice_id=7)

    assert not first.deduplicated
    assert again.run_id == spelled.run_id == first.run_id and again.deduplicated
    assert again.status == RunStatus.QUEUED
    assert other_key.run_id != first.run_id and not other_key.deduplicated
    assert other_tenant.run_id != first.run_id
    assert len(_runs(jobs.unique_sync)) == 2  # 7 and 8
    assert transport.get_queue("default").count == 3  # one message per run, none for the copies
    work()
    assert sorted(p.tag for p in _probes("t1")) == ["unique-7", "unique-8"]
    assert [p.note for p in _probes("t1") if p.tag == "unique-7"] == ["a"]


def test_after_the_run_finished_the_same_key_is_a_new_run(tenants):
    first = jobs.unique_sync.enqueue(tenant="t1", invoice_id=7)
    work()
    second = jobs.unique_sync.enqueue(tenant="t1", invoice_id=7)
    assert second.run_id != first.run_id and not second.deduplicated
    work()
    assert [p.tag for p in _probes("t1")] == ["unique-7", "unique-7"]


def test_unique_for_returns_a_finished_run_inside_the_window(tenants):
    first = jobs.unique_hourly.enqueue(tenant="t1", account="acme")
    work()
    assert JobRun.objects.get(pk=first.run_id).status == RunStatus.SUCCEEDED
    again = jobs.unique_hourly.enqueue(tenant="t1", account="acme")
    assert again.run_id == first.run_id and again.deduplicated
    assert again.status == RunStatus.SUCCEEDED
    # unique=True: every argument is part of the key.
    full = jobs.unique_hourly.enqueue(tenant="t1", account="acme", full=True)
    assert full.run_id != first.run_id
    # Outside the window (moved back by two hours), the key is free again.
    JobRun.objects.filter(pk=first.run_id).update(
        finished_at=JobRun.objects.get(pk=first.run_id).finished_at.replace(year=2000)
    )
    later = jobs.unique_hourly.enqueue(tenant="t1", account="acme")
    assert later.run_id not in (first.run_id, full.run_id)


def test_a_cancelled_run_does_not_hold_its_key(tenants):
    from kumiko_jobs.operations import cancel_run

    first = jobs.unique_sync.enqueue(tenant="t1", invoice_id=7)
    cancel_run(JobRun.objects.get(pk=first.run_id))
    second = jobs.unique_sync.enqueue(tenant="t1", invoice_id=7)
    assert second.run_id != first.run_id


def test_an_enqueue_rolled_back_leaves_the_key_free(tenants):
    with pytest.raises(RuntimeError), transaction.atomic():
        jobs.unique_sync.enqueue(tenant="t1", invoice_id=7)
        raise RuntimeError("the request failed")
    handle = jobs.unique_sync.enqueue(tenant="t1", invoice_id=7)
    assert not handle.deduplicated and len(_runs(jobs.unique_sync)) == 1


def _race(job: Any, *, blocks: bool, **kwargs: Any) -> tuple[list[Any], list[BaseException]]:
    """Two enqueues of ``job`` on two connections, the first left uncommitted while the second
    runs: the second's lookup cannot see the first row (READ COMMITTED), so only PostgreSQL's
    index can stop it. With ``blocks``, the first commits only once PostgreSQL shows the second
    waiting on a lock (pg_stat_activity), so the order is certain, not timed."""
    inserted, release = threading.Event(), threading.Event()
    handles: list[Any] = []
    errors: list[BaseException] = []

    def first() -> None:
        try:
            with transaction.atomic():
                handles.append(job.enqueue(tenant="t1", **kwargs))
                inserted.set()
                release.wait(60)
        except BaseException as exc:  # reported by the test, not lost in the thread
            errors.append(exc)
        finally:
            inserted.set()
            connections.close_all()

    def second() -> None:
        try:
            inserted.wait(60)
            with transaction.atomic():
                handles.append(job.enqueue(tenant="t1", **kwargs))
        except BaseException as exc:
            errors.append(exc)
        finally:
            release.set()
            connections.close_all()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    if blocks:
        _wait_until_an_insert_waits_on_a_lock()
        release.set()
    for thread in threads:
        thread.join(60)
    return handles, errors


def _wait_until_an_insert_waits_on_a_lock() -> None:
    for _ in range(600):
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND query LIKE 'INSERT INTO \"kumiko_jobs_jobrun\"%%'"
            )
            if cursor.fetchone()[0]:
                return
        threading.Event().wait(0.05)
    raise AssertionError("the second enqueue never waited for the first one's row")


def test_two_concurrent_enqueues_of_one_key_make_one_run(tenants):
    handles, errors = _race(jobs.unique_sync, blocks=True, invoice_id=7)
    assert errors == []
    rows = _runs(jobs.unique_sync)
    assert len(rows) == 1
    assert [h.run_id for h in handles] == [rows[0].run_id.hex] * 2
    assert [h.deduplicated for h in handles] == [False, True]
    work()
    assert [p.tag for p in _probes("t1")] == ["unique-7"]


def test_calibration_two_concurrent_enqueues_of_a_plain_job_make_two_runs(tenants):
    handles, errors = _race(jobs.probe, blocks=False, tag="same")
    assert errors == [] and len(handles) == 2
    assert len(_runs(jobs.probe)) == 2


def test_the_same_unique_follow_up_twice_in_one_attempt_is_one_run(tenants):
    parent = jobs.enqueue_unique_followups.enqueue(tenant="t1", invoice_id=9)
    work()
    assert JobRun.objects.get(pk=parent.run_id).status == RunStatus.SUCCEEDED
    rows = _runs(jobs.unique_sync)
    assert len(rows) == 1 and rows[0].status == RunStatus.SUCCEEDED
    assert [p.note for p in _probes("t1")] == ["followup-1"]
    assert not RejectedMessage.objects.exists()


def test_a_follow_up_whose_key_an_active_run_holds_is_not_created(tenants):
    # Waiting an hour in the scheduler: queued, so its key is taken while the parent runs.
    waiting = jobs.unique_sync.enqueue_in(3600, tenant="t1", invoice_id=9, note="request")
    parent = jobs.enqueue_unique_followups.enqueue(tenant="t1", invoice_id=9)
    work()
    assert JobRun.objects.get(pk=parent.run_id).status == RunStatus.SUCCEEDED
    assert [r.run_id.hex for r in _runs(jobs.unique_sync)] == [waiting.run_id]
    # No message was pushed for the follow-up without a row (one would be refused, recorded).
    assert not RejectedMessage.objects.exists()
    assert _probes("t1") == []


def test_the_key_is_on_the_row_and_only_unique_jobs_have_one(tenants):
    jobs.unique_sync.enqueue(tenant="t1", invoice_id=1)
    jobs.probe.enqueue(tenant="t1", tag="plain")
    keys = dict(JobRun.objects.values_list("job_name", "unique_key"))
    assert len(keys[jobs.unique_sync.name]) == 64 and keys[jobs.probe.name] is None
    assert connection.schema_name == "public"
