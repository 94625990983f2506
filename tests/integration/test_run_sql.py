"""The history's hot path (``kumiko_jobs.run_sql``): what a run costs in statements, and why
skipping django-tenants' ``SET search_path`` for those statements is safe.

The in-process worker shares this thread's connection, so an execute wrapper installed here sees
every statement a run sends, including django-tenants' own ``SET search_path``.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
from django.conf import settings
from django.db import connection, transaction
from django.test import override_settings
from django.utils import timezone

from example_project.customers.models import Client
from kumiko_jobs import signals, transport
from kumiko_jobs.core.envelope import Envelope
from kumiko_jobs.enqueueing.messages import message_for, pending_counters
from kumiko_jobs.history import run_sql
from kumiko_jobs.models import JobAttempt, JobRun, RunStatus
from tests.conftest import probes, work
from tests.testapp import jobs

pytestmark = pytest.mark.usefixtures("live_db")


@dataclass
class Statements:
    seen: list[tuple[str, str]] = field(default_factory=list)

    def __call__(
        self, execute: Callable[..., Any], sql: Any, params: Any, many: bool, context: Any
    ) -> Any:
        self.seen.append((transport.current_job_id(), " ".join(str(sql).split())))
        return execute(sql, params, many, context)

    def of(self, rq_job_id: str) -> list[str]:
        return [sql for job_id, sql in self.seen if job_id == rq_job_id]


@contextmanager
def recording() -> Iterator[Statements]:
    statements = Statements()
    with connection.execute_wrapper(statements):
        yield statements


def _kind(sql: str) -> str:
    if sql.startswith("WITH started AS (UPDATE"):
        return "start"
    if sql.startswith("WITH run AS (UPDATE"):
        return "finish"
    if sql.startswith("SET search_path"):
        return sql
    if 'INTO "testapp_probe"' in sql:
        return "job"
    if sql.startswith("CLOSE ALL; SET SESSION AUTHORIZATION DEFAULT; RESET ALL"):
        return "reset"  # the session reset after every run (core/session.py, issue 22)
    return sql


# Counted on the test's own connection, which the job body shares only with DB_ROLES off (with
# it on, test_db_roles.py counts a warm run's statements on every connection: the same).
@override_settings(KUMIKO_JOBS={**settings.KUMIKO_JOBS, "DB_ROLES": False})
def test_a_run_costs_its_start_its_tenant_its_job_and_its_finish(tenants):
    # t1, t2, t1: a new tenant each time, and no switch back to public between runs.
    handles = [jobs.probe.enqueue(tenant=t, tag=f"p{i}") for i, t in enumerate(["t1", "t2", "t1"])]
    with recording() as statements:
        work()
    for handle, schema in zip(handles, ["t1", "t2", "t1"], strict=True):
        run = JobRun.objects.get(pk=handle.run_id)
        assert run.status == RunStatus.SUCCEEDED
        assert [_kind(sql) for sql in statements.of(run.rq_job_id)] == [
            "start",
            f'SET search_path = "{schema}","public"',
            "job",
            "reset",
            "finish",
        ]
    assert [p.tag for p in probes("t1")] == ["p0", "p2"]
    assert [p.tag for p in probes("t2")] == ["p1"]


def test_history_statements_name_the_public_schema_for_every_table(tenants):
    with recording() as statements:
        jobs.probe.enqueue(tenant="t1", tag="q")
        work()
    history = [sql for _, sql in statements.seen if _kind(sql) in ("start", "finish")]
    assert len(history) == 2
    for sql in history:
        for table in ("kumiko_jobs_jobrun", "kumiko_jobs_jobattempt", "customers_client"):
            if f'"{table}"' in sql:
                assert f'"public"."{table}"' in sql, sql
                assert f' "{table}"' not in sql.replace(f'"public"."{table}"', ""), sql


@pytest.fixture
def decoys() -> Iterator[None]:
    """Tables in t1's schema named like the history's and the tenant table, as a tenant's own
    migration (or an attacker with DDL in the schema) could create them."""
    with connection.cursor() as cursor:
        cursor.execute(
            'CREATE TABLE "t1"."kumiko_jobs_jobrun" (LIKE "public"."kumiko_jobs_jobrun"); '
            'CREATE TABLE "t1"."kumiko_jobs_jobattempt" (LIKE "public"."kumiko_jobs_jobattempt"); '
            'CREATE TABLE "t1"."customers_client" (LIKE "public"."customers_client")'
        )
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute(
                'DROP TABLE "t1"."kumiko_jobs_jobrun", "t1"."kumiko_jobs_jobattempt", '
                '"t1"."customers_client"'
            )


@override_settings(KUMIKO_JOBS={**settings.KUMIKO_JOBS, "TENANT_ACTIVE_FIELD": "is_active"})
def test_tables_in_the_last_tenants_schema_never_capture_the_history(tenants, decoys):
    # After a t1 run the connection's search_path is still "t1","public" when the next run
    # starts; unqualified names would resolve to the decoys first.
    with connection.cursor() as cursor:
        cursor.execute(
            'INSERT INTO "t1"."customers_client" (id, schema_name, name, is_active, created_on) '
            "SELECT id, schema_name, name, false, created_on FROM public.customers_client"
        )
    first = jobs.probe.enqueue(tenant="t1", tag="first")
    second = jobs.probe.enqueue(tenant="t2", tag="second")
    with recording() as statements:
        work()
    assert statements.of(JobRun.objects.get(pk=second.run_id).rq_job_id)[0].startswith(
        "WITH started"
    )
    # The decoy says every tenant is inactive: had it been read, both runs would be dropped.
    for handle in (first, second):
        run = JobRun.objects.get(pk=handle.run_id)
        assert run.status == RunStatus.SUCCEEDED, (run.status, run.error_message)
        assert JobAttempt.objects.filter(run=run, outcome="succeeded").count() == 1
    with connection.cursor() as cursor:
        cursor.execute(
            'SELECT (SELECT count(*) FROM "t1"."kumiko_jobs_jobrun"), '
            '(SELECT count(*) FROM "t1"."kumiko_jobs_jobattempt")'
        )
        assert cursor.fetchone() == (0, 0)
    assert [p.tag for p in probes("t2")] == ["second"]


def _queued_run(schema: str | None, **fields: Any) -> str:
    run_id = uuid.uuid4()
    JobRun.objects.create(
        run_id=run_id,
        job_name="testapp.probe",
        schema_name=schema or "",
        status=fields.pop("status", RunStatus.QUEUED),
        queue="default",
        max_attempts=3,
        queued_at=timezone.now(),
        payload={"tag": "x"},
        **fields,
    )
    return str(run_id)


def _start(
    run_id: str, schema: str | None, attempt: int = 1, defers: int = 0, gate_defers: int = 0
) -> run_sql.Started:
    return run_sql.start(
        run_id=run_id,
        attempt=attempt,
        started_at=timezone.now(),
        defers=defers,
        gate_defers=gate_defers,
        rq_job_id="rq-1",
        schema=schema,
    )


def _fields(tenant: Any) -> dict[str, Any]:
    return {f.attname: getattr(tenant, f.attname) for f in Client._meta.concrete_fields}


def test_start_marks_the_run_running_and_loads_the_tenant_as_the_orm_would(tenants):
    run_id = _queued_run("t2", attempts=1)  # attempt 1 failed; the run waits for attempt 2
    started = _start(run_id, "t2", attempt=2)
    assert started.updated is True
    assert isinstance(started.tenant, Client)
    assert _fields(started.tenant) == _fields(Client.objects.get(schema_name="t2"))
    assert not started.tenant._state.adding and started.tenant._state.db == "default"
    run = JobRun.objects.get(pk=run_id)
    assert (run.status, run.attempts, run.rq_job_id) == (RunStatus.RUNNING, 2, "rq-1")
    assert run.started_at is not None and run.finished_at is None


def test_start_refuses_a_run_that_is_not_waiting(tenants):
    run_id = _queued_run("t1")
    assert _start(run_id, "t1").updated is True
    again = _start(run_id, "t1")  # a duplicate delivery: the run is already running
    assert again.updated is False
    assert again.tenant is not None  # the tenant is loaded whatever the run's state
    JobRun.objects.filter(pk=run_id).update(status=RunStatus.CANCELLED)
    assert _start(run_id, "t1").updated is False
    assert JobRun.objects.get(pk=run_id).status == RunStatus.CANCELLED
    missing = _start(str(uuid.uuid4()), "t1")
    assert missing.updated is False and missing.tenant is not None


WAITING_ROWS = [
    # (status, attempts, defer_count, gate_defer_count) of a run that waits for a message
    (RunStatus.QUEUED, 0, 0, 0),  # enqueued
    (RunStatus.QUEUED, 2, 0, 0),  # attempt 2 failed: waits for attempt 3
    (RunStatus.QUEUED, 1, 2, 1),  # deferred before, then failed
    (RunStatus.DEFERRED, 1, 0, 0),  # ctx.defer() or an inactive tenant in attempt 1
    (RunStatus.DEFERRED, 2, 3, 1),
]


@pytest.mark.parametrize(("status", "attempts", "defers", "gate_defers"), WAITING_ROWS)
def test_start_accepts_exactly_the_message_the_relay_would_push(
    tenants, status, attempts, defers, gate_defers
):
    """The start and the relay state one rule: the message a waiting run waits for. Every
    other message (a stale attempt, an old deferral, one from the future) is refused."""
    expected = set(pending_counters(status, attempts, defers, gate_defers))
    accepted = set()
    for counters in itertools.product(range(5), range(5), range(3)):
        run_id = _queued_run(
            "t1", status=status, attempts=attempts, defer_count=defers, gate_defer_count=gate_defers
        )
        attempt, message_defers, message_gate_defers = counters
        if _start(run_id, "t1", attempt, message_defers, message_gate_defers).updated:
            accepted.add(counters)
            assert JobRun.objects.get(pk=run_id).status == RunStatus.RUNNING
        else:
            assert JobRun.objects.get(pk=run_id).status == status
    assert accepted == expected


def test_a_stale_attempt_is_dropped_and_the_awaited_one_runs(tenants):
    handle = jobs.probe.enqueue(tenant="t1", tag="once")
    # As if attempt 1 had run and failed, and its message were delivered again (a relay or a
    # redelivery) while the run waits for attempt 2.
    JobRun.objects.filter(pk=handle.run_id).update(attempts=1)
    dropped = []

    def on_dropped(sender: Any, **kwargs: Any) -> None:
        dropped.append(kwargs["reason"])

    signals.job_dropped.connect(on_dropped)
    try:
        work()
    finally:
        signals.job_dropped.disconnect(on_dropped)
    run = JobRun.objects.get(pk=handle.run_id)
    assert (run.status, run.attempts) == (RunStatus.QUEUED, 1)
    assert probes("t1") == []  # the stale attempt never reached the job
    assert len(dropped) == 1 and "stale message (attempt 1" in dropped[0], dropped
    assert "waits for another" in dropped[0]
    env = Envelope(job="testapp.probe", schema="t1", kwargs={"tag": "once"}, run_id=run.run_id.hex)
    transport.push(message_for(jobs.probe, env.next_attempt(), 0.0))
    work()
    run.refresh_from_db()
    assert (run.status, run.attempts) == (RunStatus.SUCCEEDED, 2)
    assert [p.tag for p in probes("t1")] == ["once"]


@pytest.mark.parametrize("schema", [None, "nope", "T1", "t1 ", 't1"; DROP TABLE x; --'])
def test_start_finds_no_tenant_for_a_schema_no_tenant_has(tenants, schema):
    run_id = _queued_run(schema)
    started = _start(run_id, schema)
    assert started.updated is True
    assert started.tenant is None
    if schema is not None:
        assert run_sql.find_tenant(schema) is None


def test_find_tenant_matches_the_orm(tenants):
    for schema in ("public", "t1", "t3"):
        assert _fields(run_sql.find_tenant(schema)) == _fields(
            Client.objects.get(schema_name=schema)
        )


def _attempt(run_id: str) -> dict[str, Any]:
    now = timezone.now()
    return {
        "run": uuid.UUID(run_id),
        "number": 1,
        "started_at": now,
        "finished_at": now,
        "duration_ms": 1.0,
        "outcome": "succeeded",
        "error_type": "",
        "error_message": "",
        "traceback": "",
        "log": [{"msg": "kept as JSON"}],
        "worker": "test",
    }


def _synchronous_commit() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SHOW synchronous_commit")
        return str(cursor.fetchone()[0])


@override_settings(KUMIKO_JOBS={"HISTORY_SYNCHRONOUS_COMMIT": False})
def test_history_statements_can_commit_asynchronously_and_only_themselves(tenants):
    run_id = _queued_run("t1")
    assert _synchronous_commit() == "on"
    with transaction.atomic():  # to look inside the statement's transaction
        _start(run_id, "t1")
        assert _synchronous_commit() == "off"
    assert _synchronous_commit() == "on"  # local to that transaction: the job's commits wait
    with transaction.atomic():
        run_sql.finish(_attempt(run_id), {"status": "succeeded"}, run_id)
        assert _synchronous_commit() == "off"
    assert _synchronous_commit() == "on"
    assert JobRun.objects.get(pk=run_id).status == RunStatus.SUCCEEDED
    assert JobAttempt.objects.get(run_id=run_id, number=1).log == [{"msg": "kept as JSON"}]


def test_the_finish_waits_for_the_flush_by_default_the_start_never(tenants):
    """The start commits asynchronously whatever the setting (the body's or the finish's
    synchronous commit flushes it; a WAL flush less per run, bench/README.md); the finish waits
    for the flush like any commit unless HISTORY_SYNCHRONOUS_COMMIT is False."""
    run_id = _queued_run("t1")
    with recording() as statements, transaction.atomic():
        _start(run_id, "t1")
        assert _synchronous_commit() == "off"
    with recording() as finishing, transaction.atomic():
        run_sql.finish(_attempt(run_id), {"status": "succeeded"}, run_id)
        assert _synchronous_commit() == "on"
    [start] = [sql for _, sql in statements.seen if _kind(sql) == "start"]
    [finish] = [sql for _, sql in finishing.seen if _kind(sql) == "finish"]
    assert "synchronous_commit" in start
    assert "synchronous_commit" not in finish
    assert JobRun.objects.get(pk=run_id).status == RunStatus.SUCCEEDED
