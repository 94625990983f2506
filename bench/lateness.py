"""How late delayed runs start: ``enqueue_in`` through a real scheduler and a real worker.

Starts ``manage.py rqscheduler --interval 1`` and one ``manage.py rqworker default`` (kumiko's
``Worker``) as separate processes, on a database and Redis database of the bench's own, then
enqueues ``--runs`` runs of ``billing.bench_write`` per delay (50 ms, 300 ms, 1 s, 1.5 s by
default) with ``enqueue_in``, one every 50-150 ms (random, so that due times fall anywhere in
a second). For each run, the lateness is its start (``JobAttempt.started_at``, written by the
worker before the body runs) minus its due time (the moment ``enqueue_in`` was called plus the
delay). Retries and deferrals take the same path (a delayed push to rq-scheduler's set, moved
by the same scheduler), so their lateness is the same.

    python -m bench.lateness [--runs 50] [--delays 0.05,0.3,1,1.5] [--poll SECONDS] [--json]

``--poll`` sets ``SCHEDULER_POLL`` for the scheduler (0: rounds every --interval only). A
negative lateness is a run that started early, which must not happen: the output counts them.
A benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.throughput import (
    QUEUE,
    ROOT,
    clean_up,
    create_tenants,
    machine_facts,
    prepare_environment,
    print_load,
    write_results,
)

BENCH_DATABASE = "kumiko_bench_lateness"
# Its own Redis database, which it flushes: bench/outbox.py's too (do not run them together);
# bench/throughput.py and the others use 2-8, the demo 1, test sessions 9-15.
BENCH_REDIS_DB = 5


def start(command: list[str], log: Path, poll: float | None) -> subprocess.Popen[bytes]:
    env = dict(os.environ)  # prepare_environment() pointed these at the bench's services
    env["PYTHONPATH"] = str(ROOT)
    env["DJANGO_SETTINGS_MODULE"] = "bench.settings_lateness"
    env.setdefault("OTEL_TRACES_EXPORTER", "none")
    if poll is not None:
        env["KUMIKO_BENCH_SCHEDULER_POLL"] = str(poll)
    with log.open("w") as out:
        return subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), *command],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def wait_for(condition: Any, what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"gave up after {timeout:.0f} s waiting for {what}")
        time.sleep(0.1)


def succeeded() -> int:
    from kumiko_jobs.models import JobRun, RunStatus

    return JobRun.objects.filter(status=RunStatus.SUCCEEDED).count()


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))
    return ordered[index]


def measure(tenants: list[Any], delays: list[float], runs: int) -> dict[str, Any]:
    from example_project.billing.jobs import bench_write
    from kumiko_jobs.models import JobAttempt

    bench_write.enqueue(tenant=tenants[0], n=-1)  # warm-up: the worker is up and connected
    wait_for(lambda: succeeded() >= 1, "the warm-up run", 60)
    due: dict[str, tuple[float, float]] = {}
    order = [d for _ in range(runs) for d in delays]
    random.shuffle(order)
    for n, delay in enumerate(order):
        called = time.time()
        handle = bench_write.enqueue_in(delay, tenant=tenants[n % len(tenants)], n=n)
        due[str(handle.run_id).replace("-", "")] = (delay, called + delay)
        time.sleep(random.uniform(0.05, 0.15))
    wait_for(lambda: succeeded() >= len(order) + 1, "every delayed run", 120)
    late: dict[float, list[float]] = {d: [] for d in delays}
    for run_id, started in JobAttempt.objects.values_list("run_id", "started_at"):
        if run_id.hex in due:
            delay, due_at = due[run_id.hex]
            late[delay].append(started.timestamp() - due_at)
    out = {}
    for delay, values in late.items():
        out[f"{delay:g}"] = {
            "runs": len(values),
            "early": sum(v < 0 for v in values),
            "min_ms": round(min(values) * 1000, 1),
            "p50_ms": round(statistics.median(values) * 1000, 1),
            "p99_ms": round(percentile(values, 99) * 1000, 1),
            "max_ms": round(max(values) * 1000, 1),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50, help="runs per delay")
    parser.add_argument("--delays", default="0.05,0.3,1,1.5", help="seconds, comma-separated")
    parser.add_argument("--poll", type=float, default=None, help="SCHEDULER_POLL for the scheduler")
    parser.add_argument("--tenants", type=int, default=2)
    parser.add_argument("--database", default=BENCH_DATABASE)
    parser.add_argument("--redis-db", type=int, default=BENCH_REDIS_DB)
    parser.add_argument("--keep-database", action="store_true")
    parser.add_argument("--json", action="store_true", help="also write bench/results/*.json")
    args = parser.parse_args()
    delays = [float(d) for d in args.delays.split(",")]
    admin_url = prepare_environment(args.database, args.redis_db)
    machine = machine_facts()
    log_dir = ROOT / "bench" / "results"
    log_dir.mkdir(exist_ok=True)
    procs = []
    try:
        from kumiko_jobs import transport

        tenants = create_tenants(args.tenants)
        transport.connection_for(QUEUE).flushdb()
        procs.append(
            start(["rqscheduler", "--interval", "1"], log_dir / "lateness-scheduler.log", args.poll)
        )
        procs.append(
            start(["rqworker", "-v", "0", QUEUE], log_dir / "lateness-worker.log", args.poll)
        )
        result = measure(tenants, delays, args.runs)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        clean_up(admin_url, args.database, keep_database=args.keep_database)
    poll = "default" if args.poll is None else f"{args.poll:g} s"
    print(f"lateness of enqueue_in runs (start minus due time), SCHEDULER_POLL {poll}:")
    print(f"  {'delay':>7} {'runs':>5} {'early':>5} {'min':>8} {'p50':>8} {'p99':>8} {'max':>8}")
    for delay, row in result.items():
        print(
            f"  {delay + ' s':>7} {row['runs']:>5} {row['early']:>5} {row['min_ms']:>6} ms"
            f" {row['p50_ms']:>6} ms {row['p99_ms']:>6} ms {row['max_ms']:>6} ms"
        )
    print_load(machine)
    if args.json:
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        write_results("lateness", stamp, {"machine": machine, "poll": poll, "result": result})


if __name__ == "__main__":
    main()
