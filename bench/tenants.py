"""Many tenants with schemas: provisioning their roles (DB_ROLES), and draining a fan-out's
children with real workers while the tenant-role connections stay bounded.

bench/fanout.py measures the enqueue side with tenant rows that have no schema. Here every
tenant gets a schema, made cheaply: ``CREATE SCHEMA`` plus the one table the child job writes
(``billing_activitylog``, created from the model's own DDL), in batches, instead of
django-tenants' ``save()`` (which runs every migration per schema: hours for 10,000). Then:

(roles)  ``role_sync.sync_all()`` (what ``manage.py kumiko_jobs roles`` runs) for every tenant,
         timed, twice: creating the roles, then again as the idempotent repair of a deploy.
         Counted: the roles made, and the grant entries on a shared table (``customers_client``)
         before and after, which must not grow with the tenants (the group role holds them).
(drain)  ``billing.bench_fanout.enqueue(n=0)``: the parent run fans out to every tenant
         in-process (as in bench/fanout.py), then ``--workers`` processes (``manage.py
         rqworker default``, DB_ROLES on: each child's body logs in as its tenant's role) drain
         the first ``--drain`` children. Reported: children/s, the queued -> started wait of the
         drained children (p50/p95/max), and the most connections PostgreSQL held for tenant
         roles and in all while draining (sampled from ``pg_stat_activity`` every 0.2 s), which
         ``DB_ROLE_POOL_SIZE`` bounds per worker (every child of a different tenant: each run
         connects once the pool is full, the least recently used connection is closed).

    python -m bench.tenants [--tenants 10000] [--drain 1000] [--workers 2] [--no-roles]
                            [--roles-for N] [--json]

Database ``kumiko_bench_tenants`` (created, then dropped with its roles), Redis database 7
(flushed). A benchmark, not a test: it checks every drained child succeeded, nothing about speed.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import common
from bench.fairness import Workers
from bench.throughput import (
    QUEUE,
    ROOT,
    clean_up,
    create_tenants,
    machine_facts,
    prepare_environment,
    print_load,
    reset,
    write_results,
)

BENCH_DATABASE = "kumiko_bench_tenants"
BENCH_REDIS_DB = 7
SHARED_TABLE = "customers_client"


# --------------------------------------------------------------------------- setup


def create_light_tenants(count: int, batch: int = 200) -> list[str]:
    """``count`` tenants, each with a schema holding the child job's table (nothing else)."""
    from django.db import connection

    from example_project.billing.models import ActivityLog
    from example_project.customers.models import Client

    create_tenants(0)  # the shared schema and the public tenant
    with connection.schema_editor(collect_sql=True) as editor:
        editor.create_model(ActivityLog)
    ddl = " ".join(editor.collected_sql)
    schemas = [f"many{i:05d}" for i in range(1, count + 1)]
    with connection.cursor() as cursor:
        for start in range(0, count, batch):
            cursor.execute(
                " ".join(
                    f'CREATE SCHEMA "{s}"; SET search_path TO "{s}"; {ddl}'
                    for s in schemas[start : start + batch]
                )
                + " SET search_path TO public;"
            )
    connection.set_schema_to_public()  # type: ignore[attr-defined]  # django-tenants adds it
    Client.objects.bulk_create([Client(schema_name=s, name=s) for s in schemas], batch_size=1000)
    return schemas


# --------------------------------------------------------------------------- roles


def grant_entries(table: str) -> list[str]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT a.grantee::regrole::text FROM pg_class c JOIN pg_namespace n "
            "ON n.oid = c.relnamespace, aclexplode(c.relacl) a "
            "WHERE n.nspname = 'public' AND c.relname = %s",
            [table],
        )
        return sorted({row[0] for row in cursor.fetchall()})


def role_count() -> int:
    from django.db import connection

    from kumiko_jobs.guard.roles import privileges as role_grants

    with connection.cursor() as cursor:
        return len(role_grants.our_roles(cursor))


def measure_roles() -> dict[str, Any]:
    from kumiko_jobs.guard.roles import sync as role_sync

    before = grant_entries(SHARED_TABLE)
    started = time.perf_counter()
    first = role_sync.sync_all()
    create_s = time.perf_counter() - started
    after = grant_entries(SHARED_TABLE)
    started = time.perf_counter()
    second = role_sync.sync_all()
    repair_s = time.perf_counter() - started
    started = time.perf_counter()
    stale = role_sync.out_of_date()
    check_s = time.perf_counter() - started
    return {
        "tenants": len(first.ensured),
        "skipped": len(first.skipped),
        "roles": role_count(),
        "create_seconds": create_s,
        "repair_seconds": repair_s,
        "repair_ensured": len(second.ensured),
        "out_of_date_seconds": check_s,
        "out_of_date": len(stale),
        "grant_entries_before": before,
        "grant_entries_after": after,
    }


def roles_for_first(count: int) -> dict[str, Any]:
    """Roles for the first ``count`` tenants only (the ones a short drain reaches): what the
    tenant hooks do at creation, one transaction per ``role_sync.SYNC_CHUNK`` tenants."""
    from django.db import connection, transaction

    from example_project.customers.models import Client
    from kumiko_jobs.guard.roles import privileges as role_grants
    from kumiko_jobs.guard.roles import sync as role_sync

    tenants = list(
        Client.objects.exclude(schema_name="public")
        .order_by("pk")
        .values_list("pk", "schema_name")[:count]
    )
    started = time.perf_counter()
    with connection.cursor() as cursor:
        role_grants.ensure_group(cursor)
        for start in range(0, len(tenants), role_sync.SYNC_CHUNK):
            with transaction.atomic():
                for pk, schema in tenants[start : start + role_sync.SYNC_CHUNK]:
                    role_grants.ensure_tenant_role(cursor, pk, schema)
    return {
        "tenants": len(tenants),
        "roles": role_count(),
        "create_seconds": time.perf_counter() - started,
        "partial": True,
    }


# --------------------------------------------------------------------------- drain


class ConnectionSampler(threading.Thread):
    """The most connections to the bench database, in all and as tenant roles, every 0.2 s."""

    def __init__(self, database: str, role_prefix: str) -> None:
        super().__init__(daemon=True)
        self.database, self.prefix = database, role_prefix
        self.stop_event = threading.Event()
        self.max_total = self.max_roles = 0

    def run(self) -> None:
        import psycopg

        with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
            while not self.stop_event.is_set():
                total, roles = conn.execute(
                    "SELECT count(*), count(*) FILTER (WHERE usename LIKE %s) "
                    "FROM pg_stat_activity WHERE datname = %s",
                    [self.prefix + "%", self.database],
                ).fetchone() or (0, 0)
                self.max_total, self.max_roles = (
                    max(self.max_total, total),
                    max(self.max_roles, roles),
                )
                self.stop_event.wait(0.2)


def measure_drain(count: int, workers: int, database: str) -> dict[str, Any]:
    from django.db.models import F

    from example_project.billing.jobs import bench_fanout
    from kumiko_jobs import transport
    from kumiko_jobs.core import conf
    from kumiko_jobs.guard.roles import names as role_names
    from kumiko_jobs.models import JobRun, RunStatus
    from kumiko_jobs.worker import Worker

    reset([])
    parent = bench_fanout.enqueue(n=0)
    queue = transport.get_queue(QUEUE)
    started = time.perf_counter()
    Worker([queue], connection=queue.connection).work(
        burst=True, max_jobs=1, logging_level="WARNING"
    )
    fanout_s = time.perf_counter() - started
    children = JobRun.objects.filter(parent_run_id=parent.run_id)
    total = children.count()
    done = children.exclude(status__in=(RunStatus.QUEUED, RunStatus.RUNNING))
    sampler = ConnectionSampler(database, role_names.prefix())
    sampler.start()
    pool = Workers(workers, Path(tempfile.mkdtemp(prefix="kj-bench-tenants-")), "drain")
    started = time.perf_counter()
    try:
        while done.count() < count and pool.alive():
            time.sleep(0.2)
        drain_s = time.perf_counter() - started
    finally:
        pool.stop()
        sampler.stop_event.set()
        sampler.join()
    finished = list(
        done.annotate(wait=F("started_at") - F("queued_at")).values_list("status", "wait")
    )
    waits = sorted(w.total_seconds() for _, w in finished if w is not None)

    def pct(p: float) -> float:
        return waits[min(len(waits) - 1, int(p * len(waits)))] if waits else 0.0

    return {
        "children": total,
        "fanout_seconds": fanout_s,
        "drained": len(finished),
        "succeeded": sum(status == RunStatus.SUCCEEDED for status, _ in finished),
        "drain_seconds": drain_s,
        "children_per_s": len(finished) / drain_s if drain_s else 0.0,
        "wait_p50": pct(0.5),
        "wait_p95": pct(0.95),
        "wait_max": waits[-1] if waits else 0.0,
        "max_connections": sampler.max_total,
        "max_tenant_role_connections": sampler.max_roles,
        "workers": workers,
        "db_roles": conf.get().DB_ROLES,
        "pool_size": conf.get().DB_ROLE_POOL_SIZE,
    }


# --------------------------------------------------------------------------- report


@dataclass
class Results:
    tenants: int
    started_at: str
    machine: dict[str, Any]
    setup_seconds: float = 0.0
    roles: dict[str, Any] = field(default_factory=dict)
    drain: dict[str, Any] = field(default_factory=dict)


def print_report(results: Results) -> None:
    print()
    print(f"{results.tenants} tenants with schemas (made in {results.setup_seconds:.0f} s)")
    r = results.roles
    if r.get("partial"):
        print(
            f"  roles for the first {r['tenants']} tenants only: {r['roles']} roles in "
            f"{r['create_seconds']:.1f} s ({r['create_seconds'] / max(r['tenants'], 1) * 1000:.0f}"
            " ms a tenant)"
        )
    elif r:
        print(
            f"  roles (role_sync.sync_all = manage.py kumiko_jobs roles): {r['tenants']} tenants, "
            f"{r['roles']} roles (tenant, reader, writer each)"
        )
        print(
            f"    create {r['create_seconds']:.1f} s "
            f"({r['create_seconds'] / max(r['tenants'], 1) * 1000:.1f} ms a tenant), "
            f"repair run {r['repair_seconds']:.1f} s, out_of_date() (check E012) "
            f"{r['out_of_date_seconds']:.2f} s, {r['out_of_date']} out of date"
        )
        print(
            f"    grant entries on public.{SHARED_TABLE}: {len(r['grant_entries_before'])} "
            f"before, {len(r['grant_entries_after'])} after: {', '.join(r['grant_entries_after'])}"
        )
    d = results.drain
    if d:
        print(
            f"  drain: the parent fanned out to {d['children']} tenants in "
            f"{d['fanout_seconds']:.2f} s; {d['workers']} workers (manage.py rqworker, DB_ROLES "
            f"{d['db_roles']}, DB_ROLE_POOL_SIZE {d['pool_size']}) drained {d['drained']} "
            f"children in {d['drain_seconds']:.1f} s = {d['children_per_s']:.0f}/s, "
            f"{d['succeeded']} succeeded"
        )
        print(
            f"    queued -> started: p50 {d['wait_p50']:.1f} s, p95 {d['wait_p95']:.1f} s, "
            f"max {d['wait_max']:.1f} s"
        )
        print(
            f"    connections to the database at most {d['max_connections']}, of them tenant "
            f"roles {d['max_tenant_role_connections']} (bound: workers x pool size = "
            f"{d['workers'] * d['pool_size']})"
        )
        if d["succeeded"] != d["drained"]:
            print("  WARNING: not every drained child succeeded; see the worker logs")
    print_load(results.machine)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = common.parser(
        "python -m bench.tenants", __doc__, database=BENCH_DATABASE, redis_db=BENCH_REDIS_DB
    )
    parser.add_argument("--tenants", type=int, default=10000, help="tenants (10000)")
    parser.add_argument("--drain", type=int, default=1000, help="children to drain (1000)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes (2)")
    parser.add_argument("--no-roles", action="store_true", help="skip the roles; DB_ROLES off")
    parser.add_argument(
        "--roles-for",
        type=int,
        default=None,
        metavar="N",
        help="provision roles for the first N tenants only (those the drain reaches), "
        "instead of role_sync.sync_all for all",
    )
    args = parser.parse_args(argv)
    if args.tenants < 1 or args.drain < 0 or args.workers < 1:
        parser.error("--tenants and --workers must be >= 1, --drain >= 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    sys.path.insert(0, str(ROOT))
    admin_url = prepare_environment(args.database, args.redis_db)
    # The worker processes inherit this environment: the same DB_ROLES as this process.
    os.environ["KUMIKO_BENCH_DB_ROLES"] = "0" if args.no_roles else "1"
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings_db_roles"
    if args.no_roles:
        from django.conf import settings
        from django.test import override_settings

        override_settings(KUMIKO_JOBS={**settings.KUMIKO_JOBS, "DB_ROLES": False}).enable()
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    try:
        print(f"creating {args.tenants} tenants with light schemas ...", flush=True)
        started = time.perf_counter()
        create_light_tenants(args.tenants)
        results = Results(args.tenants, stamp, machine_facts(), time.perf_counter() - started)
        if args.roles_for and not args.no_roles:
            print(f"provisioning roles for the first {args.roles_for} tenants ...", flush=True)
            results.roles = roles_for_first(args.roles_for)
        elif not args.no_roles:
            print("provisioning roles (role_sync.sync_all, twice) ...", flush=True)
            results.roles = measure_roles()
        if args.drain:
            print(f"fan-out, then {args.workers} workers drain {args.drain} ...", flush=True)
            drained = min(args.drain, args.tenants)
            results.drain = measure_drain(drained, args.workers, args.database)
        print_report(results)
        if args.json:
            write_results("tenants", stamp, asdict(results))
    finally:
        from kumiko_jobs.guard.roles import connections as tenant_connections

        tenant_connections.close_all()
        clean_up(admin_url, args.database, keep_database=args.keep_database)
    return 0


if __name__ == "__main__":
    sys.exit(main())
