"""job.enqueue_many(): many runs in one INSERT and one push, all or nothing on bad input, run
by a real worker; unique jobs deduplicated like enqueue(); the admission modes refused."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.conf import settings
from django.db import connection, transaction
from django.test.utils import override_settings

from kumiko_jobs import transport
from kumiko_jobs.core.exceptions import InvalidJob
from kumiko_jobs.models import JobRun, RunStatus
from kumiko_jobs.worker.relay import relay_pending
from tests.conftest import probes, redis_round_trips, work
from tests.testapp import jobs

pytestmark = pytest.mark.usefixtures("live_db")
JOB_PREFIX = "many"


@contextmanager
def statements() -> Iterator[list[str]]:
    """The SQL of every statement this connection runs (through Django's execute wrappers,
    which COPY goes through as well)."""
    seen: list[str] = []

    def wrapper(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        seen.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(wrapper):
        yield seen


def _statuses(handles: list[Any]) -> list[str]:
    by_id = {
        r.run_id.hex: r.status for r in JobRun.objects.filter(pk__in=[h.run_id for h in handles])
    }
    return [by_id[h.run_id] for h in handles]


def test_many_runs_one_insert_one_push_run_by_a_worker(tenants):
    items = [{"tag": f"bulk-{i}"} for i in range(50)]
    with (
        statements() as queries,
        redis_round_trips() as trips,
        transaction.atomic(),
    ):
        handles = jobs.probe.enqueue_many(items, tenant="t1")
        pushed_before_commit = trips["trips"]
    assert pushed_before_commit == 0  # nothing before the commit
    writes = [q for q in queries if q.startswith(("INSERT", "COPY"))]
    # One COPY of the 50 rows (a job without unique=: bulk_rows.py).
    assert len(writes) == 1 and writes[0].startswith('COPY "kumiko_jobs_jobrun"')
    # One pipeline for the 50 messages (RQ's enqueue_many; the process's first push also asks
    # Redis its version, once), and a later bulk is one round trip whatever its size.
    assert trips["trips"] <= 2
    with redis_round_trips() as few:
        jobs.probe.enqueue_many([{"tag": "few-0"}, {"tag": "few-1"}], tenant="t1")
    assert few["trips"] == 1
    assert transport.queue_length("default") == 52
    assert len({h.run_id for h in handles}) == 50
    work()
    assert _statuses(handles) == [RunStatus.SUCCEEDED] * 50
    assert sorted(p.tag for p in probes("t1")) == sorted(
        [i["tag"] for i in items] + ["few-0", "few-1"]
    )
    assert probes("t2") == []


def test_a_bad_item_refuses_the_whole_call_and_names_its_index(tenants):
    items: list[dict[str, Any]] = [{"tag": "ok-0"}, {"tag": "ok-1"}, {"tag": float("nan")}]
    with pytest.raises(InvalidJob, match=r"item 2: .*nan"):
        jobs.probe.enqueue_many(items, tenant="t1")
    with pytest.raises(InvalidJob, match=r"item 1: .*unexpected"):
        jobs.probe.enqueue_many([{"tag": "a"}, {"tag": "b", "nope": 1}], tenant="t1")
    with pytest.raises(InvalidJob, match=r"item 0: .*dict"):
        jobs.probe.enqueue_many(["tag"], tenant="t1")  # type: ignore[list-item]
    with pytest.raises(InvalidJob, match="list"):
        jobs.probe.enqueue_many({"tag": "x"}, tenant="t1")  # type: ignore[arg-type]
    with pytest.raises(InvalidJob, match="tenant="):
        jobs.probe.enqueue_many([{"tag": "x"}])
    assert JobRun.objects.count() == 0
    assert transport.queue_length("default") == 0


def test_a_rolled_back_transaction_leaves_neither_rows_nor_messages(tenants):
    with pytest.raises(RuntimeError), transaction.atomic():
        jobs.probe.enqueue_many([{"tag": "gone"}] * 3, tenant="t1")
        raise RuntimeError("the request failed")
    assert JobRun.objects.count() == 0
    assert transport.queue_length("default") == 0


def test_unique_items_reuse_the_covering_runs(tenants):
    existing = jobs.unique_sync.enqueue(tenant="t1", invoice_id=1)
    with statements() as queries:
        handles = jobs.unique_sync.enqueue_many(
            [
                {"invoice_id": 1},
                {"invoice_id": 2},
                {"invoice_id": 2, "note": "same key"},
                {"invoice_id": 3},
            ],
            tenant="t1",
        )
    # Unique jobs keep the INSERT ... ON CONFLICT DO NOTHING (COPY cannot skip a taken key).
    inserts = [q for q in queries if q.startswith(("INSERT", "COPY"))]
    assert len(inserts) == 1 and "ON CONFLICT DO NOTHING" in inserts[0]
    assert handles[0].run_id == existing.run_id and handles[0].deduplicated
    assert not handles[1].deduplicated and not handles[3].deduplicated
    # An earlier item of the same batch took key 2: the INSERT skipped the second one.
    assert handles[2].run_id == handles[1].run_id and handles[2].deduplicated
    assert JobRun.objects.filter(job_name=jobs.unique_sync.name).count() == 3
    assert transport.queue_length("default") == 3  # no message for a deduplicated item
    work()
    assert sorted(p.tag for p in probes("t1")) == ["unique-1", "unique-2", "unique-3"]


def test_unique_for_window_covers_a_finished_run(tenants):
    first = jobs.unique_hourly.enqueue(tenant="t1", account="acme")
    work()
    handles = jobs.unique_hourly.enqueue_many(
        [{"account": "acme"}, {"account": "other"}], tenant="t1"
    )
    assert handles[0].run_id == first.run_id and handles[0].status == RunStatus.SUCCEEDED
    assert handles[1].run_id != first.run_id


@pytest.mark.parametrize("job_name", ["skip_while_busy", "latest_wins", "debounced", "capped"])
def test_admission_modes_are_refused_with_the_way_out(tenants, job_name):
    with pytest.raises(InvalidJob, match=r"Call enqueue\(\) for each item"):
        getattr(jobs, job_name).enqueue_many([{"tag": "x"}], tenant="t1")
    assert JobRun.objects.count() == 0


def test_sequential_applies_to_every_item(tenants):
    handles = jobs.one_at_a_time.enqueue_many([{"tag": f"s{i}"} for i in range(3)], tenant="t1")
    work()
    assert _statuses(handles) == [RunStatus.SUCCEEDED] * 3


def _unreachable_redis() -> dict[str, Any]:
    from example_project.devservices import free_port

    url = f"redis://127.0.0.1:{free_port()}/0"
    return {name: {**cfg, "URL": url} for name, cfg in settings.RQ_QUEUES.items()}


def test_a_failed_push_leaves_the_runs_to_the_relay(tenants, caplog):
    with (
        override_settings(RQ_QUEUES=_unreachable_redis()),
        caplog.at_level(logging.WARNING),
        transaction.atomic(),
    ):
        handles = jobs.probe.enqueue_many([{"tag": f"r{i}"} for i in range(4)], tenant="t2")
    assert "committed but not all pushed" in caplog.text
    assert _statuses(handles) == [RunStatus.QUEUED] * 4
    assert relay_pending(grace=0).pushed == 4
    work()
    assert _statuses(handles) == [RunStatus.SUCCEEDED] * 4
    assert sorted(p.tag for p in probes("t2")) == ["r0", "r1", "r2", "r3"]


def bulk_followups_with_a_bad_last_item(ctx: Any, *, tag: str) -> None:
    """Inside a run: two good items and one whose message outgrows MAX_ENVELOPE_BYTES (its
    arguments are JSON, so only the size check, made per item, refuses it). The job catches
    the refusal, as a job that goes on without the batch would, and records it."""
    from tests.testapp.models import Probe

    items: list[dict[str, Any]] = [{"tag": f"{tag}-0"}, {"tag": f"{tag}-1"}]
    items.append({"tag": f"{tag}-big", "payload": {"big": "x" * (512 * 1024)}})
    try:
        jobs.probe.enqueue_many(items)
    except InvalidJob as exc:
        Probe.objects.create(tag=tag, schema_seen=connection.schema_name, note=str(exc)[:300])
    jobs.probe.enqueue_many([{"tag": f"{tag}-ok0"}, {"tag": f"{tag}-ok1"}])  # then a good one


def test_followups_of_a_refused_call_are_all_dropped_and_the_item_named(tenants, declare):
    """enqueue_many inside a run is all or nothing too: an item refused after the ones before it
    were checked leaves none of them in the run's follow-ups (the run succeeds; nothing of the
    refused call runs, the next call's runs do, in the run's tenant), and the refusal names the
    item. Seen failing before the fix: the refused call's first two ran after the run's
    success."""
    job = declare(bulk_followups_with_a_bad_last_item)
    handle = job.enqueue(tenant="t1", tag="batch")
    work()
    assert JobRun.objects.get(pk=handle.run_id).status == RunStatus.SUCCEEDED
    recorded = next(p for p in probes("t1") if p.tag == "batch")
    assert sorted(p.tag for p in probes("t1") if p.tag != "batch") == ["batch-ok0", "batch-ok1"]
    assert recorded.note.startswith("enqueue_many() item 2: "), recorded.note
    assert "MAX_ENVELOPE_BYTES" in recorded.note
    assert JobRun.objects.filter(job_name=jobs.probe.name).count() == 2
    assert probes("t2") == [] and probes("t3") == []
