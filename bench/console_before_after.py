"""A tenant's console, the code before a change against the code now, interleaved in one process.

On a database ``bench.dashboard_scale`` built (``--database``), for tenant ``--schema``: the
console's functions of an older ``kumiko_jobs/history/stats.py`` (``--before``: a file, e.g.
from ``git archive``; its ``tenant_days`` and ``tenant_failure_rates``) and today's
``history.console.console``, called alternately ``--rounds`` times each for 14 and 30 days,
all jobs and one, with every cache off (they are plain function calls). Prints p50/p95 of
each and whether every day's runs, succeeded and failed agree. Alternating is what makes the
two comparable on a shared machine whose load moves between runs.

    python -m bench.console_before_after --before /tmp/old/kumiko_jobs/history/stats.py
        [--database kumiko_dashboard_scale] [--redis-db 7] [--schema hs00001] [--rounds 10]
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from bench.history_scale import BUSY_TENANT, prepare_environment


def load_before(path: str) -> Any:
    """The old stats module, loaded as a sibling of today's (its relative imports resolve)."""
    spec = importlib.util.spec_from_file_location("kumiko_jobs.history.stats_before", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def old_console(before: Any, schema: str, days: int, job: str, now: Any) -> dict[str, Any]:
    """What the console's data was before: its days and its jobs' failure rates."""
    return {
        "days": before.tenant_days(schema, days, job, now),
        "jobs": before.tenant_failure_rates(schema, days, now),
    }


def timed(call: Callable[[], Any], into: list[float]) -> Any:
    started = time.perf_counter()
    result = call()
    into.append((time.perf_counter() - started) * 1000)
    return result


def p50_p95(values: list[float]) -> str:
    ordered = sorted(values)
    p95 = ordered[max(0, round(len(ordered) * 0.95) - 1)]
    return f"{statistics.median(ordered):.1f} / {p95:.1f} ms"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True)
    parser.add_argument("--database", default="kumiko_dashboard_scale")
    parser.add_argument("--redis-db", type=int, default=7)
    parser.add_argument("--schema", default=BUSY_TENANT)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args(argv)
    prepare_environment(fresh=False, database=args.database, redis_db=args.redis_db)
    from django.utils import timezone

    from kumiko_jobs.history import console

    before = load_before(args.before)
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    for days in (14, 30):
        for job in ("", "app01.job_010"):
            old: list[float] = []
            new: list[float] = []
            now = timezone.now()
            for _ in range(args.rounds):
                a = timed(functools.partial(old_console, before, args.schema, days, job, now), old)
                b = timed(functools.partial(console.console, args.schema, days, job, now), new)
            counts = [[(d["runs"], d["succeeded"], d["failed"]) for d in x["days"]] for x in (a, b)]
            print(
                f"{args.schema}, {days} days, job {job or '(all)'}: before {p50_p95(old)}, "
                f"after {p50_p95(new)} (p50 / p95); days' counts equal: {counts[0] == counts[1]}"
            )
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
