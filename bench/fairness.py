"""Fairness: how long do small tenants wait behind one tenant's backlog? Plain FIFO
(``FAIRNESS="fifo"``), FIFO with ``TENANT_CONCURRENCY = 1``, and the fair dequeue (the
defaults: ``FAIRNESS="tenant"``). Shares of worker time are ``bench/fairness_shares.py``'s.

One run measures both modes on the same machine, services and data. In each mode:

1. two workers start as their own processes (``manage.py rqworker default``, kumiko's default
   worker class) and run a warm-up (``--warmup`` jobs per tenant);
2. both are then held on a ``billing.bench_hold`` run each (a system job that blocks on a Redis
   list), so they are warm and busy while tenant A enqueues its backlog of ``--jobs`` short
   jobs (``billing.bench_write``: one INSERT) with ``job.enqueue(tenant=A)``;
3. the workers are released, and at once tenants B..F enqueue ``--per-tenant`` jobs each
   (interleaved: B, C, D, E, F, B, ...);
4. when every run has finished, the wait of each B..F run is read from its history row:
   ``JobRun.queued_at`` (the enqueue) to ``started_at`` (a worker began it).

With plain FIFO, B..F's jobs sit behind A's whole backlog. With ``TENANT_CONCURRENCY=1`` every
message carries RQ's ``RateLimit("kumiko:tenant:<schema>", 1)``: only one A message is on the
queue (or running) at a time and A's others wait in RQ's rate-limited set for A, outside the
queue; so B..F's first jobs land right behind that one A message, and each tenant's next job is
pushed to the queue's tail when its previous one finishes (round robin between tenants). The
price is that A alone never gets more than one worker. The setting acts where messages are
enqueued (this process); the workers release RQ's slots whatever their own settings say.

    python -m bench.fairness [--jobs 5000] [--per-tenant 20] [--workers 2] [--json]

Everything happens in a database of its own (created, then dropped) and Redis database 4
(flushed). A benchmark, not a test: it asserts nothing about speed. It does check that every
run succeeded and every job wrote its row.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import common
from bench.throughput import (
    QUEUE,
    ROOT,
    create_tenants,
    print_load,
    reset,
    write_results,
    written_rows,
)

BENCH_DATABASE = "kumiko_bench_fairness"
BENCH_REDIS_DB = 4
LABELS = "ABCDEF"  # A is the noisy tenant
WRITE_JOB = "billing.bench_write"
HOLD_KEY = "kumiko_bench:fairness:release"
# (key, label, TENANT_CONCURRENCY, FAIRNESS)
MODES: tuple[tuple[str, str, int | None, str], ...] = (
    ("fifo", "plain FIFO", None, "fifo"),
    ("tenant_concurrency_1", "FIFO + TENANT_CONC=1", 1, "fifo"),
    ("fair", "fair (defaults)", None, "tenant"),
)


# --------------------------------------------------------------------------- workers


class Workers:
    """``manage.py rqworker default`` processes on the bench's database and Redis database
    (started through ``bench.soak manage``, which applies ``settings`` to their KUMIKO_JOBS:
    ``FAIRNESS`` acts in the workers, where the dequeue is)."""

    def __init__(
        self,
        count: int,
        log_dir: Path,
        mode: str,
        settings: dict[str, Any] | None = None,
        queues: Sequence[str] = (QUEUE,),
    ) -> None:
        env = dict(os.environ)  # prepare_environment() pointed these at the bench's services
        env["PYTHONPATH"] = str(ROOT)
        env["KUMIKO_SOAK_SETTINGS"] = json.dumps(settings or {})
        # manage.py would dump every span to stdout (the example's default); the in-process
        # workers of bench/throughput.py have no tracing SDK either.
        env.setdefault("OTEL_TRACES_EXPORTER", "none")
        self.logs = [log_dir / f"{mode}-worker-{i}.log" for i in range(1, count + 1)]
        self.procs = []
        for path in self.logs:
            with path.open("w") as log:
                self.procs.append(
                    subprocess.Popen(
                        [
                            sys.executable,
                            "-m",
                            "bench.soak",
                            "manage",
                            "rqworker",
                            "-v",
                            "0",
                            *queues,
                        ],
                        cwd=ROOT,
                        env=env,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                    )
                )

    def alive(self) -> int:
        return sum(proc.poll() is None for proc in self.procs)

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()  # RQ's warm shutdown: the current job finishes
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def wait_for(condition: Any, what: str, workers: Workers, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if not workers.alive():
            raise RuntimeError(f"the workers exited while waiting for {what}: see {workers.logs}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"gave up after {timeout:.0f} s waiting for {what}")
        time.sleep(0.2)


def unfinished_runs() -> int:
    from kumiko_jobs.models import JobRun, RunStatus

    return JobRun.objects.filter(
        status__in=(RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.DEFERRED)
    ).count()


# --------------------------------------------------------------------------- measuring


def percentile(values: Sequence[float], pct: int) -> float:
    if len(values) < 2:
        return values[0] if values else float("nan")
    return statistics.quantiles(values, n=100, method="inclusive")[pct - 1]


@dataclass
class ModeResult:
    key: str
    label: str
    tenant_concurrency: int | None
    backlog: int
    per_tenant: int
    backlog_enqueue_seconds: float = 0.0
    small_waits: list[float] = field(default_factory=list)  # B..F, seconds, enqueue -> start
    small_done_seconds: float = 0.0  # release -> last B..F run finished
    all_done_seconds: float = 0.0  # release -> last run finished (A's backlog included)
    a_started_before_last_small: int = 0  # A runs begun before the last B..F run began
    ok: bool = True
    problem: str = ""

    @property
    def p50(self) -> float:
        return statistics.median(self.small_waits) if self.small_waits else float("nan")

    @property
    def p95(self) -> float:
        return percentile(self.small_waits, 95)


def measure_mode(
    key: str,
    label: str,
    limit: int | None,
    fairness: str,
    tenants: Sequence[Any],
    args: argparse.Namespace,
    log_dir: Path,
) -> ModeResult:
    from django.conf import settings
    from django.test import override_settings

    from example_project.billing.jobs import bench_hold, bench_write
    from kumiko_jobs import transport
    from kumiko_jobs.models import JobRun, RunStatus

    result = ModeResult(key, label, limit, args.jobs, args.per_tenant)
    noisy, small = tenants[0], tenants[1:]
    redis = transport.connection_for(QUEUE)
    kumiko = {
        **getattr(settings, "KUMIKO_JOBS", {}),
        "TENANT_CONCURRENCY": limit,
        "FAIRNESS": fairness,
    }
    reset(tenants)
    workers = Workers(args.workers, log_dir, key, {"FAIRNESS": fairness})
    try:
        with override_settings(KUMIKO_JOBS=kumiko):
            for n in range(args.warmup):
                for tenant in tenants:
                    bench_write.enqueue(tenant=tenant, n=-1 - n)
            wait_for(lambda: unfinished_runs() == 0, "the warm-up", workers, args.timeout)

            holds = [bench_hold.enqueue(key=HOLD_KEY) for _ in range(args.workers)]
            hold_ids = [h.run_id for h in holds]
            wait_for(
                lambda: (
                    JobRun.objects.filter(pk__in=hold_ids, status=RunStatus.RUNNING).count()
                    == len(hold_ids)
                ),
                "every worker to be held",
                workers,
                args.timeout,
            )
            started = time.perf_counter()
            for n in range(args.jobs):
                bench_write.enqueue(tenant=noisy, n=n)
            result.backlog_enqueue_seconds = time.perf_counter() - started

            released = datetime.now(UTC)
            redis.rpush(HOLD_KEY, *["go"] * args.workers)
            handles = [
                bench_write.enqueue(tenant=tenant, n=n)
                for n in range(args.per_tenant)
                for tenant in small
            ]
        wait_for(lambda: unfinished_runs() == 0, "every run to finish", workers, args.timeout)
    finally:
        redis.rpush(HOLD_KEY, *["go"] * args.workers)  # never leave a worker held
        workers.stop()

    problems = []
    held = JobRun.objects.filter(pk__in=hold_ids, status=RunStatus.SUCCEEDED).count()
    if held != len(hold_ids):
        problems.append(f"{len(hold_ids) - held} worker(s) were not held until the release")
    writes = JobRun.objects.filter(job_name=WRITE_JOB)
    expected = args.warmup * len(tenants) + args.jobs + args.per_tenant * len(small)
    if (n := writes.filter(status=RunStatus.SUCCEEDED).count()) != expected:
        problems.append(f"{n} of {expected} runs succeeded")
    if (n := written_rows(tenants)) != expected:
        problems.append(f"{n} of {expected} writes happened")
    timed: list[tuple[datetime, datetime, datetime]] = [
        (queued, started_at, finished)
        for queued, started_at, finished in JobRun.objects.filter(
            pk__in=[h.run_id for h in handles]
        ).values_list("queued_at", "started_at", "finished_at")
        if started_at is not None and finished is not None
    ]
    if len(timed) != len(handles):
        problems.append(f"{len(timed)} of {len(handles)} B..F runs have start and finish times")
    result.small_waits = sorted((s - q).total_seconds() for q, s, _ in timed)
    if timed:
        last_small_start = max(s for _, s, _ in timed)
        last_small_finish = max(f for _, _, f in timed)
        result.small_done_seconds = (last_small_finish - released).total_seconds()
        # The workers were held until `released`: every A run begun since is from the backlog.
        result.a_started_before_last_small = writes.filter(
            schema_name=noisy.schema_name,
            started_at__gte=released,
            started_at__lt=last_small_start,
        ).count()
    last = writes.order_by("-finished_at").values_list("finished_at", flat=True).first()
    if last:
        result.all_done_seconds = (last - released).total_seconds()
    result.ok, result.problem = not problems, "; ".join(problems)
    return result


# --------------------------------------------------------------------------- report


@dataclass
class Results:
    jobs: int
    per_tenant: int
    workers: int
    warmup: int
    started_at: str
    machine: dict[str, Any]
    modes: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)


def summarize(modes: Sequence[ModeResult]) -> dict[str, Any]:
    by_key = {m.key: m for m in modes}
    fifo, limited, fair = by_key["fifo"], by_key["tenant_concurrency_1"], by_key["fair"]
    return {
        "small_wait_p50_seconds": {m.key: m.p50 for m in modes},
        "small_wait_p95_seconds": {m.key: m.p95 for m in modes},
        "p50_fifo_over_limited": fifo.p50 / limited.p50,
        "p95_fifo_over_limited": fifo.p95 / limited.p95,
        "all_done_limited_over_fifo": limited.all_done_seconds / fifo.all_done_seconds,
        "all_done_fair_over_fifo": fair.all_done_seconds / fifo.all_done_seconds,
        "p95_fair": fair.p95,
        "all_ok": all(m.ok for m in modes),
    }


def print_report(results: Results, modes: Sequence[ModeResult]) -> None:
    s = results.summary
    small = len(LABELS) - 1
    print()
    print(
        f"{results.workers} workers (manage.py rqworker); tenant A's backlog of {results.jobs} "
        f"jobs, then {small} tenants B..F enqueue {results.per_tenant} jobs each"
    )
    print()
    print(
        f"  {'':<22}{'B..F wait p50':>15}{'p95':>11}{'max':>11}{'B..F done':>11}"
        f"{'all done':>10}{'A runs begun':>14}"
    )
    print(f"  {'':<22}{'':>15}{'':>11}{'':>11}{'':>11}{'':>10}{'before B..F':>14}")
    for m in modes:
        print(
            f"  {m.label:<22}{m.p50:>13.3f} s{m.p95:>9.3f} s{max(m.small_waits, default=0):>9.3f} s"
            f"{m.small_done_seconds:>9.1f} s{m.all_done_seconds:>8.1f} s"
            f"{m.a_started_before_last_small:>14}"
        )
    print()
    print(
        f"  FIFO / TENANT_CONCURRENCY=1: p50 {s['p50_fifo_over_limited']:.1f}x, "
        f"p95 {s['p95_fifo_over_limited']:.1f}x the wait"
    )
    print(
        f"  all runs done: TENANT_CONCURRENCY=1 / FIFO = {s['all_done_limited_over_fifo']:.2f} "
        "(with the limit A never has more than one worker; whether that costs time depends on "
        "how much a second worker adds on this machine)"
    )
    print(
        f"  fair: B..F p95 {s['p95_fair']:.3f} s; all runs done: fair / FIFO = "
        f"{s['all_done_fair_over_fifo']:.2f} (work-conserving: A keeps both workers)"
    )
    print(
        "  (wait: JobRun.queued_at -> started_at; 'done' counts from the workers' release; "
        "'A runs begun before B..F': A's backlog runs that started before the last B..F run did)"
    )
    for m in modes:
        print(f"  {m.label}: A's backlog enqueued at {m.backlog / m.backlog_enqueue_seconds:.0f}/s")
        if not m.ok:
            print(f"  WARNING ({m.label}): {m.problem} - the numbers above are not valid")
    print_load(results.machine)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = common.parser(
        "python -m bench.fairness", __doc__, database=BENCH_DATABASE, redis_db=BENCH_REDIS_DB
    )
    parser.add_argument("--jobs", type=int, default=5000, help="tenant A's backlog (5000)")
    parser.add_argument("--per-tenant", type=int, default=20, help="jobs of each of B..F (20)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes (2)")
    parser.add_argument(
        "--warmup", type=int, default=5, help="untimed jobs per tenant first, in each mode (5)"
    )
    parser.add_argument(
        "--timeout", type=float, default=1800, help="give a mode up after this many seconds"
    )
    parser.add_argument(
        "--only", default="", help="comma-separated modes to run (fifo,tenant_concurrency_1,fair)"
    )
    args = parser.parse_args(argv)
    if args.jobs < 1 or args.per_tenant < 1 or args.workers < 1 or args.warmup < 0:
        parser.error("--jobs, --per-tenant and --workers must be >= 1, --warmup >= 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    with common.session(args, "kumiko-fairness-") as run:
        log_dir = run.log_dir
        print(f"creating tenants {', '.join(LABELS)} ...", flush=True)
        tenants = create_tenants(len(LABELS))
        results = Results(
            jobs=args.jobs,
            per_tenant=args.per_tenant,
            workers=args.workers,
            warmup=args.warmup,
            started_at=run.stamp,
            machine=run.machine,
        )
        modes = []
        for key, label, limit, fairness in MODES:
            if args.only and key not in args.only.split(","):
                continue
            print(f"{label}: ...", end=" ", flush=True)
            m = measure_mode(key, label, limit, fairness, tenants, args, log_dir)
            modes.append(m)
            print(
                f"B..F wait p50 {m.p50:.3f} s, p95 {m.p95:.3f} s; all done in "
                f"{m.all_done_seconds:.1f} s" + ("" if m.ok else f"  WARNING: {m.problem}"),
                flush=True,
            )
        results.modes = [{**asdict(m), "p50": m.p50, "p95": m.p95} for m in modes]
        results.summary = summarize(modes) if len(modes) == len(MODES) else {}
        if results.summary:
            print_report(results, modes)
        print(f"  worker logs: {log_dir}")
        if args.json:
            write_results("fairness", run.stamp, asdict(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
