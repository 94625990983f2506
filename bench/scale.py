"""Aggregate throughput per machine: worker processes x slots, kumiko against plain django-rq.

    python -m bench.scale [--procs 1,2,4] [--slots 1,4,16] [--jobs 2000] [--io-jobs 400]
                          [--no-roles]

For each workload, ``--procs`` worker processes (``manage.py rqworker default``, as a user
starts them) run ``--slots`` slots each (``KUMIKO_JOBS_WORKER_CONCURRENCY``), and plain RQ
(``rqworker --worker-class rq.worker.SimpleWorker``, one job at a time per process) runs with
the same number of processes, and with processes x slots processes (what a user of plain RQ
starts instead of slots: RQ's ``worker-pool`` is that many forked workers). The workloads:

* ``trivial``: one tenant write (``billing.bench_write`` / ``workloads.plain_write``);
* ``io``: waits 50 ms with the GIL released (``soak.sleeper`` with ``seconds=0.05``, a
  ``time.sleep`` as in a socket read; ``workloads.plain_sleep_write``), then the same write.

The workers start first and idle; then the jobs are pushed (kumiko: ``job.enqueue_many`` per
tenant, which commits and pushes at once; plain: ``Queue.enqueue_many``) and the clock runs
until every job's write is in its tenant's table. Printed: jobs/s, worker CPU per job (user +
system of the worker processes, from /proc), PostgreSQL's CPU per job (the backends connected
to the bench's database, this process's polling included), the Redis server's CPU per job
(``INFO cpu``: the whole server's, so a figure of the bench only on a quiet machine), the ratio
to plain RQ with the same processes, and scaling efficiency (jobs/s over the one-slot,
one-process figure times processes x slots). Runnable unchanged on a bigger machine; the
machine's load is printed with every figure. Its own database (``kumiko_bench_scale``) and
Redis database (3, flushed).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bench.throughput import (
    ROOT,
    clean_up,
    create_tenants,
    machine_facts,
    prepare_environment,
    redis_cpu_seconds,
    reset,
    written_rows,
)

BENCH_DATABASE = "kumiko_bench_scale"
BENCH_REDIS_DB = 3
IO_SECONDS = 0.05
JSON = "rq.serializers.JSONSerializer"
_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Figure:
    side: str  # "kumiko" or "plain"
    workload: str
    procs: int
    slots: int
    jobs: int
    seconds: float
    cpu: float
    load: float
    db_cpu: float = 0.0  # the bench database's PostgreSQL backends (pg_stat_activity)
    redis_cpu: float = 0.0  # the Redis server, all its clients' (INFO cpu)

    @property
    def rate(self) -> float:
        return self.jobs / self.seconds


def roles_off(off: bool) -> None:
    """``--no-roles``: ``DB_ROLES`` off in this process and in the workers it starts (they read
    bench/settings_db_roles.py), as bench/tenants.py's ``--no-roles``; else the example
    project's settings (``DB_ROLES`` on) everywhere."""
    if not off:
        return
    from django.conf import settings
    from django.test import override_settings

    os.environ["KUMIKO_BENCH_DB_ROLES"] = "0"
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings_db_roles"
    override_settings(KUMIKO_JOBS={**settings.KUMIKO_JOBS, "DB_ROLES": False}).enable()


def _cpu(pids: Sequence[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / _TICKS
    return total


def _backend_cpu() -> dict[int, float]:
    """CPU seconds of each PostgreSQL backend connected to the bench's database now (the
    workers' and this process's; PostgreSQL's share of a job, which the worker's CPU leaves
    out). Backends that ended meanwhile are missed."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database()")
        pids = [row[0] for row in cursor.fetchall()]
    return {pid: _cpu([pid]) for pid in pids}


def _start(kumiko: bool, procs: int, slots: int) -> list[subprocess.Popen[bytes]]:
    env = dict(os.environ)
    env["KUMIKO_JOBS_WORKER_CONCURRENCY"] = str(slots if kumiko else 1)
    # manage.py would write every span to stdout as indented JSON (the example's default), a
    # cost only kumiko's workers pay (plain RQ's make no spans): none, as in throughput.py
    # (no tracing SDK) and fairness.py; OTEL_TRACES_EXPORTER=console measures it.
    env.setdefault("OTEL_TRACES_EXPORTER", "none")
    # Plain RQ reads with the queue's JSON serializer (as kumiko's worker forces it).
    plain = ["--worker-class", "rq.worker.SimpleWorker", "--serializer", JSON]
    extra = [] if kumiko else plain
    return [
        subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), "rqworker", "default", *extra],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(procs)
    ]


def _wait_registered(count: int, deadline: float = 120.0) -> None:
    from rq import Worker

    from kumiko_jobs import transport

    redis = transport.connection_for("default")
    end = time.monotonic() + deadline
    while Worker.count(connection=redis) < count:
        if time.monotonic() > end:
            raise RuntimeError(f"only {Worker.count(connection=redis)} of {count} workers came up")
        time.sleep(0.2)


def _stop(workers: Sequence[subprocess.Popen[bytes]]) -> None:
    for proc in workers:
        proc.send_signal(signal.SIGTERM)
    for proc in workers:
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _push(kumiko: bool, workload: str, tenants: Sequence[Any], jobs: int) -> None:
    from django.conf import settings
    from rq import Queue

    from bench import soak
    from example_project.billing.jobs import bench_write
    from kumiko_jobs import transport

    per = [list(range(i, jobs, len(tenants))) for i in range(len(tenants))]
    if kumiko:
        for tenant, ns in zip(tenants, per, strict=True):
            if workload == "trivial":
                bench_write.enqueue_many([{"n": n} for n in ns], tenant=tenant)
            else:
                soak.job("soak.sleeper").enqueue_many(
                    [{"tag": f"s{n}", "seconds": IO_SECONDS} for n in ns], tenant=tenant
                )
        return
    queue = transport.get_queue("default")
    ttl = settings.KUMIKO_JOBS.get("RESULT_TTL", 60) if hasattr(settings, "KUMIKO_JOBS") else 60
    datas = []
    for tenant, ns in zip(tenants, per, strict=True):
        for n in ns:
            if workload == "trivial":
                datas.append(
                    Queue.prepare_data(
                        "bench.workloads.plain_write", args=(tenant.schema_name, n), result_ttl=ttl
                    )
                )
            else:
                datas.append(
                    Queue.prepare_data(
                        "bench.workloads.plain_sleep_write",
                        args=(tenant.schema_name, f"s{n}", IO_SECONDS),
                        result_ttl=ttl,
                    )
                )
    for start in range(0, len(datas), 500):
        queue.enqueue_many(datas[start : start + 500])


def measure(
    kumiko: bool, workload: str, procs: int, slots: int, tenants: Sequence[Any], jobs: int
) -> Figure:
    reset(tenants)
    workers = _start(kumiko, procs, slots)
    try:
        _wait_registered(procs * (slots if kumiko else 1))
        pids = [w.pid for w in workers]
        from kumiko_jobs import transport

        redis = transport.connection_for("default")
        cpu_before, db_before = _cpu(pids), _backend_cpu()
        redis_before = redis_cpu_seconds(redis)
        started = time.perf_counter()
        _push(kumiko, workload, tenants, jobs)
        deadline = time.monotonic() + 600
        while written_rows(tenants) < jobs:
            if time.monotonic() > deadline or any(w.poll() is not None for w in workers):
                raise RuntimeError(f"{written_rows(tenants)} of {jobs} jobs done; gave up")
            time.sleep(0.05)
        seconds = time.perf_counter() - started
        cpu = _cpu(pids) - cpu_before
        db_cpu = sum(c - db_before.get(pid, 0.0) for pid, c in _backend_cpu().items())
        redis_cpu = redis_cpu_seconds(redis) - redis_before
    finally:
        _stop(workers)
    side = "kumiko" if kumiko else "plain"
    load = os.getloadavg()[0]
    return Figure(side, workload, procs, slots, jobs, seconds, cpu, load, db_cpu, redis_cpu)


def _line(f: Figure, base: Figure | None, plain: Figure | None) -> str:
    eff = ""
    if base is not None:
        eff = f"  efficiency {f.rate / (base.rate * f.procs * f.slots):4.2f}"
    ratio = f"  vs plain same procs {f.rate / plain.rate:5.2f}" if plain is not None else ""
    return (
        f"  {f.side:<6} {f.workload:<7} procs {f.procs} slots {f.slots:>2}: "
        f"{f.rate:8.1f} jobs/s  {1000 * f.cpu / f.jobs:6.2f} ms CPU/job"
        f" (PostgreSQL {1000 * f.db_cpu / f.jobs:5.2f}, Redis {1000 * f.redis_cpu / f.jobs:4.2f})"
        f"{ratio}{eff}"
        f"  (load {f.load:.2f})"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.scale",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--procs", default="1,2,4", help="worker processes (1,2,4)")
    parser.add_argument("--slots", default="1,4,16", help="slots per kumiko process (1,4,16)")
    parser.add_argument("--jobs", type=int, default=2000, help="trivial jobs per figure (2000)")
    parser.add_argument("--io-jobs", type=int, default=400, help="50 ms jobs per figure (400)")
    parser.add_argument("--workloads", default="trivial,io")
    parser.add_argument("--tenants", type=int, default=4)
    parser.add_argument("--database", default=BENCH_DATABASE)
    parser.add_argument("--redis-db", type=int, default=BENCH_REDIS_DB)
    parser.add_argument(
        "--no-roles", action="store_true", help="DB_ROLES off, here and in the workers"
    )
    args = parser.parse_args(argv)
    procs_list = [int(p) for p in args.procs.split(",")]
    slots_list = [int(s) for s in args.slots.split(",")]
    sys.path.insert(0, str(ROOT))
    admin_url = prepare_environment(args.database, args.redis_db)
    roles_off(args.no_roles)
    machine = machine_facts()
    print(f"machine: {machine['cpus']} CPUs, load {machine['loadavg_at_start']} at start")
    print(f"DB_ROLES {'off' if args.no_roles else 'on'}", flush=True)
    try:
        tenants = create_tenants(args.tenants)
        for workload in args.workloads.split(","):
            jobs = args.jobs if workload == "trivial" else args.io_jobs
            base: Figure | None = None
            for procs in procs_list:
                plain = measure(False, workload, procs, 1, tenants, jobs)
                print(_line(plain, None, None), flush=True)
                for slots in slots_list:
                    fig = measure(True, workload, procs, slots, tenants, jobs)
                    if procs == procs_list[0] and slots == slots_list[0]:
                        base = fig
                    print(_line(fig, base, plain), flush=True)
                if workload == "io" and max(slots_list) > 1:
                    pooled = measure(False, workload, procs * max(slots_list), 1, tenants, jobs)
                    print(
                        f"{_line(pooled, None, None)}  <- plain RQ with procs x "
                        f"{max(slots_list)} processes (a worker-pool's size)",
                        flush=True,
                    )
    finally:
        clean_up(admin_url, args.database, keep_database=False)
    print(f"load average at end {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
