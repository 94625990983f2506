"""A fan-out to thousands of tenants works in chunks (issue 15, "Many tenants").

2,500 tenant rows without schemas (``bulk_create`` creates none) plus the suite's three real
tenants: enough to be fanned out to, not to run in, so only the parent run is worked here. Real
PostgreSQL, Redis and RQ worker; the SQL statements and pushes are counted, not replaced.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.db import connection

from kumiko_jobs import transport
from kumiko_jobs.enqueueing import fanout
from kumiko_jobs.models import JobRun, RunStatus
from kumiko_jobs.worker import relay

pytestmark = pytest.mark.usefixtures("live_db")
JOB_PREFIX = "fanscale"
EXTRA = 2500
ALL = EXTRA + 3  # the suite's t1, t2, t3


def noop(ctx: Any) -> None:
    pass


@pytest.fixture
def many_tenants(tenants: dict[str, Any]) -> Iterator[None]:
    from example_project.customers.models import Client

    Client.objects.bulk_create(
        [Client(schema_name=f"many{i:05d}", name=f"Many {i}") for i in range(EXTRA)],
        batch_size=1000,
    )
    try:
        yield
    finally:
        # A queryset delete: no schema to drop, and the suite's other fan-outs must not see
        # these tenants.
        Client.objects.filter(schema_name__startswith="many")._raw_delete(connection.alias)


@contextmanager
def statements() -> Iterator[list[str]]:
    """Every SQL statement the main connection sends meanwhile (counted, still executed)."""
    seen: list[str] = []

    def record(execute: Callable[..., Any], sql: str, params: Any, many: bool, ctx: Any) -> Any:
        seen.append(sql)
        return execute(sql, params, many, ctx)

    with connection.execute_wrapper(record):
        yield seen


@contextmanager
def pushes() -> Iterator[list[int]]:
    """The size of every ``push_many`` call meanwhile (the real one still pushes)."""
    sizes: list[int] = []
    original = transport.push_many

    def counted(messages: Any) -> None:
        batch = list(messages)
        sizes.append(len(batch))
        original(batch)

    transport.push_many = counted  # type: ignore[assignment]
    try:
        yield sizes
    finally:
        transport.push_many = original  # type: ignore[assignment]


def work_one() -> None:
    """Work exactly one message (the parent), leaving the children on the queue."""
    from kumiko_jobs.worker import Worker

    queue = transport.get_queue("default")
    Worker([queue], connection=queue.connection).work(
        burst=True, max_jobs=1, logging_level="WARNING"
    )


def retried(job: Any) -> Any:
    """Enqueue ``job``'s fan-out and work its first attempt, which dies with Redis after
    committing chunk 3 (of 500) and before pushing it; then move the retry (pushed behind the
    two chunks' children) to the front of the queue and work it."""
    parent = job.enqueue()
    original = transport.push_many
    calls = {"n": 0}

    def dies_at_the_third(messages: Any) -> None:
        calls["n"] += 1
        if calls["n"] == 3:
            raise ConnectionError("Redis went away between chunk 3's commit and its push")
        original(messages)

    transport.push_many = dies_at_the_third  # type: ignore[assignment]
    try:
        work_one()
    finally:
        transport.push_many = original  # type: ignore[assignment]
    run = JobRun.objects.get(pk=parent.run_id)
    assert (run.status, run.attempts) == (RunStatus.QUEUED, 1)  # its retry is on the queue
    assert JobRun.objects.filter(parent_run_id=parent.run_id).count() == 1500
    queue = transport.get_queue("default")
    assert queue.count == 1000 + 1  # chunks 1 and 2, and the retry
    (retry,) = [i for i in queue.job_ids if uuid.UUID(parent.run_id).hex in i]
    queue.remove(retry)
    queue.push_job_id(retry, at_front=True)
    return parent


def child_inserts(seen: list[str]) -> list[str]:
    return [s for s in seen if s.startswith('INSERT INTO "kumiko_jobs_jobrun"')]


def tenant_pages(seen: list[str]) -> list[str]:
    return [s for s in seen if 'FROM "customers_client"' in s and "COUNT(" not in s]


@pytest.mark.parametrize(("chunk", "chunks"), [(500, 6), (1000, 3), (5000, 1)])
def test_a_fan_out_to_thousands_of_tenants_inserts_and_pushes_per_chunk(
    many_tenants, declare, settings, chunk, chunks
):
    # 2,503 tenants: 6 chunks of at most 500, 3 of 1,000, 1 of 5,000 (the last calibrates
    # the counting: one chunk is one INSERT and one push, whatever the tenant count).
    settings.KUMIKO_JOBS = {**settings.KUMIKO_JOBS, "FANOUT_CHUNK_SIZE": chunk}
    job = declare(noop, per_tenant=True)
    parent = job.enqueue()
    with statements() as seen, pushes() as sizes:
        work_one()
    assert JobRun.objects.get(pk=parent.run_id).status == RunStatus.SUCCEEDED
    children = JobRun.objects.filter(parent_run_id=parent.run_id)
    assert children.count() == ALL
    assert children.values("schema_name").distinct().count() == ALL
    assert set(children.values_list("status", flat=True)) == {RunStatus.QUEUED}
    assert transport.queue_length("default") == ALL

    # One INSERT and one push per chunk, never one per tenant; each chunk at most `chunk`.
    assert len(child_inserts(seen)) == chunks
    assert sizes == [min(chunk, ALL - i * chunk) for i in range(chunks)]
    # The tenants are read a page at a time (LIMIT chunk), never all at once.
    pages = tenant_pages(seen)
    assert len(pages) == chunks and all(f"LIMIT {chunk}" in page for page in pages)
    # Nothing per tenant: the whole parent run stays far below one statement per tenant.
    assert len(seen) < 30 + 3 * chunks


def test_a_retried_fan_out_pushes_only_what_it_inserted_and_the_relay_the_rest(
    many_tenants, declare, settings
):
    # FIFO: retried() moves the retry to the front of RQ's order to work it next; the fair
    # dequeue would serve the tenants first (the system's bucket has used its share).
    settings.KUMIKO_JOBS = {**settings.KUMIKO_JOBS, "FANOUT_CHUNK_SIZE": 500, "FAIRNESS": "fifo"}
    job = declare(noop, per_tenant=True, retries=1, backoff={"type": "fixed", "delay": 0})
    parent = retried(job)
    # Chunks 1-3 exist, so the retry pushes nothing of them; chunks 4-6 are new.
    with pushes() as sizes:
        work_one()
    assert JobRun.objects.get(pk=parent.run_id).status == RunStatus.SUCCEEDED
    assert JobRun.objects.filter(parent_run_id=parent.run_id).count() == ALL
    assert sizes == [0, 0, 0, 500, 500, 3]
    assert transport.queue_length("default") == ALL - 500

    # Chunk 3's rows are the outbox: the relay pushes exactly those, and no child is queued
    # twice.
    assert relay.relay_pending(grace=0).pushed == 500
    queued = transport.waiting_job_ids("default")  # RQ's list holds tokens for sorted ones
    assert len(queued) == len(set(queued)) == ALL


def test_calibration_without_returning_a_retried_fan_out_queues_children_twice(
    many_tenants, declare, settings, monkeypatch
):
    """``bulk_create(ignore_conflicts=True)`` cannot tell which rows were new: a retry that
    pushes every child of its chunks queues the 1,000 children pushed before twice."""
    # FIFO: retried() moves the retry to the front of RQ's order to work it next; the fair
    # dequeue would serve the tenants first (the system's bucket has used its share).
    settings.KUMIKO_JOBS = {**settings.KUMIKO_JOBS, "FANOUT_CHUNK_SIZE": 500, "FAIRNESS": "fifo"}
    job = declare(noop, per_tenant=True, retries=1, backoff={"type": "fixed", "delay": 0})
    real_insert = fanout.insert_new

    def every_row(rows: list[Any]) -> set[Any]:
        real_insert(rows)
        return {row.run_id for row in rows}

    monkeypatch.setattr(fanout, "insert_new", every_row)
    parent = retried(job)
    work_one()
    assert JobRun.objects.get(pk=parent.run_id).status == RunStatus.SUCCEEDED
    assert JobRun.objects.filter(parent_run_id=parent.run_id).count() == ALL
    assert relay.relay_pending(grace=0).pushed == 0
    assert transport.queue_length("default") == ALL + 1000


def test_a_fan_out_over_the_limit_creates_no_child_even_in_chunks(many_tenants, declare, settings):
    settings.KUMIKO_JOBS = {
        **settings.KUMIKO_JOBS,
        "FANOUT_CHUNK_SIZE": 500,
        "MAX_FANOUT_TENANTS": ALL - 1,
    }
    job = declare(noop, per_tenant=True)
    parent = job.enqueue()
    work_one()
    run = JobRun.objects.get(pk=parent.run_id)
    assert run.status == RunStatus.FAILED
    assert f"more than MAX_FANOUT_TENANTS={ALL - 1} tenants" in run.error_message
    assert not JobRun.objects.filter(parent_run_id=parent.run_id).exists()
    assert transport.queue_length("default") == 0


@pytest.mark.parametrize("value", [0, -1, "500", True])
def test_the_chunk_size_is_a_validated_setting(value: Any) -> None:
    from django.core.exceptions import ImproperlyConfigured

    from kumiko_jobs.core import conf

    with pytest.raises(ImproperlyConfigured, match=r"FANOUT_CHUNK_SIZE.*must be an integer >= 1"):
        conf._validate({"FANOUT_CHUNK_SIZE": value})
    assert conf._validate({"FANOUT_CHUNK_SIZE": 1}).FANOUT_CHUNK_SIZE == 1


# --- check E012 at many tenants: one pass over the catalog, the same findings ------------------


def test_out_of_date_finds_a_lost_group_membership_and_sequence_grant(tenants):
    """``role_sync.out_of_date`` joins the tenants with pg_class once (it scanned pg_class once
    per tenant before); the branches test_db_roles.py does not reach: the group membership
    and a sequence's USAGE. Repaired by the command's ``sync_all``."""
    from kumiko_jobs.guard.roles import names as role_names
    from kumiko_jobs.guard.roles import sync as role_sync

    t1, t2 = role_names.role_name(tenants["t1"].pk), role_names.role_name(tenants["t2"].pk)
    assert role_sync.out_of_date() == []
    try:
        with connection.cursor() as cursor:
            cursor.execute(f'REVOKE "{role_names.group_name()}" FROM "{t2}"')
        assert role_sync.out_of_date() == ["t2"]
        with connection.cursor() as cursor:
            cursor.execute(f'REVOKE USAGE ON ALL SEQUENCES IN SCHEMA "t1" FROM "{t1}"')
        assert role_sync.out_of_date() == ["t1", "t2"]
    finally:
        role_sync.sync_all()
    assert role_sync.out_of_date() == []
