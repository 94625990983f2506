"""The run history at millions of rows: build it set-based, upgrade it, time the admin pages.

One run (or several, with ``--reuse``, against the same database):

1. **build** (skipped with ``--reuse`` when the database already holds the rows): the shared
   schema migrated up to 0009 (before this issue's indexes), one tenant with a real schema
   (``hs00001``, the busiest one, whose staff user reads its own run list), ``--tenants``-1
   tenant rows without schemas (as bench/fanout.py makes them), then ``--runs`` JobRun rows
   with their attempts and tenant-visible failures in a few ``INSERT ... SELECT`` statements
   over ``generate_series`` (secondary indexes dropped during the load and rebuilt after,
   as one would load a table; every step timed). The spread: ``--tenants`` tenants and 200 job
   names, both skewed (tenant hs00001 has ~3 % of the rows, the rarest job ~0.25 %), 90 days,
   95 % succeeded, 4 % failed, the rest cancelled, skipped, capped, and (within the last hour)
   deferred, queued and running.
2. **upgrade**: ``migrate kumiko_jobs 0010`` on that table while another connection inserts a
   run every 10 ms: reports how long the migration took, the locks its backend held on the
   table (sampled from ``pg_locks``) and the slowest insert meanwhile. Then, as calibration,
   one plain ``CREATE INDEX`` (not CONCURRENTLY) under the same inserter: its slowest insert
   is the build time, because SHARE blocks writes.
3. **pages**: each admin page ``--requests`` times through Django's test ``Client`` (after a
   warm-up), the operator a real superuser on the public domain, the tenant a staff user with
   the view permission on ``hs00001.localhost``; p50 and p95 per page, then for one more
   request of each: its queries, ``EXPLAIN`` of every query on kumiko's tables (indexes used,
   any Seq Scan on them) and any ``COUNT`` not bounded by a ``LIMIT``.
4. **10,000 tenants**: tenant rows up to ``--many-tenants``, and the operator's run list again
   (its tenant filter must render an input, not one choice per tenant).

    python -m bench.history_scale [--runs 10000000] [--tenants 1000] [--requests 20]
                                  [--many-tenants 10000] [--reuse] [--no-upgrade] [--drop]
                                  [--json]

Database ``kumiko_history_scale`` (kept between runs unless ``--drop``; 10 M runs take about
6 GB), Redis database 6. A benchmark, not a test: it asserts nothing about speed; it does check
that every page answers 200 with the rows it should show.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlencode

from bench.throughput import _with_path, drop_database, machine_facts, print_load, write_results

BENCH_DATABASE = "kumiko_history_scale"
BENCH_REDIS_DB = 6
BUDGET_MS = 300.0
PASSWORD = "history-scale-bench"
BUSY_TENANT = "hs00001"
RUNS = "/admin/kumiko_jobs/jobrun/"
TABLES = ("kumiko_jobs_jobrun", "kumiko_jobs_jobattempt", "kumiko_jobs_jobfailure")
# The indexes migration 0010 adds (kj_run_tenant_recent, kj_run_status_started, ... are older).
NEW = (
    "kj_run_recent",
    "kj_run_status_recent",
    "kj_run_job_recent",
    "kj_run_tenant_status",
    "kj_run_correlation",
    "kj_run_subject_trgm",
)


# --------------------------------------------------------------------------- environment


def prepare_environment(
    *, fresh: bool, database: str = BENCH_DATABASE, redis_db: int = BENCH_REDIS_DB
) -> str:
    """Services up, the bench database there (dropped first when ``fresh``), Django loaded."""
    from example_project.devservices import (
        DEFAULT_DATABASE_URL,
        DEFAULT_REDIS_URL,
        ensure_database,
        ensure_services,
    )

    base_db = os.environ.get("DATABASE_URL") or DEFAULT_DATABASE_URL
    base_redis = os.environ.get("REDIS_URL") or DEFAULT_REDIS_URL
    os.environ["DATABASE_URL"] = _with_path(base_db, f"/{database}")
    os.environ["REDIS_URL"] = _with_path(base_redis, f"/{redis_db}")
    os.environ["KUMIKO_EXAMPLE_DEBUG"] = "0"  # DEBUG would keep every query in memory
    os.environ.setdefault("KUMIKO_LOG", "CRITICAL")
    ensure_services(verbose=True, create_database=False)
    admin_url = _with_path(os.environ["DATABASE_URL"], "/postgres")
    if fresh:
        drop_database(admin_url, database)
    ensure_database(os.environ["DATABASE_URL"])
    os.environ["DJANGO_SETTINGS_MODULE"] = "example_project.settings"
    import django

    django.setup()
    return admin_url


def sql(statement: str, params: Sequence[Any] | dict[str, Any] = ()) -> list[tuple[Any, ...]]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return list(cursor.fetchall()) if cursor.description else []


def existing_runs() -> int:
    rows = sql("SELECT to_regclass('kumiko_jobs_jobrun') IS NOT NULL")
    if not rows[0][0]:
        return 0
    return int(sql("SELECT count(*) FROM kumiko_jobs_jobrun")[0][0])


@contextmanager
def step(name: str, timings: dict[str, float]) -> Iterator[None]:
    print(f"  {name} ...", end="", flush=True)
    started = time.perf_counter()
    yield
    timings[name] = round(time.perf_counter() - started, 1)
    print(f" {timings[name]:.1f} s", flush=True)


# --------------------------------------------------------------------------- build


def migrate_to(target: str) -> None:
    from django.core.management import call_command

    call_command(
        "migrate_schemas", "kumiko_jobs", target, shared=True, interactive=False, verbosity=0
    )


def migrate_latest() -> None:
    from django.core.management import call_command

    call_command("migrate_schemas", "kumiko_jobs", shared=True, interactive=False, verbosity=0)


def create_tenants_and_users(tenants: int, kumiko_target: str | None = "0009") -> None:
    """The public tenant, one real tenant schema (the busy one), the rest rows only; kumiko's
    shared tables migrated back to ``kumiko_target`` (None: left at the latest migration)."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Permission
    from django.core.management import call_command
    from django_tenants.utils import schema_context

    from example_project.customers.models import Client, Domain

    call_command("migrate_schemas", shared=True, interactive=False, verbosity=0)
    if kumiko_target:
        migrate_to(kumiko_target)  # "0009": the table before 0010, the measured upgrade
    public, _ = Client.objects.get_or_create(schema_name="public", defaults={"name": "Operator"})
    Domain.objects.get_or_create(
        domain="localhost", defaults={"tenant": public, "is_primary": True}
    )
    busy = Client.objects.filter(schema_name=BUSY_TENANT).first()
    if busy is None:
        busy = Client(schema_name=BUSY_TENANT, name="Busy tenant")
        busy.save(verbosity=0)  # creates and migrates its schema (auth lives there)
    Domain.objects.get_or_create(
        domain=f"{BUSY_TENANT}.localhost", defaults={"tenant": busy, "is_primary": True}
    )
    add_tenant_rows(tenants)
    User = get_user_model()
    with schema_context("public"):
        operator = User.objects.filter(username="operator").first() or User(username="operator")
        operator.is_staff = operator.is_superuser = True
        operator.set_password(PASSWORD)
        operator.save()
    with schema_context(BUSY_TENANT):
        clerk = User.objects.filter(username="clerk").first() or User(username="clerk")
        clerk.is_staff = True
        clerk.set_password(PASSWORD)
        clerk.save()
        clerk.user_permissions.set(
            Permission.objects.filter(
                content_type__app_label="kumiko_jobs",
                codename__in=("view_jobrun", "view_jobfailure"),
            )
        )


def add_tenant_rows(total: int) -> None:
    """Tenant rows hs00002.. up to ``total`` tenants, without schemas (bulk_create, no save)."""
    from example_project.customers.models import Client

    have = set(
        Client.objects.filter(schema_name__startswith="hs").values_list("schema_name", flat=True)
    )
    Client.objects.bulk_create(
        [
            Client(schema_name=f"hs{i:05d}", name=f"History {i}")
            for i in range(2, total + 1)
            if f"hs{i:05d}" not in have
        ],
        batch_size=1000,
    )


def secondary_indexes(table: str) -> list[tuple[str, str]]:
    """(name, definition) of ``table``'s indexes that back no constraint."""
    return [
        (str(name), str(definition))
        for name, definition in sql(
            "SELECT c.relname, pg_get_indexdef(i.indexrelid) FROM pg_index i"
            " JOIN pg_class c ON c.oid = i.indexrelid"
            " WHERE i.indrelid = %s::regclass"
            " AND NOT EXISTS (SELECT 1 FROM pg_constraint k WHERE k.conindid = i.indexrelid)",
            [table],
        )
    ]


def constraints(table: str, kinds: str) -> list[tuple[str, str]]:
    return [
        (str(name), str(definition))
        for name, definition in sql(
            "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint"
            " WHERE conrelid = %s::regclass AND contype = ANY(%s)",
            [table, list(kinds)],
        )
    ]


# The job names: 200 of them over 20 apps. Tenants and jobs are skewed (power 2): the busiest
# tenant and job get ~3 % and ~7 % of the rows, the quietest ~0.05 % and ~0.25 %.
INSERT_RUNS = """
INSERT INTO kumiko_jobs_jobrun (
    run_id, job_name, schema_name, subject, status, queue, attempts, max_attempts,
    defer_count, gate_defer_count, queued_at, scheduled_for, started_at, finished_at,
    duration_ms, triggered_by, trigger, correlation_id, trace_id, trace_context,
    parent_run_id, payload, origin, error_type, error_message, rq_job_id, result,
    cancel_requested_at, cancel_requested_by)
SELECT
    md5('run' || g)::uuid,
    'app' || lpad((j / 10)::text, 2, '0') || '.job_' || lpad(j::text, 3, '0'),
    'hs' || lpad(t::text, 5, '0'),
    'invoice_id=' || (g::bigint * 7919 %% 1000003),
    st, 'default',
    CASE WHEN st = 'failed' THEN 3 WHEN st IN ('skipped', 'capped', 'queued') THEN 0
         WHEN g %% 33 = 0 THEN 2 ELSE 1 END,
    3, 0, 0, q, NULL,
    CASE WHEN st IN ('skipped', 'capped', 'queued') THEN NULL ELSE q + interval '40 ms' END,
    CASE WHEN st IN ('succeeded', 'failed', 'cancelled', 'skipped', 'capped')
         THEN q + interval '40 ms' + d * interval '1 ms' END,
    CASE WHEN st IN ('succeeded', 'failed', 'cancelled') THEN d END,
    '', '', md5('corr' || g), '', '{}'::jsonb, NULL,
    jsonb_build_object('invoice_id', g::bigint * 7919 %% 1000003), NULL,
    CASE WHEN st = 'failed' THEN 'RuntimeError' ELSE '' END,
    CASE WHEN st = 'failed' THEN 'the provider timed out' ELSE '' END,
    '', NULL, NULL, ''
FROM (
    SELECT g, j, t, d,
        CASE WHEN r < .95 THEN 'succeeded' WHEN r < .99 THEN 'failed'
             WHEN r < .994 THEN 'cancelled' WHEN r < .997 THEN 'skipped'
             WHEN r < .998 THEN 'capped' WHEN r < .999 THEN 'deferred'
             WHEN r < .9995 THEN 'queued' ELSE 'running' END AS st,
        q0
    FROM (
        SELECT g, floor(200 * power(random(), 2))::int AS j,
            1 + floor(%(tenants)s * power(random(), 2))::int AS t,
            random() AS r, random() * 2000 AS d,
            %(start)s::timestamptz + (g::float8 / %(total)s) * interval '90 days' AS q0
        FROM generate_series(%(first)s, %(last)s) g
    ) raw
) s,
LATERAL (SELECT CASE WHEN st IN ('deferred', 'queued', 'running')
                     THEN %(now)s::timestamptz - random() * interval '1 hour' ELSE q0 END AS q) x
"""

INSERT_ATTEMPTS = """
INSERT INTO kumiko_jobs_jobattempt (
    run_id, number, started_at, finished_at, duration_ms, outcome, error_type, error_message,
    traceback, log, worker)
SELECT r.run_id, a, r.started_at + (a - 1) * interval '1 s',
    r.started_at + (a - 1) * interval '1 s' + coalesce(r.duration_ms, 5) * interval '1 ms',
    coalesce(r.duration_ms, 5),
    CASE WHEN a < r.attempts THEN 'retrying' WHEN r.status = 'failed' THEN 'failed'
         WHEN r.status = 'deferred' THEN 'deferred' WHEN r.status = 'cancelled' THEN 'cancelled'
         ELSE 'succeeded' END,
    CASE WHEN a < r.attempts OR r.status = 'failed' THEN 'RuntimeError' ELSE '' END,
    CASE WHEN a < r.attempts OR r.status = 'failed' THEN 'the provider timed out' ELSE '' END,
    CASE WHEN a < r.attempts OR r.status = 'failed'
         THEN 'Traceback (most recent call last):\n  ...\nRuntimeError: the provider timed out'
         ELSE '' END,
    '[]'::jsonb, 'worker-' || (abs(hashtext(r.run_id::text)) %% 8)
FROM kumiko_jobs_jobrun r, generate_series(1, r.attempts) a
WHERE r.status IN ('succeeded', 'failed', 'cancelled', 'deferred')
"""

INSERT_FAILURES = """
INSERT INTO kumiko_jobs_jobfailure (schema_name, job_name, subject, message_key, failed_at, run_id)
SELECT schema_name, job_name, subject, 'billing.sync_failed', finished_at, run_id
FROM kumiko_jobs_jobrun WHERE status = 'failed'
ON CONFLICT DO NOTHING
"""


def build(runs: int, tenants: int, now: datetime, *, upgrade: bool = True) -> dict[str, float]:
    from django.db import connection

    timings: dict[str, float] = {}
    with step(f"tenants, users, schema up to {'0009' if upgrade else 'the latest'}", timings):
        create_tenants_and_users(tenants, kumiko_target="0009" if upgrade else None)
    sql("SET synchronous_commit = off")
    sql("SET maintenance_work_mem = '1GB'")
    # Load as one loads a big table: secondary indexes and the keys dropped during the insert,
    # rebuilt after (same names, same definitions).
    fks = constraints("kumiko_jobs_jobattempt", "f")
    pk = constraints("kumiko_jobs_jobrun", "p")
    saved = {t: secondary_indexes(t) for t in TABLES[:2]}
    with step("drop secondary indexes and keys for the load", timings):
        for name, _ in fks:
            sql(f'ALTER TABLE kumiko_jobs_jobattempt DROP CONSTRAINT "{name}"')
        for name, _ in pk:
            sql(f'ALTER TABLE kumiko_jobs_jobrun DROP CONSTRAINT "{name}"')
        for indexes in saved.values():
            for name, _ in indexes:
                sql(f'DROP INDEX "{name}"')
    start = now - timedelta(days=90, hours=1)
    chunk = 1_000_000
    with step(f"insert {runs:,} runs", timings):
        for first in range(1, runs + 1, chunk):
            last = min(first + chunk - 1, runs)
            sql(
                INSERT_RUNS,
                {
                    "first": first,
                    "last": last,
                    "total": runs,
                    "tenants": tenants,
                    "start": start,
                    "now": now,
                },
            )
            print(f" {last:,}", end="", flush=True)
    with step("insert attempts", timings):
        sql(INSERT_ATTEMPTS)
    with step("insert failures", timings):
        sql(INSERT_FAILURES)
    with step("primary key, indexes and foreign key back", timings):
        for name, definition in pk:
            sql(f'ALTER TABLE kumiko_jobs_jobrun ADD CONSTRAINT "{name}" {definition}')
        for indexes in saved.values():
            for _, definition in indexes:
                sql(definition)
        for name, definition in fks:
            sql(f'ALTER TABLE kumiko_jobs_jobattempt ADD CONSTRAINT "{name}" {definition}')
    with step("vacuum analyze", timings):
        connection.ensure_connection()
        for table in TABLES:
            sql(f"VACUUM (ANALYZE) {table}")
    timings["total"] = round(sum(timings.values()), 1)
    return timings


# --------------------------------------------------------------------------- upgrade


@dataclass
class LockWatch:
    """What a backend held on the run table, and how writes fared meanwhile."""

    seconds: float = 0.0
    lock_modes: list[str] = field(default_factory=list)
    inserts: int = 0
    slowest_insert_ms: float = 0.0


def watched(action: Callable[[], None], pid_of_action: int) -> LockWatch:
    """Run ``action`` while one connection inserts runs every 10 ms and another samples the
    locks ``pid_of_action`` holds on kumiko_jobs_jobrun."""
    import psycopg

    url = os.environ["DATABASE_URL"]
    watch = LockWatch()
    done = threading.Event()
    modes: set[str] = set()

    def insert() -> None:
        with psycopg.connect(url, autocommit=True) as conn:
            n = 0
            while not done.is_set():
                n += 1
                started = time.perf_counter()
                conn.execute(
                    "INSERT INTO kumiko_jobs_jobrun (run_id, job_name, schema_name, subject,"
                    " status, queue, attempts, max_attempts, defer_count, gate_defer_count,"
                    " queued_at, triggered_by, trigger, correlation_id, trace_id, trace_context,"
                    " payload, error_type, error_message, rq_job_id, cancel_requested_by)"
                    " VALUES (gen_random_uuid(), 'bench.upgrade', %s, '', 'queued', 'default',"
                    " 0, 1, 0, 0, now(), '', '', '', '', '{}', '{}', '', '', '', '')",
                    [BUSY_TENANT],
                )
                watch.slowest_insert_ms = max(
                    watch.slowest_insert_ms, (time.perf_counter() - started) * 1000
                )
                watch.inserts = n
                time.sleep(0.01)

    def sample() -> None:
        with psycopg.connect(url, autocommit=True) as conn:
            while not done.is_set():
                for (mode,) in conn.execute(
                    "SELECT mode FROM pg_locks WHERE pid = %s AND granted"
                    " AND relation = 'kumiko_jobs_jobrun'::regclass",
                    [pid_of_action],
                ):
                    modes.add(str(mode))
                time.sleep(0.02)

    threads = [threading.Thread(target=insert), threading.Thread(target=sample)]
    for thread in threads:
        thread.start()
    time.sleep(0.2)
    started = time.perf_counter()
    try:
        action()
    finally:
        watch.seconds = round(time.perf_counter() - started, 1)
        done.set()
        for thread in threads:
            thread.join()
    watch.lock_modes = sorted(modes)
    watch.slowest_insert_ms = round(watch.slowest_insert_ms, 1)
    return watch


def upgrade(calibrate: bool) -> dict[str, Any]:
    from django.db import connection

    connection.ensure_connection()
    pid = int(sql("SELECT pg_backend_pid()")[0][0])
    sql("SET maintenance_work_mem = '1GB'")
    print("  migrate kumiko_jobs 0010 under inserts ...", flush=True)
    result: dict[str, Any] = {"migration": asdict(watched(lambda: migrate_to("0010"), pid))}
    print(f"    {result['migration']}")
    sql("DELETE FROM kumiko_jobs_jobrun WHERE job_name = 'bench.upgrade'")
    if calibrate:
        print("  calibration: a plain CREATE INDEX under the same inserts ...", flush=True)

        def plain() -> None:
            sql("CREATE INDEX kj_bench_plain ON kumiko_jobs_jobrun (queued_at)")

        # migrate closes Django's connection: the build runs in a new backend.
        connection.ensure_connection()
        pid = int(sql("SELECT pg_backend_pid()")[0][0])
        result["plain_create_index"] = asdict(watched(plain, pid))
        print(f"    {result['plain_create_index']}")
        sql("DROP INDEX kj_bench_plain")
        sql("DELETE FROM kumiko_jobs_jobrun WHERE job_name = 'bench.upgrade'")
    sql("VACUUM (ANALYZE) kumiko_jobs_jobrun")
    return result


# --------------------------------------------------------------------------- write cost


def write_cost(runs: int, rounds: int) -> dict[str, Any]:
    """What the 0010 indexes cost a run's own writes: ``runs`` runs, each one INSERT and two
    UPDATEs (running, succeeded) as single autocommitted statements, into two scratch copies
    of the run table, one with the indexes of 0009 and one with those of 0010 too; rounds
    alternate between them (the machine's load moves). Milliseconds per run, median."""
    import psycopg

    url = os.environ["DATABASE_URL"]
    before = [d for n, d in secondary_indexes("kumiko_jobs_jobrun") if not n.startswith(NEW)]
    after = [d for _, d in secondary_indexes("kumiko_jobs_jobrun")]
    per_run: dict[str, list[float]] = {"0009": [], "0010": []}
    with psycopg.connect(url, autocommit=True) as conn:
        for key, definitions in (("0009", before), ("0010", after)):
            table = f"kj_bench_writes_{key}"
            conn.execute(f"DROP TABLE IF EXISTS {table}")
            conn.execute(
                f"CREATE TABLE {table} (LIKE kumiko_jobs_jobrun INCLUDING DEFAULTS"
                " INCLUDING CONSTRAINTS)"
            )
            conn.execute(f"ALTER TABLE {table} ADD PRIMARY KEY (run_id)")
            for definition in definitions:
                name = definition.split(" ON ")[0].split()[-1]
                conn.execute(
                    definition.replace(f" {name} ON ", f" {name}_{key} ON ").replace(
                        "public.kumiko_jobs_jobrun", table
                    )
                )
        for _ in range(rounds):
            for key in per_run:
                table = f"kj_bench_writes_{key}"
                started = time.perf_counter()
                for i in range(runs):
                    run_id = conn.execute(
                        f"INSERT INTO {table} (run_id, job_name, schema_name, subject, status,"
                        " queue, attempts, max_attempts, defer_count, gate_defer_count, queued_at,"
                        " triggered_by, trigger, correlation_id, trace_id, trace_context, payload,"
                        " error_type, error_message, rq_job_id, cancel_requested_by) VALUES"
                        " (gen_random_uuid(), 'app01.job_010', 'hs00001', %s, 'queued',"
                        " 'default', 0, 1, 0, 0, now(), '', '', md5(random()::text), '', '{}',"
                        " '{}', '', '', '', '') RETURNING run_id",
                        [f"invoice_id={i}"],
                    ).fetchone()
                    key_value = run_id[0] if run_id else None
                    conn.execute(
                        f"UPDATE {table} SET status = 'running', started_at = now(),"
                        " attempts = 1 WHERE run_id = %s",
                        [key_value],
                    )
                    conn.execute(
                        f"UPDATE {table} SET status = 'succeeded', finished_at = now(),"
                        " duration_ms = 1 WHERE run_id = %s",
                        [key_value],
                    )
                per_run[key].append((time.perf_counter() - started) * 1000 / runs)
        for key in per_run:
            conn.execute(f"DROP TABLE kj_bench_writes_{key}")
    medians = {key: round(statistics.median(values), 3) for key, values in per_run.items()}
    return {
        "runs_per_round": runs,
        "rounds": rounds,
        "ms_per_run": medians,
        "ratio": round(medians["0010"] / medians["0009"], 2),
    }


# --------------------------------------------------------------------------- retention


def retention_day() -> dict[str, Any]:
    """Delete the oldest day of finished runs as the sweep does (retention.delete_in_batches,
    BATCH_SIZE rows and their attempts per statement and transaction): rows, time, the
    slowest batch (how long one batch holds its row locks)."""
    from kumiko_jobs.history import retention
    from kumiko_jobs.models import FINISHED_STATUSES, JobRun

    oldest = sql("SELECT min(finished_at) FROM kumiko_jobs_jobrun")[0][0]
    batches: list[float] = []
    last = time.perf_counter()

    def after_batch(deleted: int) -> None:
        nonlocal last
        now = time.perf_counter()
        batches.append((now - last) * 1000)
        last = now

    started = time.perf_counter()
    deleted = retention.delete_in_batches(
        JobRun.objects.filter(
            status__in=FINISHED_STATUSES, finished_at__lt=oldest + timedelta(days=1)
        ),
        after_batch=after_batch,
    )
    seconds = time.perf_counter() - started
    return {
        "runs_deleted": deleted,
        "batch_size": retention.BATCH_SIZE,
        "batches": len(batches),
        "seconds": round(seconds, 1),
        "runs_per_second": round(deleted / seconds),
        "slowest_batch_ms": round(max(batches), 1),
        "median_batch_ms": round(statistics.median(batches), 1),
    }


# --------------------------------------------------------------------------- pages


@dataclass
class Page:
    name: str
    audience: str  # "operator" or "tenant"
    query: str
    path: str = RUNS  # the admin page; the run list unless told
    p50_ms: float = 0.0
    p95_ms: float = 0.0
    rows: int = 0
    db_ms: float = 0.0  # time in SQL of one request (the rest is Python: views, templates)
    queries: int = 0
    indexes: list[str] = field(default_factory=list)
    seq_scans: list[str] = field(default_factory=list)
    unbounded_counts: int = 0
    problems: list[str] = field(default_factory=list)


def clients() -> dict[str, Any]:
    from django.contrib.auth import get_user_model
    from django.test import Client
    from django_tenants.utils import schema_context

    User = get_user_model()
    made = {}
    for audience, host, schema, username in (
        ("operator", "localhost", "public", "operator"),
        ("tenant", f"{BUSY_TENANT}.localhost", BUSY_TENANT, "clerk"),
    ):
        client = Client(HTTP_HOST=host)
        with schema_context(schema):
            client.force_login(User.objects.get(username=username))
        made[audience] = client
    return made


# Each listed run links to its page (both audiences; operators' rows also have checkboxes).
ROW_ID = re.compile(r'href="/admin/kumiko_jobs/jobrun/([0-9a-f-]{36})/change/')


def plan_facts(statement: str) -> tuple[set[str], set[str]]:
    """Indexes a statement's plan uses and the kumiko tables it reads with a Seq Scan."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (FORMAT JSON) " + statement)
        plan = cursor.fetchone()[0]
    plan = json.loads(plan) if isinstance(plan, str) else plan
    indexes: set[str] = set()
    seq: set[str] = set()

    def walk(node: dict[str, Any]) -> None:
        if "Index Name" in node:
            indexes.add(str(node["Index Name"]))
        if node.get("Node Type") == "Seq Scan" and node.get("Relation Name") in TABLES:
            seq.add(str(node["Relation Name"]))
        for child in node.get("Plans", []):
            walk(child)

    walk(plan[0]["Plan"])
    return indexes, seq


def measure_page(page: Page, client: Any, requests: int, check: Callable[[str], str]) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    url = f"{page.path}?{page.query}" if page.query else page.path
    client.get(url)  # warm-up: templates, caches, the plan's pages in memory
    times = []
    for _ in range(requests):
        started = time.perf_counter()
        response = client.get(url)
        times.append((time.perf_counter() - started) * 1000)
        if response.status_code != 200:
            page.problems.append(f"HTTP {response.status_code}")
            break
    times.sort()
    page.p50_ms = round(statistics.median(times), 1)
    page.p95_ms = round(times[min(len(times) - 1, round(0.95 * (len(times) - 1)))], 1)
    with CaptureQueriesContext(connection) as captured:
        response = client.get(url)
    html = response.content.decode()
    page.rows = len(ROW_ID.findall(html))
    problem = check(html)
    if problem:
        page.problems.append(problem)
    page.queries = len(captured.captured_queries)
    page.db_ms = round(sum(float(q["time"]) for q in captured.captured_queries) * 1000, 1)
    for query in captured.captured_queries:
        statement = query["sql"]
        if not any(table in statement for table in TABLES):
            continue
        # A search's keys are read by a UNION ALL of parenthesised SELECTs (admin/search.py).
        if not statement.lstrip().upper().startswith(("SELECT", "(SELECT")):
            continue
        if "COUNT(" in statement.upper() and "LIMIT" not in statement.upper():
            page.unbounded_counts += 1
        sql("SET search_path = public")
        indexes, seq = plan_facts(statement)
        page.indexes = sorted(set(page.indexes) | indexes)
        page.seq_scans = sorted(set(page.seq_scans) | seq)


def rows(expect: int) -> Callable[[str], str]:
    """A page check: the list shows ``expect`` rows."""

    def check(html: str) -> str:
        found = len(ROW_ID.findall(html))
        return "" if found == expect else f"{found} rows listed, expected {expect}"

    return check


def listed_only(model: Any, id_field: str, **filters: Any) -> Callable[[str], str]:
    """A page check: every row listed (by its run's link) is a ``model`` row matching
    ``filters``, looked up by ``id_field``."""

    def check(html: str) -> str:
        ids = ROW_ID.findall(html)
        if not ids:
            return "no rows listed"
        off = model.objects.filter(**{f"{id_field}__in": ids}).exclude(**filters).count()
        return f"{off} listed rows do not match {filters}" if off else ""

    return check


def pages_to_measure(now: datetime) -> list[tuple[Page, Callable[[str], str]]]:
    from kumiko_jobs.admin.pagination import MAX_PAGES
    from kumiko_jobs.models import JobRun

    def only(**filters: Any) -> Callable[[str], str]:
        return listed_only(JobRun, "pk", **filters)

    rare_job = "app19.job_199"
    # As DateFieldListFilter's "Past 7 days" link writes them.
    day = now.replace(hour=0, minute=0, second=0, microsecond=0)
    past_week = urlencode(
        {
            "queued_at__gte": str(day - timedelta(days=7)),
            "queued_at__lt": str(day + timedelta(days=1)),
        }
    )
    # A subject of a run from the middle of the history: a few matches (substring search).
    subject = str(
        JobRun.objects.filter(schema_name="hs00500").values_list("subject", flat=True)[:1][0]
    )
    # The deepest page the list offers (admin.pagination.MAX_PAGES), for the busy tenant too.
    deep = MAX_PAGES
    tenant_deep = min(MAX_PAGES, -(-JobRun.objects.filter(schema_name=BUSY_TENANT).count() // 50))
    return [
        (Page("run list", "operator", ""), rows(50)),
        (Page("status = failed", "operator", "status__exact=failed"), only(status="failed")),
        (Page("status = running", "operator", "status__exact=running"), only(status="running")),
        (Page(f"job = {rare_job}", "operator", f"job={rare_job}"), only(job_name=rare_job)),
        (Page("tenant = hs00500", "operator", "tenant=hs00500"), only(schema_name="hs00500")),
        (
            Page("tenant + status", "operator", "tenant=hs00500&status__exact=failed"),
            only(schema_name="hs00500", status="failed"),
        ),
        (
            Page("date: past 7 days", "operator", past_week),
            only(queued_at__gte=now - timedelta(days=8)),
        ),
        (Page(f"search {subject!r}", "operator", f"q={subject}"), only(subject__contains=subject)),
        (Page("search, no match", "operator", "q=no-such-subject-anywhere"), rows(0)),
        # A value too short for a trigram, in a field no run has: nothing to find anywhere.
        (Page("search, short value, no match", "operator", "q=nosuch=1"), rows(0)),
        (Page("search job name", "operator", f"q={rare_job}"), only(job_name=rare_job)),
        (Page(f"deep page (p={deep})", "operator", f"p={deep}"), rows(50)),
        (Page("tenant's run list", "tenant", ""), only(schema_name=BUSY_TENANT)),
        (
            Page("tenant: status = failed", "tenant", "status__exact=failed"),
            only(schema_name=BUSY_TENANT, status="failed"),
        ),
        (
            Page("tenant: search", "tenant", "q=invoice_id=12"),
            only(schema_name=BUSY_TENANT, subject__contains="invoice_id=12"),
        ),
        (Page("tenant: search, short value, no match", "tenant", "q=nosuch=1"), rows(0)),
        (Page(f"tenant: deep page (p={tenant_deep})", "tenant", f"p={tenant_deep}"), rows(50)),
    ]


def measure_pages(requests: int, now: datetime) -> list[Page]:
    made = clients()
    measured = []
    for page, check in pages_to_measure(now):
        measure_page(page, made[page.audience], requests, check)
        print_page(page)
        measured.append(page)
    return measured


def tenant_filter_check(tenants: int) -> Callable[[str], str]:
    def check(html: str) -> str:
        listed = html.count("?tenant=hs")
        if listed > 100:
            return f"the tenant filter lists {listed} tenants (of {tenants})"
        if 'name="tenant"' not in html:
            return "no tenant input in the filter"
        return ""

    return check


def print_page(page: Page) -> None:
    flag = "ok " if page.p95_ms < BUDGET_MS else "OVER"
    problems = f"  PROBLEMS: {'; '.join(page.problems)}" if page.problems else ""
    print(
        f"  {flag} {page.audience:8} {page.name:34} p50 {page.p50_ms:7.1f} ms  p95 "
        f"{page.p95_ms:7.1f} ms  rows {page.rows:3}  SQL {page.db_ms:5.1f} ms in {page.queries:2} "
        "queries  "
        f"seq scans: {','.join(page.seq_scans) or 'none'}  unbounded counts: "
        f"{page.unbounded_counts}  indexes: {','.join(page.indexes)}{problems}",
        flush=True,
    )


# --------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10_000_000)
    parser.add_argument("--tenants", type=int, default=1000)
    parser.add_argument("--many-tenants", type=int, default=10_000)
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--reuse", action="store_true", help="keep a database that has the rows")
    parser.add_argument("--no-calibration", action="store_true")
    parser.add_argument(
        "--no-upgrade",
        action="store_true",
        help="build with every migration's indexes (rebuilt after the load) instead of timing"
        " the 0010 upgrade on the loaded table (saves ~15 min at 10 M runs)",
    )
    parser.add_argument(
        "--write-cost",
        type=int,
        default=0,
        metavar="RUNS",
        help="also time RUNS single-row run writes with and without the 0010 indexes",
    )
    parser.add_argument(
        "--retention", action="store_true", help="at the end, delete the oldest day as the sweep"
    )
    parser.add_argument("--skip-pages", action="store_true")
    parser.add_argument("--drop", action="store_true", help="drop the database at the end")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--database", default=BENCH_DATABASE, help=f"({BENCH_DATABASE})")
    parser.add_argument("--redis-db", type=int, default=BENCH_REDIS_DB, help=f"({BENCH_REDIS_DB})")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    admin_url = prepare_environment(
        fresh=not args.reuse, database=args.database, redis_db=args.redis_db
    )
    machine = machine_facts()
    from django.db import connection

    now = datetime.now(UTC)
    results: dict[str, Any] = {"runs": args.runs, "tenants": args.tenants, "machine": machine}
    have = existing_runs()
    if args.reuse and have >= args.runs:
        print(f"reusing {args.database}: {have:,} runs")
        # The rows' times were relative to the build; the pages' date filter uses the newest.
        newest = sql("SELECT max(queued_at) FROM kumiko_jobs_jobrun")[0][0]
        now = newest if newest else now
    else:
        if have:
            drop_database(admin_url, args.database)
            connection.close()
            prepare_environment(fresh=True, database=args.database, redis_db=args.redis_db)
        print(f"building {args.runs:,} runs for {args.tenants:,} tenants in {args.database}")
        results["build_seconds"] = build(args.runs, args.tenants, now, upgrade=not args.no_upgrade)
        if not args.no_upgrade:
            results["upgrade"] = upgrade(calibrate=not args.no_calibration)
    # The pages run today's code, which reads every column: the migrations after 0010 too
    # (none rewrites the run table; a reused database is brought up to date the same way).
    migrate_latest()
    sizes = sql(
        "SELECT relname, pg_size_pretty(pg_total_relation_size(oid)), reltuples::bigint"
        " FROM pg_class WHERE relname = ANY(%s)",
        [list(TABLES)],
    )
    results["sizes"] = {str(name): [str(size), int(rows)] for name, size, rows in sizes}
    print("  sizes: " + ", ".join(f"{n} {s} (~{r:,})" for n, (s, r) in results["sizes"].items()))
    if args.write_cost:
        results["write_cost"] = write_cost(args.write_cost, rounds=5)
        print(f"  write cost of the 0010 indexes: {results['write_cost']}")
    if args.retention:
        results["retention"] = retention_day()
        print(f"  retention, the oldest day: {results['retention']}")
    if args.skip_pages:
        if args.json:
            write_results("history_scale", stamp, results)
        return 0
    print(f"\npages, {args.requests} requests each (budget p95 < {BUDGET_MS:.0f} ms):")
    pages = measure_pages(args.requests, now)
    print(f"\n{args.many_tenants:,} tenants (rows only):")
    add_tenant_rows(args.many_tenants)
    made = clients()
    many = []
    for page in (
        Page(f"run list, {args.many_tenants:,} tenants", "operator", ""),
        Page(f"tenant filter, {args.many_tenants:,} tenants", "operator", "tenant=hs09999"),
    ):
        measure_page(page, made["operator"], args.requests, tenant_filter_check(args.many_tenants))
        print_page(page)
        many.append(page)
    results["pages"] = [asdict(p) for p in pages + many]
    over = [p.name for p in pages + many if p.p95_ms >= BUDGET_MS]
    wrong = [p.name for p in pages + many if p.problems or p.seq_scans or p.unbounded_counts]
    print(f"\nover budget: {', '.join(over) or 'none'}")
    print(f"wrong, scanning or counting: {', '.join(wrong) or 'none'}")
    print_load(machine)
    if args.json:
        write_results("history_scale", stamp, results)
    connection.close()
    if args.drop:
        drop_database(admin_url, args.database)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
