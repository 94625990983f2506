"""The dashboard's endpoints at a large history: each JSON endpoint timed, its queries EXPLAINed.

Builds the same history as ``bench/history_scale.py`` (its ``build``: ``--tenants`` tenants,
200 job names, both skewed, 90 days, every index) in its own database, then requests the
operators' JSON (hour, day, week; filtered by job, tenant, queue), the metrics page and the
busy tenant's console, ``--requests`` times each after a warm-up, twice: **cold**, with the
dashboard's cache off (admin/dashboard/data.py: ``POINT_CACHE``, ``CACHE_SECONDS``), so every
request computes every point (a first visit, or a new filter), first from the raw history
alone (**cold, raw**: the dashboard before its rollup; points, failure groups and worker time
all raw), then, after rolling the history up from nothing as the workers' maintenance would
(history/rollup.py, timed), through the rollup (**cold**); then **warm**, as the page's
refresh finds it: the settled points kept, the current one read.

    python -m bench.dashboard_scale [--runs 10000000] [--tenants 1000] [--requests 10]
                                    [--reuse] [--drop] [--json]

Database ``kumiko_dashboard_scale``, Redis database 7. A benchmark, not a test: it asserts
nothing about speed; it checks that every endpoint answers 200 and reads no kumiko table with
a Seq Scan.
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

from bench.history_scale import (
    BUDGET_MS,
    Page,
    build,
    clients,
    existing_runs,
    measure_page,
    migrate_latest,
    prepare_environment,
    print_page,
)
from bench.throughput import drop_database, machine_facts, print_load, write_results

DATABASE = "kumiko_dashboard_scale"
REDIS_DB = 7
BASE = "/admin/kumiko_jobs/jobrun/"


def pages() -> list[Page]:
    data, console = f"{BASE}dashboard/data/", f"{BASE}console/data/"
    return [
        Page("ops: hour", "operator", "window=hour", data),
        Page("ops: day", "operator", "window=day", data),
        Page("ops: week", "operator", "window=week", data),
        Page("ops: week, rare job", "operator", "window=week&job=app19.job_199", data),
        Page("ops: day, busy tenant", "operator", "window=day&tenant=hs00001", data),
        Page("ops: day, queue", "operator", "window=day&queue=default", data),
        Page("metrics", "operator", "", f"{BASE}dashboard/metrics/"),
        Page("ops page (HTML)", "operator", "", f"{BASE}dashboard/"),
        Page("tenant console, 14 days", "tenant", "", console),
        Page("tenant console, 30 days", "tenant", "days=30", console),
    ]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10_000_000)
    parser.add_argument("--tenants", type=int, default=1000)
    parser.add_argument("--requests", type=int, default=10)
    parser.add_argument("--reuse", action="store_true", help="keep a database that has the rows")
    parser.add_argument("--drop", action="store_true", help="drop the database at the end")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--database", default=DATABASE, help=f"({DATABASE})")
    parser.add_argument("--redis-db", type=int, default=REDIS_DB, help=f"({REDIS_DB})")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    admin_url = prepare_environment(
        fresh=not args.reuse, database=args.database, redis_db=args.redis_db
    )
    machine = machine_facts()
    results: dict[str, Any] = {"runs": args.runs, "tenants": args.tenants, "machine": machine}
    if not (args.reuse and existing_runs() >= args.runs):
        print(f"building {args.runs:,} runs for {args.tenants:,} tenants in {args.database}")
        results["build_seconds"] = build(args.runs, args.tenants, datetime.now(UTC), upgrade=False)
    migrate_latest()
    from kumiko_jobs.admin.dashboard import data
    from kumiko_jobs.history import rollup, stats

    made = clients()
    measured = []
    with_rollup = stats.points, stats.failure_groups, stats.worker_time
    for mode in ("cold, raw", "cold", "warm"):
        if mode == "cold, raw":  # every part from the raw history, whatever the rollup holds
            stats.points = lambda w, s, since, until, **_: stats.raw_points(w, s, since, until)
            stats.failure_groups = functools.partial(with_rollup[1], use_rollup=False)
            stats.worker_time = functools.partial(with_rollup[2], use_rollup=False)
        else:
            stats.points, stats.failure_groups, stats.worker_time = with_rollup
        if mode == "cold":
            from django.db import connection

            with connection.cursor() as cursor:  # from nothing, as after deploying it
                cursor.execute(
                    f"TRUNCATE {rollup.ROLLUP_TABLE}, {rollup.WORKER_TIME_TABLE}, "
                    f"{rollup.MARK_TABLE}"
                )
            started = time.perf_counter()
            results["rollup_buckets"] = rollup.catch_up()
            results["rollup_seconds"] = round(time.perf_counter() - started, 1)
            print(
                f"\nrolled up {results['rollup_buckets']} buckets in {results['rollup_seconds']} s"
            )
        data.POINT_CACHE = mode == "warm"
        data.CACHE_SECONDS.update(dict.fromkeys(("console", "worker_time"), 60 * (mode == "warm")))
        print(f"\n{mode}, {args.requests} requests each (budget p95 < {BUDGET_MS:.0f} ms):")
        for page in pages() if mode != "cold, raw" else pages()[:6]:
            page.name = f"{mode}: {page.name}"
            measure_page(page, made[page.audience], args.requests, lambda html: "")
            print_page(page)
            measured.append(page)
    results["pages"] = [asdict(p) for p in measured]
    wrong = [p.name for p in measured if p.problems or p.seq_scans]
    print(
        f"\nover budget: {', '.join(p.name for p in measured if p.p95_ms >= BUDGET_MS) or 'none'}"
    )
    print(f"wrong or scanning: {', '.join(wrong) or 'none'}")
    print_load(machine)
    if args.json:
        write_results("dashboard_scale", stamp, results)
    if args.drop:
        drop_database(admin_url, args.database)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
