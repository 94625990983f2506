"""Shares of worker time under the fair dequeue: equal weights, weights 1:2:4, and a tenant
whose jobs take 10x longer.

In each scenario two ``rqworker`` processes (kumiko's default worker, ``FAIRNESS`` as the
scenario says) are held on a ``billing.bench_hold`` run each while every tenant enqueues its
whole backlog of ``soak.sleeper`` runs (each sleeps its tenant's job length, then writes one
row), tenant after tenant (the worst order for FIFO); then the workers are released. Each
tenant's backlog is sized so that, shared fairly, all of them last about ``--span`` seconds.

From the history rows (``started_at``..``finished_at`` of every run): the interval in which
every tenant still had runs waiting (release to the first tenant's last start), cut into
``--window``-second windows; per window the worker-seconds of each tenant, divided by its
weight, and Jain's fairness index over those; over the whole interval each tenant's share of
the worker-seconds against its weight's share.

    python -m bench.fairness_shares [--span 40] [--window 10] [--seconds 0.05] [--json]

Database ``kumiko_bench_fairness`` (created, then dropped) and Redis database 4 (flushed), as
``bench/fairness.py``. A benchmark, not a test: it asserts nothing about speed, and checks that
every run succeeded.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench import common
from bench.fairness import (
    BENCH_DATABASE,
    BENCH_REDIS_DB,
    HOLD_KEY,
    Workers,
    unfinished_runs,
    wait_for,
)
from bench.throughput import (
    QUEUE,
    create_tenants,
    print_load,
    reset,
    write_results,
)

SLEEPER = "soak.sleeper"


@dataclass(frozen=True)
class Scenario:
    key: str
    label: str
    weights: tuple[float, ...]  # per tenant
    lengths: tuple[float, ...]  # job length per tenant, in units of --seconds
    fairness: str = "tenant"


SCENARIOS = (
    Scenario("equal", "3 tenants, equal weights", (1, 1, 1), (1, 1, 1)),
    Scenario("weights", "weights 1:2:4", (1, 2, 4), (1, 1, 1)),
    Scenario("slow", "A's jobs 10x longer, equal weights", (1, 1), (10, 1)),
    Scenario("equal_fifo", "3 tenants, FAIRNESS='fifo' (contrast)", (1, 1, 1), (1, 1, 1), "fifo"),
)
_weights: dict[str, float] = {}


def bench_weight(schema: str) -> float:
    """``TENANT_WEIGHT`` of the scenario running (called in this process, at each push)."""
    return _weights.get(schema, 1.0)


@dataclass
class ScenarioResult:
    key: str
    label: str
    weights: list[float]
    job_seconds: list[float]
    backlogs: list[int]
    backlogged_seconds: float = 0.0
    jain_per_window: list[float] = field(default_factory=list)
    shares: list[float] = field(default_factory=list)  # of worker-seconds, while backlogged
    expected_shares: list[float] = field(default_factory=list)
    ok: bool = True
    problem: str = ""

    @property
    def jain_min(self) -> float:
        return min(self.jain_per_window, default=float("nan"))


def jain(values: Sequence[float]) -> float:
    total = sum(values)
    squares = sum(v * v for v in values)
    return total * total / (len(values) * squares) if squares else 1.0


def overlap(start: float, end: float, lo: float, hi: float) -> float:
    return max(0.0, min(end, hi) - max(start, lo))


def run_scenario(
    scenario: Scenario, tenants: Sequence[Any], args: argparse.Namespace, log_dir: Path
) -> ScenarioResult:
    from django.conf import settings
    from django.test import override_settings

    from example_project.billing.jobs import bench_hold
    from example_project.billing.jobs import soak_sleeper as sleeper
    from kumiko_jobs import transport
    from kumiko_jobs.models import JobRun, RunStatus

    used = tenants[: len(scenario.weights)]
    seconds = [args.seconds * n for n in scenario.lengths]
    total_weight = sum(scenario.weights)
    expected = [w / total_weight for w in scenario.weights]
    backlogs = [
        math.ceil(1.5 * args.span * args.workers * share / length)
        for share, length in zip(expected, seconds, strict=True)
    ]
    result = ScenarioResult(scenario.key, scenario.label, list(scenario.weights), seconds, backlogs)
    _weights.clear()
    _weights.update({t.schema_name: w for t, w in zip(used, scenario.weights, strict=True)})
    kumiko = {
        **getattr(settings, "KUMIKO_JOBS", {}),
        "TENANT_WEIGHT": f"{__name__}.bench_weight",
        "FAIRNESS": scenario.fairness,
    }
    redis = transport.connection_for(QUEUE)
    reset(tenants)
    workers = Workers(args.workers, log_dir, scenario.key, {"FAIRNESS": scenario.fairness})
    try:
        with override_settings(KUMIKO_JOBS=kumiko):
            for tenant in used:
                sleeper.enqueue(tenant=tenant, tag="warmup", seconds=0.0)
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
            for tenant, count, length in zip(used, backlogs, seconds, strict=True):
                for n in range(count):
                    sleeper.enqueue(tenant=tenant, tag=f"s{n}", seconds=length)
            released = time.time()
            redis.rpush(HOLD_KEY, *["go"] * args.workers)
        wait_for(lambda: unfinished_runs() == 0, "every run to finish", workers, args.timeout)
    finally:
        redis.rpush(HOLD_KEY, *["go"] * args.workers)
        workers.stop()

    runs = JobRun.objects.filter(job_name=SLEEPER).exclude(payload__tag="warmup")
    if (n := runs.filter(status=RunStatus.SUCCEEDED).count()) != sum(backlogs):
        result.ok, result.problem = False, f"{n} of {sum(backlogs)} runs succeeded"
    spans: dict[str, list[tuple[float, float]]] = {t.schema_name: [] for t in used}
    for schema, started, finished in runs.values_list("schema_name", "started_at", "finished_at"):
        if started and finished:
            spans[schema].append((started.timestamp(), finished.timestamp()))
    end = min(max(s for s, _ in spans[t.schema_name]) for t in used)
    result.backlogged_seconds = end - released
    totals = [0.0] * len(used)
    lo = released
    while lo + args.window <= end:
        hi = lo + args.window
        per = [sum(overlap(s, f, lo, hi) for s, f in spans[t.schema_name]) for t in used]
        result.jain_per_window.append(
            jain([p / w for p, w in zip(per, scenario.weights, strict=True)])
        )
        totals = [a + b for a, b in zip(totals, per, strict=True)]
        lo = hi
    grand = sum(totals)
    result.shares = [t / grand if grand else float("nan") for t in totals]
    result.expected_shares = expected
    return result


def print_report(results: Sequence[ScenarioResult], machine: dict[str, Any]) -> None:
    print()
    for r in results:
        shares = ", ".join(
            f"{s:.1%} (want {e:.1%})" for s, e in zip(r.shares, r.expected_shares, strict=True)
        )
        windows = ", ".join(f"{j:.3f}" for j in r.jain_per_window)
        print(f"  {r.label}: all backlogged for {r.backlogged_seconds:.0f} s")
        print(f"    worker-seconds shares: {shares}")
        print(f"    Jain's index per {len(r.jain_per_window)} windows: {windows}")
        if not r.ok:
            print(f"    WARNING: {r.problem} - the numbers above are not valid")
    print_load(machine)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = common.parser(
        "python -m bench.fairness_shares", __doc__, database=BENCH_DATABASE, redis_db=BENCH_REDIS_DB
    )
    parser.add_argument("--span", type=float, default=40, help="seconds of shared backlog (40)")
    parser.add_argument("--window", type=float, default=10, help="window for Jain's index (10)")
    parser.add_argument("--seconds", type=float, default=0.05, help="base job length (0.05)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes (2)")
    parser.add_argument("--only", default="", help="comma-separated scenario keys")
    parser.add_argument("--timeout", type=float, default=1800)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    results = []
    with common.session(args, "kumiko-shares-") as run:
        log_dir, machine = run.log_dir, run.machine
        tenants = create_tenants(3)
        for scenario in SCENARIOS:
            if args.only and scenario.key not in args.only.split(","):
                continue
            print(f"{scenario.label}: ...", end=" ", flush=True)
            r = run_scenario(scenario, tenants, args, log_dir)
            results.append(r)
            print(
                f"min Jain {r.jain_min:.3f}, shares {[round(s, 3) for s in r.shares]}", flush=True
            )
        print_report(results, machine)
        if args.json:
            write_results(
                "fairness_shares",
                run.stamp,
                {"machine": machine, "args": vars(args), "results": [asdict(r) for r in results]},
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
