"""A bulk retry's cost: listing the runs, then the batches that retry them.

Plants ``--runs`` failed runs of ``billing.record_activity`` over four tenants (history rows as
the runner leaves them), starts a bulk retry of all of them as the admin's confirmation does
(``bulk.start``: the operation row, its run list in one ``INSERT ... SELECT``, the first batch
enqueued), then runs its batches in this process (``bulk.run_batch``, the body of the system
job ``kumiko_jobs.bulk_batch``) until the list is through, timing each and counting its SQL
statements. The retried runs' messages are pushed to Redis (and dropped at the end): their
execution is any run's cost, measured by bench/throughput.py.

    python -m bench.bulk_operation [--runs 10000] [--json]

Database ``kumiko_bulk_bench``, Redis database 1. A benchmark, not a test: it asserts only that
every run was retried once.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from bench.throughput import (
    clean_up,
    create_tenants,
    machine_facts,
    prepare_environment,
    print_load,
    write_results,
)

DATABASE = "kumiko_bulk_bench"
REDIS_DB = 1
JOB = "billing.record_activity"


def plant(count: int, schemas: Sequence[str]) -> None:
    from django.utils import timezone

    from kumiko_jobs.models import JobRun, RunStatus

    when = timezone.now() - timedelta(minutes=10)
    for start in range(0, count, 5000):
        JobRun.objects.bulk_create(
            JobRun(
                run_id=uuid.uuid4(),
                job_name=JOB,
                schema_name=schemas[n % len(schemas)],
                status=RunStatus.FAILED,
                queue="default",
                attempts=1,
                payload={"message": f"bulk {n}"},
                queued_at=when - timedelta(milliseconds=n),
                started_at=when,
                finished_at=when,
                error_type="RuntimeError",
            )
            for n in range(start, min(count, start + 5000))
        )


def measure(count: int) -> dict[str, Any]:
    from django.db import connection
    from django.utils import timezone

    from kumiko_jobs import bulk
    from kumiko_jobs.models import BulkKind, JobRun, RunStatus

    failed = JobRun.objects.filter(status=RunStatus.FAILED, job_name=JOB)
    began = time.perf_counter()
    operation = bulk.start(
        BulkKind.RETRY, failed, query="", confirmed=count, as_of=timezone.now(), by="bench"
    )
    listed_s = time.perf_counter() - began
    batches: list[float] = []
    statements: list[int] = []
    counted = [0]

    def tally(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        counted[0] += 1
        return execute(sql, params, many, context)

    more = True
    while more:
        counted[0] = 0
        with connection.execute_wrapper(tally):
            began = time.perf_counter()
            more = bulk.run_batch(str(operation.pk))
            batches.append(time.perf_counter() - began)
        statements.append(counted[0])
    operation.refresh_from_db()
    retried = JobRun.objects.filter(trigger__startswith="retry:").count()
    assert operation.done == count == retried, (operation.done, count, retried)
    total = sum(batches)
    return {
        "runs": count,
        "batch_size": bulk.BATCH_SIZE,
        "list_seconds": round(listed_s, 3),
        "batches": len(batches),
        "batch_seconds_p50": round(statistics.median(batches), 3),
        "batch_seconds_max": round(max(batches), 3),
        "retried_per_second": round(count / total, 1),
        "sql_per_run": round(sum(statements) / count, 2),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    admin_url = prepare_environment(DATABASE, REDIS_DB)
    machine = machine_facts()
    try:
        tenants = create_tenants(4)
        plant(args.runs, [t.schema_name for t in tenants])
        result = measure(args.runs)
    finally:
        clean_up(admin_url, DATABASE, keep_database=False)
    print(
        f"bulk retry of {result['runs']:,} runs: list {result['list_seconds']} s; "
        f"{result['batches']} batches of {result['batch_size']}, p50 "
        f"{result['batch_seconds_p50']} s, max {result['batch_seconds_max']} s; "
        f"{result['retried_per_second']} runs retried/s; {result['sql_per_run']} SQL "
        f"statements per run"
    )
    print_load(machine)
    if args.json:
        write_results("bulk_operation", stamp, {"machine": machine, **result})
    return 0


if __name__ == "__main__":
    sys.exit(main())
