"""Latency you can quote: enqueue, pickup (commit to start), and bulk enqueue's rate.

    python -m bench.latency [--samples 500] [--pickups 300] [--bulk 20000] [--slots 1]
                            [--no-roles]

1. **enqueue**: ``job.enqueue()`` of ``billing.bench_write``, p50/p99 over ``--samples``:
   outside a transaction (the row's INSERT commits, then the push), and inside
   ``transaction.atomic()`` (the block, the commit and the push on commit: what a view under
   ``ATOMIC_REQUESTS`` pays); plain ``django_rq`` ``Queue.enqueue`` for comparison.
2. **pickup**: one ``manage.py rqworker default`` process (``--slots`` slots) idles; after
   ``--warmup-pickups`` runs (not measured: the worker's first runs open its connections, and
   its first after the reset between the phases are slow again), runs are enqueued one at a
   time, 30 ms apart (idle), then at 70 % of the measured capacity (runs
   enqueued one by one as fast as this process can while the worker drains them: the
   capacity with the enqueuer on the same machine), at random (exponential) intervals.
   Pickup = the run's ``started_at`` (written by the
   worker as it starts the run) minus the moment ``enqueue()`` returned (its row committed and
   its message pushed). p50/p99.
3. **bulk**: ``job.enqueue_many()`` of ``--bulk`` runs in chunks of ``--chunk`` (each one
   COPY and one push, committed at once) from this one process: runs/s.

Delayed runs' lateness (``enqueue_in``, retries, deferrals: one path) is bench/lateness.py's.
Its own database (``kumiko_bench_latency``) and Redis database (5, flushed).
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

from bench.scale import roles_off
from bench.throughput import (
    ROOT,
    clean_up,
    create_tenants,
    machine_facts,
    plain_queue,
    prepare_environment,
    reset,
)

BENCH_DATABASE = "kumiko_bench_latency"
BENCH_REDIS_DB = 5


def pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _ms(values: Sequence[float]) -> str:
    return (
        f"p50 {1000 * pct(values, 0.5):6.2f} ms  p99 {1000 * pct(values, 0.99):7.2f} ms"
        f"  (n={len(values)}, load {os.getloadavg()[0]:.2f})"
    )


def enqueue_latencies(tenants: Sequence[Any], samples: int) -> dict[str, list[float]]:
    from django.db import transaction

    from bench.workloads import plain_write
    from example_project.billing.jobs import bench_write

    queue = plain_queue()
    out: dict[str, list[float]] = {"outside": [], "atomic": [], "plain": []}
    for n in range(samples + 50):
        tenant = tenants[n % len(tenants)]
        t0 = time.perf_counter()
        bench_write.enqueue(tenant=tenant, n=n)
        t1 = time.perf_counter()
        with transaction.atomic():
            bench_write.enqueue(tenant=tenant, n=n)
        t2 = time.perf_counter()
        queue.enqueue(plain_write, tenant.schema_name, n)
        t3 = time.perf_counter()
        if n >= 50:  # warm-up: connections, caches
            out["outside"].append(t1 - t0)
            out["atomic"].append(t2 - t1)
            out["plain"].append(t3 - t2)
    return out


def _worker(slots: int) -> subprocess.Popen[bytes]:
    env = dict(os.environ, KUMIKO_JOBS_WORKER_CONCURRENCY=str(slots))
    # manage.py would write every span to stdout as indented JSON (the example's default): its
    # export thread's bursts, every 5 s, held the GIL for 40-80 ms and were the 70 % phase's
    # p99. None, as in the other benches; OTEL_TRACES_EXPORTER=console measures it.
    env.setdefault("OTEL_TRACES_EXPORTER", "none")
    return subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), "rqworker", "default"],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _wait(check: Any, what: str, deadline: float = 300.0) -> None:
    end = time.monotonic() + deadline
    while not check():
        if time.monotonic() > end:
            raise RuntimeError(f"gave up waiting for {what}")
        time.sleep(0.05)


def _capacity(tenants: Sequence[Any], jobs: int) -> float:
    """Jobs/s the running worker drains while this process enqueues them one by one as fast as
    it can: the capacity with the enqueuer on the same machine, as during the 70 % run."""
    from example_project.billing.jobs import bench_write
    from kumiko_jobs.models import JobRun, RunStatus

    started = time.perf_counter()
    for n in range(jobs):
        bench_write.enqueue(tenant=tenants[n % len(tenants)], n=n)
    done = JobRun.objects.filter(status=RunStatus.SUCCEEDED)
    _wait(lambda: done.count() >= jobs, "the capacity drain")
    return jobs / (time.perf_counter() - started)


def pickups(
    tenants: Sequence[Any], count: int, interval: float, jitter: bool, quiet: bool = False
) -> list[float]:
    from example_project.billing.jobs import bench_write
    from kumiko_jobs.models import JobRun

    returned: dict[str, float] = {}
    next_at = time.monotonic()
    for n in range(count):
        handle = bench_write.enqueue(tenant=tenants[n % len(tenants)], n=n)
        returned[handle.run_id] = time.time()
        gap = random.expovariate(1 / interval) if jitter else interval
        next_at += gap
        time.sleep(max(0.0, next_at - time.monotonic()))
    runs = JobRun.objects.filter(pk__in=list(returned))
    _wait(lambda: runs.filter(started_at__isnull=True).count() == 0, "every pickup")
    started = dict(runs.values_list("run_id", "started_at"))
    # started_at is timezone-aware (USE_TZ): its timestamp() is the wall clock time.time() uses.
    waits = {returned[r.hex]: started[r].timestamp() - returned[r.hex] for r in started}
    # The tail's moments (epoch seconds), to line up with what the worker did then.
    slowest = sorted(waits.items(), key=lambda item: -item[1])[: max(3, count // 100)]
    if not quiet:
        print(
            "  slowest pickups (enqueued at, ms): "
            + ", ".join(f"{at:.2f} {1000 * wait:.0f}" for at, wait in sorted(slowest)),
            flush=True,
        )
    return list(waits.values())


def bulk_rate(tenants: Sequence[Any], total: int, chunk: int) -> float:
    from example_project.billing.jobs import bench_write

    started = time.perf_counter()
    for start in range(0, total, chunk):
        tenant = tenants[(start // chunk) % len(tenants)]
        bench_write.enqueue_many([{"n": n} for n in range(start, start + chunk)], tenant=tenant)
    return total / (time.perf_counter() - started)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.latency",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--samples", type=int, default=500)
    parser.add_argument("--pickups", type=int, default=300)
    parser.add_argument("--capacity-jobs", type=int, default=1000)
    parser.add_argument("--bulk", type=int, default=20000)
    parser.add_argument("--chunk", type=int, default=1000)
    parser.add_argument("--slots", type=int, default=1)
    parser.add_argument("--warmup-pickups", type=int, default=20, help="not measured (20)")
    parser.add_argument("--tenants", type=int, default=4)
    parser.add_argument("--database", default=BENCH_DATABASE)
    parser.add_argument("--redis-db", type=int, default=BENCH_REDIS_DB)
    parser.add_argument(
        "--no-roles", action="store_true", help="DB_ROLES off, here and in the workers"
    )
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    admin_url = prepare_environment(args.database, args.redis_db)
    roles_off(args.no_roles)
    machine = machine_facts()
    print(f"machine: {machine['cpus']} CPUs, load {machine['loadavg_at_start']} at start")
    print(f"DB_ROLES {'off' if args.no_roles else 'on'}", flush=True)
    try:
        tenants = create_tenants(args.tenants)
        reset(tenants)
        rates = bulk_rate(tenants, args.bulk, args.chunk)
        print(
            f"bulk enqueue_many ({args.chunk} a call): {rates:9.0f} runs/s from one process"
            f"  (load {os.getloadavg()[0]:.2f})",
            flush=True,
        )
        reset(tenants)
        lat = enqueue_latencies(tenants, args.samples)
        print(f"enqueue() outside a transaction:  {_ms(lat['outside'])}")
        print(f"enqueue() inside atomic():         {_ms(lat['atomic'])}")
        print(f"plain django-rq Queue.enqueue():   {_ms(lat['plain'])}", flush=True)
        reset(tenants)
        worker = _worker(args.slots)
        try:
            from rq import Worker

            from kumiko_jobs import transport

            redis = transport.connection_for("default")
            _wait(lambda: Worker.count(connection=redis) >= args.slots, "the worker")
            # The worker's first runs open its connections and fill its caches (120 ms each
            # here): a cold start, not a pickup, and 1 % of 300 samples is 3 of them.
            pickups(tenants, args.warmup_pickups, 0.03, jitter=False, quiet=True)
            idle = pickups(tenants, args.pickups, 0.03, jitter=False)
            print(f"pickup, idle worker ({args.slots} slot(s)): {_ms(idle)}", flush=True)
            reset(tenants)
            capacity = _capacity(tenants, args.capacity_jobs)
            reset(tenants)
            # After the reset (TRUNCATE, FLUSHDB) the worker's first runs are a cold start
            # again (120-140 ms, a burst of them): not measured either.
            pickups(tenants, args.warmup_pickups, 1 / (0.7 * capacity), jitter=True, quiet=True)
            busy = pickups(tenants, args.pickups, 1 / (0.7 * capacity), jitter=True)
            print(
                f"pickup at 70 % load ({0.7 * capacity:.0f} runs/s of {capacity:.0f}): {_ms(busy)}",
                flush=True,
            )
        finally:
            worker.send_signal(signal.SIGTERM)
            worker.wait(60)
    finally:
        clean_up(admin_url, args.database, keep_database=False)
    print(f"load average at end {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
