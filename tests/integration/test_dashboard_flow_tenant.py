"""The operators' dashboard counts a system run a tenant's run started for that tenant, as the
fair dequeue does (docs/observability.md, "Whose runs"): its worker time, its backlog, and the
tenant filter's charts and failures, while the page still says which of them are system runs.

Runs executed by a real worker (burst) on real Redis and PostgreSQL, rolled up by the
maintenance round's own ``roll_up``, read through the admin's JSON endpoint.
"""

from __future__ import annotations

import importlib
import io
import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.core.cache import cache
from django.core.management import call_command
from django.db import connection, transaction
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from kumiko_jobs import transport
from kumiko_jobs.history import failure_groups, rollup, shares, stats
from kumiko_jobs.models import JobRun, RunStatus
from kumiko_jobs.worker import Worker
from tests.conftest import work
from tests.integration.test_dashboard import (  # noqa: F401 (the cache-clearing fixture)
    DATA,
    _fresh_cache,
    client_for,
    make_user,
    payload,
    total,
)
from tests.testapp import jobs

pytestmark = pytest.mark.usefixtures("live_db")

SYSTEM = jobs.tenant_started_system.name


@pytest.fixture
def ops() -> Client:
    """An operator: a public-schema staff user holding view_all_tenants and view_jobrun."""
    user = make_user("public", "ops", ("view_all_tenants", "view_jobrun"))
    return client_for("localhost", "public", user)


def ms(runs: Any) -> float:
    return round(sum(r.duration_ms for r in runs), 1)


def test_a_tenants_system_runs_are_its_share_backlog_and_charts(ops: Client, tenants: Any) -> None:
    """t1's run starts two system runs; the system enqueues one of its own; t2 runs one.
    While they wait, t1's backlog holds its two system runs; once run and rolled up (their
    day moved two days back, so the week reads it from the worker-time rollup), t1's worker
    time holds them (``system_ms`` says how much), the system's row only its own run, and
    the tenant filter counts them for t1, not for ``-``. Proven able to fail: without the
    change (``schema_name`` for tenant, as before) t1's share is its own run's only and the
    system's row holds all three system runs."""
    jobs.starts_system_runs.enqueue(tenant="t1", tag="fan", count=2, seconds=0.05)
    queue = transport.get_queue("default")
    Worker([queue], connection=queue.connection).work(burst=True, max_jobs=1)
    jobs.tenant_started_system.enqueue(tag="own", seconds=0.05)
    jobs.probe.enqueue(tenant="t2", tag="t2")

    backlog = {t["tenant"]: t for t in payload(ops.get(DATA))["backlog"]["tenants"]}
    assert {k: (v["waiting"], v["system"]) for k, v in backlog.items()} == {
        "t1": (2, 2),
        "": (1, 1),
        "t2": (1, 0),
    }
    t1_only = payload(ops.get(DATA, {"tenant": "t1"}))["backlog"]["tenants"]
    assert [(t["tenant"], t["waiting"]) for t in t1_only] == [("t1", 2)]

    work()
    runs = JobRun.objects.all()
    assert {r.status for r in runs} == {RunStatus.SUCCEEDED} and len(runs) == 5
    flow = list(runs.filter(schema_name="", flow_schema="t1"))
    own = list(runs.filter(schema_name="", flow_schema=""))
    assert len(flow) == 2 and len(own) == 1 and all(r.job_name == SYSTEM for r in flow + own)
    t1_runs = [*runs.filter(schema_name="t1"), *flow]

    # The whole history two days back: a whole day of the week window, rolled up.
    for field in ("queued_at", "started_at", "finished_at"):
        JobRun.objects.update(**{field: timezone.now() - timedelta(days=2)})
    assert rollup.catch_up() > 0
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT schema_name, flow_schema, runs FROM {rollup.WORKER_TIME_TABLE} ORDER BY 1, 2"
        )
        assert cursor.fetchall() == [("", "", 1), ("", "t1", 2), ("t1", "", 1), ("t2", "", 1)]

    week = payload(ops.get(DATA, {"window": "week"}))
    shares = {row["tenant"]: row for row in week["worker_time"]}
    assert set(shares) == {"t1", "", "t2"}
    assert shares["t1"]["ms"] == ms(t1_runs) and shares["t1"]["system_ms"] == ms(flow)
    assert shares[""]["ms"] == ms(own) == shares[""]["system_ms"]
    assert shares["t2"]["system_ms"] == 0.0

    for tenant, expected in (("t1", t1_runs), ("-", own)):
        data = payload(ops.get(DATA, {"window": "week", "tenant": tenant}))
        points = data["series"]["points"]
        assert total(points, "started") == total(points, "succeeded") == len(expected), tenant
        assert [row["ms"] for row in data["worker_time"]] == [ms(expected)], tenant
        waits = [p["wait_ms"] for p in points if p["wait_ms"]]
        assert len(waits) == 1, tenant  # all on the same instant: one point

    # Read from the rollup: with the raw rows gone (and the page's cache), the shares stand.
    JobRun.objects.all().delete()
    cache.clear()
    assert payload(ops.get(DATA, {"window": "week"}))["worker_time"] == week["worker_time"]


def failed(tenant: str, flow: str, job: str, n: int) -> list[JobRun]:
    now = timezone.now() - timedelta(minutes=5)
    return [
        JobRun(
            run_id=uuid.uuid4(),
            job_name=job,
            schema_name=tenant,
            flow_schema=flow,
            status=RunStatus.FAILED,
            queue="default",
            attempts=1,
            queued_at=now - timedelta(seconds=1),
            started_at=now,
            finished_at=now,
            duration_ms=5.0,
            error_type="RuntimeError",
        )
        for _ in range(n)
    ]


def test_a_tenants_failures_hold_its_system_runs_marked_and_linked(ops: Client) -> None:
    """Under the tenant filter t1, the failures of the system runs t1's runs started are a
    group of their own, marked ``system``, linking to the run list of exactly those runs (not
    t2's, not the system's own); under ``-`` only the system's own. Proven able to fail:
    linked by ``tenant`` alone the list shows no run (t1's) or all three kinds (``-``)."""
    JobRun.objects.bulk_create(
        failed("t1", "", "app.mine", 1)
        + failed("", "t1", SYSTEM, 3)
        + failed("", "t2", SYSTEM, 2)
        + failed("", "", SYSTEM, 4)
    )
    for tenant, expected in (
        ("t1", [(SYSTEM, 3, True, 3), ("app.mine", 1, False, 1)]),
        ("-", [(SYSTEM, 4, True, 4)]),
        ("t2", [(SYSTEM, 2, True, 2)]),
    ):
        groups = payload(ops.get(DATA, {"tenant": tenant}))["failures"]
        listed = []
        for group in groups:
            page = ops.get(group["link"])
            assert page.status_code == 200, group["link"]
            listed.append(len(page.context["cl"].result_list))
        got = [(g["job"], g["count"], g["system"], n) for g, n in zip(groups, listed, strict=True)]
        assert got == expected, tenant
    # Without a tenant filter: one group per job, as before.
    groups = payload(ops.get(DATA))["failures"]
    assert [(g["job"], g["count"], g["system"]) for g in groups] == [
        (SYSTEM, 9, False),
        ("app.mine", 1, False),
    ]


DISABLED = "cost=10000000000"


def bitmap_only_plan(sql: str) -> str:
    """The plan of a statement as sent (parameters inlined by the driver), with only bitmap
    index scans allowed (as test_hot_path_indexes.py)."""
    with connection.cursor() as cursor:
        for setting in ("seqscan", "indexscan", "indexonlyscan"):
            cursor.execute(f"SET enable_{setting} = off")
        try:
            cursor.execute("EXPLAIN " + sql)
            return "\n".join(row[0] for row in cursor.fetchall())
        finally:
            for setting in ("seqscan", "indexscan", "indexonlyscan"):
                cursor.execute(f"RESET enable_{setting}")


def test_the_tenant_filter_reads_a_rare_tenants_rows_by_index() -> None:
    """A day of 3,000 runs of t2 and 50 of the system, five of t1 (two of them system runs
    t1's runs started): the tenant filter's statements read t1's rows through its index and the
    flow index (a BitmapOr), not the day. Calibration: without kj_run_flow_recent the flow arm
    has no index of its own."""
    now = timezone.now() - timedelta(minutes=5)

    def rows(tenant: str, flow: str, n: int) -> list[JobRun]:
        return [
            JobRun(
                run_id=uuid.uuid4(),
                job_name="app.work",
                schema_name=tenant,
                flow_schema=flow,
                status=RunStatus.SUCCEEDED,
                queue="default",
                attempts=1,
                queued_at=now - timedelta(seconds=i + 1),
                started_at=now - timedelta(seconds=i),
                finished_at=now - timedelta(seconds=i),
                duration_ms=1.0,
            )
            for i in range(n)
        ]

    JobRun.objects.bulk_create(
        rows("t2", "", 3000) + rows("", "", 50) + rows("t1", "", 3) + rows("", "t1", 2)
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE kumiko_jobs_jobrun")
    day = stats.WINDOWS["day"]
    scope = stats.Scope(tenant="t1")
    since = stats.bucket_start(day, timezone.now())
    with CaptureQueriesContext(connection) as captured:
        worker = shares.worker_time(day, scope, timezone.now(), use_rollup=False)
        points = stats.raw_points(day, scope, since, since + day.span)
        failure_groups.failure_groups(day, scope, since, since + day.span)
    assert worker[0]["ms"] == 5.0 and sum(p["started"] for p in points.values()) == 5
    statements = [q["sql"] for q in captured.captured_queries if "kumiko_jobs_jobrun" in q["sql"]]
    assert len(statements) == 4
    for sql in statements:
        plan = bitmap_only_plan(sql)
        assert DISABLED not in plan, plan
    # The failure groups read the failed runs (kj_run_status_recent: none here), as before.
    statements = statements[:3]
    for sql in statements:
        plan = bitmap_only_plan(sql)
        assert "kj_run_flow_recent" in plan, plan
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("DROP INDEX kj_run_flow_recent")
        assert all("kj_run_flow_recent" not in bitmap_only_plan(sql) for sql in statements)
        transaction.set_rollback(True)


def test_the_migration_keys_the_rollup_by_flow_tenant_and_goes_back_cleanly() -> None:
    """0031 forwards on a table of the previous shape keeps its rows (as the system's: ''),
    backwards drops the rows and the mark (the previous release rolls the days up again, by
    schema_name alone), in one transaction; 0032 alone builds the index CONCURRENTLY, outside
    one (an interrupted build leaves 0031 applied and recorded)."""
    migration = importlib.import_module("kumiko_jobs.migrations.0031_flow_tenant_shares")
    assert migration.Migration.atomic is True
    index = importlib.import_module("kumiko_jobs.migrations.0032_flow_recent_index")
    assert index.Migration.atomic is False
    table = rollup.WORKER_TIME_TABLE

    def rows() -> list[tuple[Any, ...]]:
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT schema_name, flow_schema, runs FROM {table} ORDER BY 1, 2")
            return list(cursor.fetchall())

    def key() -> list[str]:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid"
                " AND a.attnum = ANY(i.indkey) WHERE i.indrelid = %s::regclass"
                " AND i.indisprimary ORDER BY a.attnum",
                [table],
            )
            return [row[0] for row in cursor.fetchall()]

    day = rollup.floor_to(timezone.now(), rollup.DAY)
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {table} (bucket, queue, schema_name, flow_schema, worker_ms, runs) "
                f"VALUES (%s, 'default', '', '', 1, 1), (%s, 'default', '', 't1', 2, 2)",
                [day, day],
            )
            rollup.mark(cursor, rollup.DAY, day)
            assert key() == ["bucket", "queue", "schema_name", "flow_schema"]
            cursor.execute(migration.BACKWARD)
            assert (
                key() == ["bucket", "queue", "schema_name"]
                and rollup.rolled_until(rollup.DAY) is None
            )
            cursor.execute(f"SELECT count(*) FROM {table}")
            assert cursor.fetchone()[0] == 0
            cursor.execute(
                f"INSERT INTO {table} (bucket, queue, schema_name, worker_ms, runs) "
                f"VALUES (%s, 'default', '', 3, 3)",
                [day],
            )
            cursor.execute(migration.FORWARD)
        assert key() == ["bucket", "queue", "schema_name", "flow_schema"]
        assert rows() == [("", "", 3)]
        transaction.set_rollback(True)
    out = io.StringIO()
    call_command("sqlmigrate", "kumiko_jobs", "0032", stdout=out)
    assert 'CREATE INDEX CONCURRENTLY "kj_run_flow_recent"' in out.getvalue()
