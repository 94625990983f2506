"""Bulk enqueue's rate: ``job.enqueue_many()`` against plain django-rq's ``Queue.enqueue_many``.

    python -m bench.bulk_enqueue [--sizes 1000,10000,100000] [--rounds 3] [--profile]

For each size N, from this one process: ``billing.bench_write.enqueue_many([{"n": i}, ...],
tenant=...)`` inside ``transaction.atomic()`` (validation, the rows' INSERT, the commit and the
pipeline push on commit: everything a caller waits for), and plain django-rq's
``Queue.enqueue_many([Queue.prepare_data(plain_write, (schema, i)), ...])`` with the same
payloads (one pipeline, no rows: the ratio's baseline). Runs/s is N over the wall time of the
call, the median of ``--rounds``; the queue is emptied between rounds (the push is part of the
cost, a growing list is not). ``--profile`` adds a cProfile of one kumiko call of the largest
size (tottime, top 25).

Its own database (``kumiko_bench_bulk``) and Redis database 7 (flushed; tenants.py's,
dashboard_scale.py's and many_tenants.py's, never run at the same time: it stops if another
client uses it, before and after each size).

Also printed: this process's CPU time per run (``time.process_time``), which a loaded machine
inflates much less than the wall time: what the call costs the caller, PostgreSQL and Redis
excluded.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

from bench.throughput import (
    ROOT,
    clean_up,
    create_tenants,
    machine_facts,
    plain_queue,
    prepare_environment,
    reset,
)

BENCH_DATABASE = "kumiko_bench_bulk"
CPU: list[float] = []  # this process's CPU seconds of each kumiko call
PLAIN_CPU: list[float] = []
BENCH_REDIS_DB = 7  # tenants.py's and dashboard_scale.py's: never at the same time


def refuse_a_shared_redis_db() -> None:
    """Stop when another client is connected to the bench's Redis database: its workers would
    take (and its flushes drop) this bench's messages, and the count would be wrong."""
    from kumiko_jobs import transport

    redis = transport.connection_for("default")
    db = redis.connection_pool.connection_kwargs.get("db", 0)
    me = redis.client_id()
    others = [c for c in redis.client_list() if int(c["db"]) == db and int(c["id"]) != me]
    if others:
        raise SystemExit(
            f"{len(others)} other client(s) use Redis database {db} "
            f"({', '.join(c.get('cmd', '?') for c in others[:5])}); "
            "pick a free one with --redis-db."
        )


def kumiko_call(tenant: Any, size: int) -> float:
    from django.db import transaction

    from example_project.billing.jobs import bench_write

    items = [{"n": n} for n in range(size)]
    started, cpu = time.perf_counter(), time.process_time()
    with transaction.atomic():
        handles = bench_write.enqueue_many(items, tenant=tenant)
    seconds = time.perf_counter() - started
    CPU.append(time.process_time() - cpu)
    assert len(handles) == size
    return seconds


def plain_call(tenant: Any, size: int) -> float:
    from rq import Queue

    from bench.workloads import plain_write

    queue = plain_queue()
    started = time.perf_counter()
    cpu = time.process_time()
    jobs = queue.enqueue_many(
        [Queue.prepare_data(plain_write, (tenant.schema_name, n)) for n in range(size)]
    )
    seconds = time.perf_counter() - started
    PLAIN_CPU.append(time.process_time() - cpu)
    assert len(jobs) == size
    return seconds


def _check_pushed(size: int) -> None:
    from kumiko_jobs import transport
    from kumiko_jobs.models import JobRun

    queued = transport.queue_length("default")
    rows = JobRun.objects.count()
    if queued != size or rows != size:
        raise RuntimeError(f"expected {size} rows and messages, found {rows} and {queued}")


def measure(tenants: Sequence[Any], size: int, rounds: int) -> tuple[float, float]:
    kumiko, plain = [], []
    for r in range(rounds):
        reset(tenants)
        kumiko.append(kumiko_call(tenants[r % len(tenants)], size))
        _check_pushed(size)
        reset(tenants)
        plain.append(plain_call(tenants[r % len(tenants)], size))
    reset(tenants)
    return size / statistics.median(kumiko), size / statistics.median(plain)


def profile(tenants: Sequence[Any], size: int) -> str:
    reset(tenants)
    profiler = cProfile.Profile()
    profiler.enable()
    kumiko_call(tenants[0], size)
    profiler.disable()
    reset(tenants)
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(25)
    return text.getvalue()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.bulk_enqueue",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tenants", type=int, default=2)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--database", default=BENCH_DATABASE)
    parser.add_argument("--redis-db", type=int, default=BENCH_REDIS_DB)
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    sys.path.insert(0, str(ROOT))
    admin_url = prepare_environment(args.database, args.redis_db)
    refuse_a_shared_redis_db()
    machine = machine_facts()
    print(f"machine: {machine['cpus']} CPUs, load {machine['loadavg_at_start']} at start")
    try:
        tenants = create_tenants(args.tenants)
        measure(tenants, 200, 1)  # warm-up: connections, imports, caches
        for size in sizes:
            CPU.clear()
            PLAIN_CPU.clear()
            kumiko, plain = measure(tenants, size, args.rounds)
            refuse_a_shared_redis_db()
            cpu_us = 1e6 * statistics.median(CPU) / size
            plain_us = 1e6 * statistics.median(PLAIN_CPU) / size
            print(
                f"N={size:>7}: kumiko enqueue_many {kumiko:7.0f} runs/s ({cpu_us:5.1f} us CPU/run)"
                f"   plain django-rq enqueue_many {plain:7.0f} jobs/s ({plain_us:5.1f} us CPU/job)"
                f"   ratio {kumiko / plain:4.2f}  (load {os.getloadavg()[0]:.2f})",
                flush=True,
            )
        if args.profile:
            print(profile(tenants, max(sizes)))
    finally:
        clean_up(admin_url, args.database, keep_database=False)
    print(f"load average at end {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
