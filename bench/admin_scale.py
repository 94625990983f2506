"""The admin pages that list tenants or failures, at 10,000 tenants and 400,000 failures.

bench/history_scale.py measures the run list at 10 M runs; this measures what it leaves out,
quickly (no run rows): the operator's "Run a job" form, which offers the tenants, and the
failures list with its job filter, at the sizes of that history (400,490 tenant-visible
failures over 10,000 tenants). It reuses history_scale's pieces: the same tenants (``hs00001``
with a real schema and a staff user, the rest rows only), the same clients, the same
measurement of a page (p50/p95 over ``--requests`` requests through Django's test ``Client``
after a warm-up, then one more with its queries, ``EXPLAIN``, Seq Scans on kumiko's tables).

1. **build** (skipped with ``--reuse`` when the rows are there): the shared schema at the latest
   migration, ``--tenants`` tenant rows, ``--failures`` JobFailure rows in one
   ``INSERT ... SELECT`` over ``generate_series`` (tenants and 200 job names skewed as in
   history_scale: hs00001 ~1 %, the rarest job ~0.25 %; 90 days), then ``VACUUM ANALYZE``.
2. **pages**: the run-job form, the failures list (plain, by a rare job, by a tenant) for
   operators, the busy tenant's own failures list (plain, by job).

    python -m bench.admin_scale [--tenants 10000] [--failures 400000] [--requests 20]
                                [--reuse] [--drop] [--json]

Database ``kumiko_admin_scale`` (kept unless ``--drop``; ~100 MB), Redis database 8. A
benchmark, not a test: it asserts nothing about speed; it checks that each page answers 200
with the rows it should show, and that the form does not offer every tenant.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from typing import Any

from bench import common
from bench.history_scale import (
    BUDGET_MS,
    BUSY_TENANT,
    Page,
    clients,
    create_tenants_and_users,
    listed_only,
    measure_page,
    prepare_environment,
    print_page,
    rows,
    sql,
    step,
)
from bench.throughput import drop_database, machine_facts, print_load, write_results

BENCH_DATABASE = "kumiko_admin_scale"
BENCH_REDIS_DB = 8
FAILURES = "/admin/kumiko_jobs/jobfailure/"
RUN_JOB = "/admin/kumiko_jobs/jobrun/run-job/"
RARE_JOB = "app19.job_199"

# Tenants and jobs skewed as bench/history_scale.py's runs (power 2); one subject per row, so
# the unique (schema_name, job_name, subject) never conflicts.
INSERT_FAILURES = """
INSERT INTO kumiko_jobs_jobfailure (schema_name, job_name, subject, message_key, failed_at, run_id)
SELECT 'hs' || lpad((1 + floor(%(tenants)s * power(random(), 2))::int)::text, 5, '0'),
    'app' || lpad((j / 10)::text, 2, '0') || '.job_' || lpad(j::text, 3, '0'),
    'invoice_id=' || g, 'billing.sync_failed',
    %(start)s::timestamptz + (g::float8 / %(total)s) * interval '90 days', md5('run' || g)::uuid
FROM (SELECT g, floor(200 * power(random(), 2))::int AS j
      FROM generate_series(1, %(total)s) g) s
"""


def build(tenants: int, failures: int, now: datetime) -> dict[str, float]:
    timings: dict[str, float] = {}
    with step(f"{tenants:,} tenants, users, schema at the latest migration", timings):
        create_tenants_and_users(tenants, kumiko_target=None)
    sql("SET synchronous_commit = off")
    with step(f"insert {failures:,} failures", timings):
        sql("TRUNCATE kumiko_jobs_jobfailure")
        sql(
            INSERT_FAILURES,
            {"tenants": tenants, "total": failures, "start": now - timedelta(days=90)},
        )
    with step("vacuum analyze", timings):
        sql("VACUUM (ANALYZE) kumiko_jobs_jobfailure")
        sql("VACUUM (ANALYZE) customers_client")
    return timings


def only(**filters: Any) -> Callable[[str], str]:
    """Every failure listed (by its run's link) matches ``filters``."""
    from kumiko_jobs.models import JobFailure

    return listed_only(JobFailure, "run_id", **filters)


def form_offers_few_tenants(tenants: int) -> Callable[[str], str]:
    def check(html: str) -> str:
        offered = html.count('<option value="hs')
        if offered > 100:
            return f"the form offers {offered} tenants (of {tenants:,})"
        return "" if 'name="tenant"' in html else "no tenant field on the form"

    return check


def pages_to_measure(tenants: int) -> list[tuple[Page, Callable[[str], str]]]:
    middle = f"hs{tenants // 2:05d}"
    return [
        (
            Page(f"run-job form, {tenants:,} tenants", "operator", "", path=RUN_JOB),
            form_offers_few_tenants(tenants),
        ),
        (Page("failures list", "operator", "", path=FAILURES), rows(50)),
        (
            Page(f"failures: job = {RARE_JOB}", "operator", f"job={RARE_JOB}", path=FAILURES),
            only(job_name=RARE_JOB),
        ),
        (
            Page(f"failures: tenant = {middle}", "operator", f"tenant={middle}", path=FAILURES),
            only(schema_name=middle),
        ),
        (
            Page("tenant's failures list", "tenant", "", path=FAILURES),
            only(schema_name=BUSY_TENANT),
        ),
        (
            Page(f"tenant: job = {RARE_JOB}", "tenant", f"job={RARE_JOB}", path=FAILURES),
            only(schema_name=BUSY_TENANT, job_name=RARE_JOB),
        ),
    ]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = common.scale_parser(__doc__)
    parser.add_argument("--tenants", type=int, default=10_000)
    parser.add_argument("--failures", type=int, default=400_000)
    parser.add_argument("--requests", type=int, default=20)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    admin_url = prepare_environment(
        fresh=not args.reuse, database=BENCH_DATABASE, redis_db=BENCH_REDIS_DB
    )
    machine = machine_facts()
    from django.core.management import call_command
    from django.db import connection

    results: dict[str, Any] = {
        "tenants": args.tenants,
        "failures": args.failures,
        "machine": machine,
    }
    have = 0
    if sql("SELECT to_regclass('kumiko_jobs_jobfailure') IS NOT NULL")[0][0]:
        have = int(sql("SELECT count(*) FROM kumiko_jobs_jobfailure")[0][0])
    if args.reuse and have >= args.failures:
        print(f"reusing {BENCH_DATABASE}: {have:,} failures")
        # The code may have gained a migration since the build (an index): apply it.
        call_command("migrate_schemas", shared=True, interactive=False, verbosity=0)
    else:
        print(f"building {args.failures:,} failures for {args.tenants:,} tenants")
        results["build_seconds"] = build(args.tenants, args.failures, datetime.now(UTC))
    indexes = sql(
        "SELECT indexname FROM pg_indexes WHERE tablename = 'kumiko_jobs_jobfailure'"
        " ORDER BY indexname"
    )
    results["failure_indexes"] = [str(name) for (name,) in indexes]
    print(f"  indexes on the failures: {', '.join(results['failure_indexes'])}")
    print(f"\npages, {args.requests} requests each (budget p95 < {BUDGET_MS:.0f} ms):")
    made = clients()
    pages = []
    for page, check in pages_to_measure(args.tenants):
        measure_page(page, made[page.audience], args.requests, check)
        print_page(page)
        pages.append(page)
    results["pages"] = [asdict(p) for p in pages]
    wrong = [p.name for p in pages if p.problems or p.seq_scans or p.unbounded_counts]
    print(f"\nwrong, scanning or counting: {', '.join(wrong) or 'none'}")
    print_load(machine)
    if args.json:
        write_results("admin_scale", stamp, results)
    connection.close()
    if args.drop:
        drop_database(admin_url, BENCH_DATABASE)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
