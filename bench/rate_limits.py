"""Rate limits: in every window no more starts than the limit, and at least 95 % of it while
backlogged. Real worker processes (``manage.py rqworker default``), the bench's own database
and Redis database.

Two scenarios, each a backlog enqueued at once and drained by ``--workers`` workers:

* ``global``: ``billing.bench_rate_write`` (``rate_limit="20/s"``), ``--jobs`` runs spread over
  three tenants: at most 20 starts in any second across them;
* ``tenant``: ``billing.bench_tenant_rate_write`` (``tenant_rate_limit="5/s"``), ``--jobs``
  runs per tenant for three tenants: at most 5 starts in any second per tenant, the three
  together 15/s (one tenant's limit does not hold the others back).

Read twice. The admissions, as the limit counts them: a thread copies the rate windows'
sorted sets (one member per admitted start, scored by Redis's clock at the admission) every
0.2 s while the backlog drains, before the dequeue prunes them (a member lives at least the
window's length, 1 s). And the history: every run's ``JobRun.started_at`` (the worker's
clock, a few ms after the admission). "Most in any window" slides a 1 s window over the
starts; "use while backlogged" is the starts in the whole seconds from the first start
to the last full second, divided by the limit times those seconds (the last partial second
is not backlogged).

    python -m bench.rate_limits [--jobs 200] [--workers 2] [--json]

A benchmark, not a test: it asserts nothing; it checks that every run succeeded.
"""

from __future__ import annotations

import argparse
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench import common
from bench.fairness import Workers, unfinished_runs, wait_for
from bench.throughput import (
    create_tenants,
    print_load,
    reset,
    write_results,
)

BENCH_DATABASE = "kumiko_bench_rates"
RATE_KEYS = "kumiko:rate:*"  # transport/fair.py's RATE_PREFIX: the windows' sorted sets
BENCH_REDIS_DB = 4


def most_in_any_window(times: Sequence[float], window: float = 1.0) -> int:
    """The most starts inside any ``[t, t + window)``, t a start (where a maximum begins)."""
    ts, best, j = sorted(times), 0, 0
    for i, start in enumerate(ts):
        j = max(j, i)
        while j < len(ts) and ts[j] - start < window:
            j += 1
        best = max(best, j - i)
    return best


def shortest_span(times: Sequence[float], limit: int) -> float:
    """The shortest time between a start and the ``limit``-th after it (>= 1 s: never more
    than ``limit`` in a second; a hair under 1 s: the recording's jitter, see the top)."""
    ts = sorted(times)
    return min((ts[i + limit] - ts[i] for i in range(len(ts) - limit)), default=float("inf"))


def use_while_backlogged(times: Sequence[float], limit: int, window: float = 1.0) -> float:
    """Starts in the whole windows from the first start, over ``limit`` per window."""
    ts = sorted(times)
    whole = int((ts[-1] - ts[0]) // window)
    if whole < 1:
        return 0.0
    inside = sum(1 for t in ts if t < ts[0] + whole * window)
    return inside / (limit * whole)


class Admissions:
    """Copies every rate window's members (``<job id>@<time>``, scored by the admission's time
    on Redis's clock) until stopped: the starts as the limit admitted them."""

    def __init__(self, connection: Any) -> None:
        self.connection = connection
        self.seen: dict[str, dict[str, float]] = {}  # window key -> member -> admission time
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _copy(self) -> None:
        for key in self.connection.scan_iter(match=RATE_KEYS, count=1000):
            members = self.connection.zrange(key, 0, -1, withscores=True)
            self.seen.setdefault(key.decode(), {}).update((m.decode(), s) for m, s in members)

    def _watch(self) -> None:
        while not self._stop.wait(0.2):
            self._copy()

    def stop(self) -> dict[str, list[float]]:
        self._stop.set()
        self._thread.join()
        self._copy()
        return {key: sorted(members.values()) for key, members in self.seen.items()}


def scenario(name: str, tenants: Sequence[Any], args: argparse.Namespace, log: Path) -> dict:
    from example_project.billing.jobs import bench_rate_write, bench_tenant_rate_write
    from kumiko_jobs.models import JobRun, RunStatus

    reset(tenants)
    job = bench_rate_write if name == "global" else bench_tenant_rate_write
    limit = 20 if name == "global" else 5
    total = args.jobs if name == "global" else args.jobs * len(tenants)
    import django_rq

    admissions = Admissions(django_rq.get_connection("default"))
    workers = Workers(args.workers, log, name)
    try:
        for n in range(total):
            job.enqueue(tenant=tenants[n % len(tenants)], n=n)
        wait_for(lambda: unfinished_runs() == 0, "every run to finish", workers, args.timeout)
    finally:
        workers.stop()
        admitted = admissions.stop()
    rows = list(
        JobRun.objects.filter(job_name=job.name).values_list("schema_name", "started_at", "status")
    )
    ok = sum(1 for *_, status in rows if status == RunStatus.SUCCEEDED)
    groups: dict[str, list[float]] = {}
    for schema, started, _ in rows:
        key = "all" if name == "global" else schema
        groups.setdefault(key, []).append(started.timestamp())
    result = {
        "scenario": name,
        "limit_per_s": limit,
        "runs": total,
        "succeeded": ok,
        "groups": {
            key: {
                "starts": len(ts),
                "most_in_any_1s": most_in_any_window(ts),
                "shortest_span_of_limit_plus_1": round(shortest_span(ts, limit), 4),
                "use_while_backlogged": round(use_while_backlogged(ts, limit), 4),
                "drain_seconds": round(max(ts) - min(ts), 3),
            }
            for key, ts in sorted(groups.items())
        },
    }
    result["admitted"] = {
        key.removeprefix("kumiko:rate:").replace("\t", " "): {
            "admissions": len(ts),
            "most_in_any_1s": most_in_any_window(ts),
            "shortest_span_of_limit_plus_1": round(shortest_span(ts, limit), 4),
            "use_while_backlogged": round(use_while_backlogged(ts, limit), 4),
        }
        for key, ts in sorted(admitted.items())
    }
    if name == "tenant":
        every = [t for ts in groups.values() for t in ts]
        result["together_per_s"] = round(len(every) / max(max(every) - min(every), 1e-9), 2)
    return result


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = common.parser(
        "python -m bench.rate_limits", __doc__, database=BENCH_DATABASE, redis_db=BENCH_REDIS_DB
    )
    parser.add_argument("--jobs", type=int, default=200, help="runs (global), per tenant (tenant)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes (2)")
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--only", default="", help="global or tenant")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    results = []
    with common.session(args, "kumiko-rates-") as run:
        log, machine = run.log_dir, run.machine
        tenants = create_tenants(3)
        for name in ("global", "tenant"):
            if args.only and name != args.only:
                continue
            r = scenario(name, tenants, args, log)
            results.append(r)
            print(
                f"{name} (limit {r['limit_per_s']}/s, {r['runs']} runs, "
                f"{r['succeeded']} succeeded)",
                flush=True,
            )
            for key, g in r["groups"].items():
                print(
                    f"  {key}: most in any 1 s window {g['most_in_any_1s']}, use while "
                    f"backlogged {g['use_while_backlogged']:.1%}, drain {g['drain_seconds']} s, "
                    f"{r['limit_per_s'] + 1} starts span >= {g['shortest_span_of_limit_plus_1']} s"
                )
            for key, g in r["admitted"].items():
                print(
                    f"  admitted ({key}): {g['admissions']}, most in any 1 s window "
                    f"{g['most_in_any_1s']}, use while backlogged "
                    f"{g['use_while_backlogged']:.1%}, {r['limit_per_s'] + 1} admissions span "
                    f">= {g['shortest_span_of_limit_plus_1']} s"
                )
            if "together_per_s" in r:
                print(f"  all tenants together: {r['together_per_s']} starts/s")
        print_load(machine)
        print(f"  worker logs: {log}")
        if args.json:
            write_results("rate_limits", run.stamp, {"machine": machine, "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
