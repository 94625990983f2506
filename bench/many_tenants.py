"""10,000 tenants with a backlog: one worker's throughput and Redis round trips per message.

    python -m bench.many_tenants [--tenants 10000] [--per-tenant 1] [--measure 1000]
                                 [--rounds 2] [--redis-db 7]

Two backlogs of ``--tenants x --per-tenant`` runs of ``billing.bench_write`` (one small tenant
write) wait on the default queue, with the default ``FAIRNESS="tenant"``:

- **one**: every run in one tenant (the fair dequeue has one bucket);
- **many**: ``--per-tenant`` runs in each of ``--tenants`` tenants (as many buckets).

One in-process kumiko ``Worker`` (burst, ``max_jobs=--measure``) drains the first
``--measure`` runs of each; with ``--measure`` a tenth of ``--tenants`` the dequeue works
against 9,000 to 10,000 backlogged buckets the whole time (the fair dequeue takes one message
of each tenant in turn). Printed per round: runs/s of each, the ratio many/one (target >= 0.95),
and the Redis round trips per message (commands plus pipelines, this process's, i.e. the worker's;
target 3, as tests/integration/test_worker_round_trips.py counts them), SQL statements per
run, and CPU per run of the worker (this process), of PostgreSQL's backends and of the Redis server
(``INFO cpu``: the whole server's, so only meaningful when nothing else uses it): on a loaded
machine the wall-clock rates wander, and the CPU figures say where a difference comes from.
The rounds alternate one/many so that a change of the machine's load hits both.

The shortcut, said plainly: creating 10,000 django-tenants schemas with their migrations takes
hours, so only one tenant (``bench1``) is created the django-tenants way; the other tenants are
rows of the tenant model (``bulk_create``, no ``save``) whose schemas hold only what the job
touches: ``CREATE SCHEMA`` and ``CREATE TABLE <schema>.billing_activitylog (LIKE
bench1.billing_activitylog INCLUDING ALL)``, a few hundred schemas per transaction. The worker
enters each tenant as it enters any (``search_path``, the tenant lookup, the guard), and the
run writes its row there. ``DB_ROLES`` is off for this bench (a login role per tenant would add
10,000 roles, and one connection per tenant, which is bench/tenants.py's subject, not the
dequeue's).

Its own database (``kumiko_bench_many``, dropped at the end) and Redis database 7 (flushed;
shared with bench/tenants.py, dashboard_scale.py and bulk_enqueue.py, never run at the same
time: it stops if another client uses it when it starts).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

from bench.bulk_enqueue import refuse_a_shared_redis_db
from bench.throughput import (
    ROOT,
    _backend_cpu_seconds,
    _kumiko_worker,
    clean_up,
    counting_round_trips,
    create_tenants,
    kumiko_queue,
    machine_facts,
    prepare_environment,
    reset,
)

BENCH_DATABASE = "kumiko_bench_many"
BENCH_REDIS_DB = 7
SCHEMAS_PER_TRANSACTION = 250


def create_light_tenants(template: Any, count: int) -> list[Any]:
    """``count`` tenant rows with a schema holding only the job's table (the docstring's
    shortcut); the tenant objects."""
    from django.db import connection, transaction

    from example_project.customers.models import Client

    names = [f"mt{i:05d}" for i in range(1, count + 1)]
    started = time.perf_counter()
    Client.objects.bulk_create(
        [Client(schema_name=name, name=f"Many {name}") for name in names], batch_size=2000
    )
    source = f'"{template.schema_name}".billing_activitylog'
    connection.set_schema_to_public()  # type: ignore[attr-defined]  # django-tenants adds it
    for start in range(0, count, SCHEMAS_PER_TRANSACTION):
        statements = []
        for name in names[start : start + SCHEMAS_PER_TRANSACTION]:
            statements.append(f'CREATE SCHEMA "{name}"')
            statements.append(
                f'CREATE TABLE "{name}".billing_activitylog (LIKE {source} INCLUDING ALL)'
            )
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(";\n".join(statements))
    print(f"{count} light tenants in {time.perf_counter() - started:.1f} s", flush=True)
    return list(Client.objects.filter(schema_name__in=names).order_by("schema_name"))


def empty_tables(tenants: Sequence[Any]) -> None:
    """kumiko's history, the bench's Redis database, and every tenant's written rows."""
    from django.db import connection

    reset(tenants[:1])
    with connection.cursor() as cursor:
        for start in range(0, len(tenants), 1000):
            tables = ", ".join(
                f'"{t.schema_name}".billing_activitylog' for t in tenants[start : start + 1000]
            )
            cursor.execute(f"TRUNCATE {tables}")


def enqueue_backlog(tenants: Sequence[Any], per_tenant: int, total: int) -> None:
    """``total`` runs, ``per_tenant`` per tenant of ``tenants`` (cycling), tenant by tenant
    interleaved: round r enqueues one run in each tenant."""
    from django.db import transaction

    from example_project.billing.jobs import bench_write

    if len(tenants) == 1:
        for start in range(0, total, 5000):
            with transaction.atomic():
                bench_write.enqueue_many(
                    [{"n": n} for n in range(start, min(total, start + 5000))],
                    tenant=tenants[0],
                )
        return
    # One enqueue_many per tenant and round, committed 500 tenants at a time.
    for round_ in range(per_tenant):
        for start in range(0, len(tenants), 500):
            with transaction.atomic():
                for tenant in tenants[start : start + 500]:
                    bench_write.enqueue_many([{"n": round_}], tenant=tenant)


def redis_cpu_seconds(connection: Any) -> float:
    """The Redis server's CPU seconds so far (``INFO cpu``: its main thread and the rest).
    The whole server's, every client's and database's: only a quiet server makes the
    difference of two readings this bench's."""
    info = connection.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def drain(measure: int) -> tuple[float, dict[str, float]]:
    """Drain ``measure`` runs; the seconds, and the round trips, this process's CPU seconds,
    PostgreSQL's backends' CPU seconds (None: not readable) and the Redis server's meanwhile."""
    queue = kumiko_queue()
    worker = _kumiko_worker()([queue], connection=queue.connection, serializer=queue.serializer)
    backend = _backend_cpu_seconds()
    redis_before = redis_cpu_seconds(queue.connection)
    with counting_round_trips() as counts:
        started, cpu = time.perf_counter(), time.process_time()
        worker.work(burst=True, logging_level="WARNING", max_jobs=measure)
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    after = _backend_cpu_seconds()
    out: dict[str, float] = {**counts, "cpu": cpu}
    out["db_cpu"] = after - backend if after is not None and backend is not None else -1.0
    out["redis_cpu"] = redis_cpu_seconds(queue.connection) - redis_before
    return seconds, out


def succeeded() -> int:
    from kumiko_jobs.models import JobRun, RunStatus

    return JobRun.objects.filter(status=RunStatus.SUCCEEDED).count()


def buckets_with_backlog() -> int:
    """The fair dequeue's buckets that still hold messages (RQ's list before its first
    dequeue files them): read from Redis after the drain."""
    from kumiko_jobs.models import JobRun, RunStatus

    return JobRun.objects.filter(status=RunStatus.QUEUED).values("schema_name").distinct().count()


def one_case(
    name: str, tenants: Sequence[Any], per_tenant: int, total: int, measure: int
) -> dict[str, float]:
    empty_tables(tenants)
    enqueue_backlog(tenants, per_tenant, total)
    seconds, counts = drain(measure)
    done = succeeded()
    if done != measure:
        raise RuntimeError(f"{name}: {done} runs succeeded of the {measure} drained")
    backlog = buckets_with_backlog()
    result = {
        "rate": measure / seconds,
        "redis": counts["redis"] / measure,
        "sql": counts["sql"] / measure,
        "cpu_ms": 1000 * counts["cpu"] / measure,
        "db_cpu_ms": 1000 * counts["db_cpu"] / measure,
        "redis_cpu_ms": 1000 * counts["redis_cpu"] / measure,
        "backlogged_after": backlog,
    }
    print(
        f"  {name:>4}: {result['rate']:7.1f} runs/s  {result['redis']:.2f} Redis round trips/msg"
        f"  {result['sql']:.2f} SQL/run  CPU/run: worker {result['cpu_ms']:.2f} ms, PostgreSQL"
        f" {result['db_cpu_ms']:.2f} ms, Redis {result['redis_cpu_ms']:.3f} ms"
        f"  ({backlog} tenants still backlogged after;"
        f" load {os.getloadavg()[0]:.2f})",
        flush=True,
    )
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.many_tenants",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--tenants", type=int, default=10000)
    parser.add_argument("--per-tenant", type=int, default=1)
    parser.add_argument("--measure", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--database", default=BENCH_DATABASE)
    parser.add_argument("--redis-db", type=int, default=BENCH_REDIS_DB)
    parser.add_argument(
        "--fifo",
        action="store_true",
        help="also drain the many tenants with FAIRNESS='fifo' each round: the same PostgreSQL "
        "work (a table per tenant), so many/fifo is the fair dequeue's own cost",
    )
    args = parser.parse_args(argv)
    total = args.tenants * args.per_tenant
    if args.measure > total:
        parser.error("--measure must not exceed --tenants x --per-tenant")
    sys.path.insert(0, str(ROOT))
    admin_url = prepare_environment(args.database, args.redis_db)
    from django.conf import settings
    from django.test import override_settings

    # DB_ROLES off (see the docstring); everything else the example project's defaults.
    override_settings(KUMIKO_JOBS={**settings.KUMIKO_JOBS, "DB_ROLES": False}).enable()
    from kumiko_jobs.core import conf

    refuse_a_shared_redis_db()
    machine = machine_facts()
    print(
        f"machine: {machine['cpus']} CPUs, load {machine['loadavg_at_start']} at start; "
        f"FAIRNESS {conf.get().FAIRNESS}, DB_ROLES {conf.get().DB_ROLES}; "
        f"{total} runs queued per case, {args.measure} drained"
    )
    try:
        [first] = create_tenants(1)
        many = [first, *create_light_tenants(first, args.tenants - 1)]
        one_case("warm", [first], 1, 200, 200)  # connections, imports, the first tenant
        results: dict[str, list[dict[str, float]]] = {"one": [], "many": [], "fifo": []}
        fifo = {**settings.KUMIKO_JOBS, "DB_ROLES": False, "FAIRNESS": "fifo"}
        for round_ in range(args.rounds):
            print(f"round {round_ + 1}:", flush=True)
            results["one"].append(one_case("one", [first], total, total, args.measure))
            results["many"].append(one_case("many", many, args.per_tenant, total, args.measure))
            if args.fifo:
                with override_settings(KUMIKO_JOBS=fifo):
                    case = one_case("fifo", many, args.per_tenant, total, args.measure)
                results["fifo"].append(case)
        one = statistics.median(r["rate"] for r in results["one"])
        spread = statistics.median(r["rate"] for r in results["many"])
        ratios = [
            m["rate"] / o["rate"] for o, m in zip(results["one"], results["many"], strict=True)
        ]
        print(
            f"median: one tenant {one:.1f} runs/s, {args.tenants} tenants {spread:.1f} runs/s, "
            f"ratio {spread / one:.3f} (per round {', '.join(f'{r:.3f}' for r in ratios)}); "
            f"Redis round trips/msg one {statistics.median(r['redis'] for r in results['one']):.2f}"
            f", many {statistics.median(r['redis'] for r in results['many']):.2f}; CPU/run "
            f"worker {statistics.median(r['cpu_ms'] for r in results['one']):.2f} / "
            f"{statistics.median(r['cpu_ms'] for r in results['many']):.2f} ms, PostgreSQL "
            f"{statistics.median(r['db_cpu_ms'] for r in results['one']):.2f} / "
            f"{statistics.median(r['db_cpu_ms'] for r in results['many']):.2f} ms, Redis "
            f"{statistics.median(r['redis_cpu_ms'] for r in results['one']):.3f} / "
            f"{statistics.median(r['redis_cpu_ms'] for r in results['many']):.3f} ms (one / many)"
        )
        if results["fifo"]:
            fair_over_fifo = [
                m["rate"] / f["rate"] for m, f in zip(results["many"], results["fifo"], strict=True)
            ]
            print(
                f"the same {args.tenants} tenants drained FIFO: "
                f"{statistics.median(r['rate'] for r in results['fifo']):.1f} runs/s; fair/FIFO "
                f"{statistics.median(fair_over_fifo):.3f} (per round "
                f"{', '.join(f'{r:.3f}' for r in fair_over_fifo)}); CPU/run worker "
                f"{statistics.median(r['cpu_ms'] for r in results['fifo']):.2f} ms, PostgreSQL "
                f"{statistics.median(r['db_cpu_ms'] for r in results['fifo']):.2f} ms, Redis "
                f"{statistics.median(r['redis_cpu_ms'] for r in results['fifo']):.3f} ms"
            )
    finally:
        clean_up(admin_url, args.database, keep_database=False)
    print(f"load average at end {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
