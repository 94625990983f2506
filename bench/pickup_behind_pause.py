"""Pickup behind work a worker may not take: how long an idle worker takes to start another
tenant's run while a paused tenant's runs wait in the same queue (and, ``--queues 2``, when the
worker serves two queues).

One ``manage.py rqworker`` process (``--queues 2``: ``rqworker default low``), the bench's own
database and Redis database. Tenant A is paused with ``--paused`` runs queued, so RQ's list
holds their tokens and the worker cannot block on it; then tenant B enqueues ``--runs`` runs,
one at a time, each once the previous one has finished and the worker is idle again, after a
random pause of 0.1-0.6 s (so arrivals fall anywhere in the worker's waiting). Pickup is the
run's ``JobRun.started_at`` minus the end of its ``enqueue()`` call (the push is done then):
p50, p95, max. Before the doorbell (transport/doorbell.py) an idle worker here looked again
once a second, so pickups spread over 0-1 s.

    python -m bench.pickup_behind_pause [--runs 40] [--paused 5] [--queues 1|2] [--json]

Database ``kumiko_bench_pickup``, Redis database 6. A benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import common
from bench.fairness import Workers, percentile, wait_for
from bench.throughput import (
    create_tenants,
    print_load,
    reset,
    write_results,
)

BENCH_DATABASE = "kumiko_bench_pickup"
BENCH_REDIS_DB = 6


def measure(args: argparse.Namespace, tenants: Sequence[Any], log: Path) -> list[float]:
    from django.core.management import call_command

    from example_project.billing.jobs import bench_write
    from kumiko_jobs.models import JobRun, RunStatus

    reset(tenants)
    paused, other = tenants[0], tenants[1]
    call_command("kumiko_jobs", "pause", "--tenant", paused.schema_name, verbosity=0)
    for n in range(args.paused):
        bench_write.enqueue(tenant=paused, n=n)
    queues = ["default", "low"][: args.queues]
    workers = Workers(1, log, "pickup", queues=queues)
    pickups = []
    try:
        warm = bench_write.enqueue(tenant=other, n=-1)  # the worker is up once this ran
        wait_for(lambda: _done(warm.run_id), "the warm-up run", workers, args.timeout)
        for n in range(args.runs):
            time.sleep(random.uniform(0.1, 0.6))
            handle = bench_write.enqueue(tenant=other, n=n)
            pushed = datetime.now(UTC)
            wait_for(lambda h=handle: _done(h.run_id), f"run {n}", workers, args.timeout)
            started = JobRun.objects.get(run_id=handle.run_id).started_at
            pickups.append((started - pushed).total_seconds())
        waiting = JobRun.objects.filter(schema_name=paused.schema_name, status=RunStatus.QUEUED)
        assert waiting.count() == args.paused, "the paused tenant's runs must still wait"
    finally:
        workers.stop()
        call_command("kumiko_jobs", "resume", "--tenant", paused.schema_name, verbosity=0)
    return pickups


def _done(run_id: Any) -> bool:
    from kumiko_jobs.models import JobRun, RunStatus

    return JobRun.objects.filter(run_id=run_id, status=RunStatus.SUCCEEDED).exists()


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = common.parser(
        "python -m bench.pickup_behind_pause",
        __doc__,
        database=BENCH_DATABASE,
        redis_db=BENCH_REDIS_DB,
    )
    parser.add_argument("--runs", type=int, default=40, help="B's runs, one at a time (40)")
    parser.add_argument("--paused", type=int, default=5, help="A's paused runs (5)")
    parser.add_argument("--queues", type=int, choices=(1, 2), default=1)
    parser.add_argument("--timeout", type=float, default=120)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    with common.session(args, "kumiko-pickup-") as run:
        log, machine = run.log_dir, run.machine
        tenants = create_tenants(2)
        pickups = measure(args, tenants, log)
        ms = sorted(p * 1000 for p in pickups)
        summary = {
            "runs": len(ms),
            "queues": args.queues,
            "p50_ms": round(percentile(ms, 50), 1),
            "p95_ms": round(percentile(ms, 95), 1),
            "max_ms": round(ms[-1], 1),
        }
        print(
            f"pickup behind a paused tenant ({args.queues} queue(s), {len(ms)} runs): "
            f"p50 {summary['p50_ms']} ms, p95 {summary['p95_ms']} ms, max {summary['max_ms']} ms"
        )
        print_load(machine)
        print(f"  worker log: {log}")
        if args.json:
            write_results("pickup_behind_pause", run.stamp, {"machine": machine, **summary})
    return 0


if __name__ == "__main__":
    sys.exit(main())
