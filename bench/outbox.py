"""What the transactional outbox costs an enqueue, and how fast the relay catches up.

    python -m bench.outbox [--jobs 2000] [--rounds 3] [--tenants 4]

1. **Enqueue**: ``job.enqueue()`` inside ``transaction.atomic()`` (the run row, which is the
   outbox row, written in the caller's transaction; the push on commit) against plain
   ``django_rq.get_queue().enqueue()`` (and against one reused queue object, django-rq's best
   case: ``get_queue`` builds a new Redis client per call), in one process, alternating them
   for ``--rounds`` rounds; medians and the ratio (issue 7's target: >= 0.7). The outbox adds
   no write of its own: the row is the run's history row, which kumiko writes anyway.
2. **Relay**: ``--jobs`` committed runs whose messages Redis lost (flushed, as by a restart
   without persistence) are pushed again by ``relay_pending()``; then a second pass over the
   same runs, now all held by Redis, shows what checking a waiting run costs when there is
   nothing to do, and so what a maintenance round's slice (``RELAY_ROWS_PER_ROUND``) and a full
   pass over a large backlog take (``--relay-jobs``, default ``--jobs``).

Uses its own database (``kumiko_bench_outbox``, created and dropped) and Redis database 5
(flushed). Setup helpers come from bench/throughput.py. A benchmark, not a test: it asserts
nothing about speed, but checks that every relayed message is in the queue.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from bench.throughput import (
    ENQUEUES,
    QUEUE,
    ROOT,
    TARGET_ENQUEUE,
    create_tenants,
    drop_database,
    enqueue_kumiko,
    measure_enqueue_only,
    prepare_environment,
    reset,
)

BENCH_DATABASE = "kumiko_bench_outbox"
BENCH_REDIS_DB = 5


def enqueue_rounds(tenants: Sequence[Any], jobs: int, rounds: int, warmup: int) -> dict[str, Any]:
    keys = ["plain", "plain_reused", "kumiko_atomic"]
    rates: dict[str, list[float]] = {key: [] for key in keys}
    for round_ in range(rounds):
        # Alternate the order, so that a machine getting busier favours no side.
        for key in keys if round_ % 2 == 0 else keys[::-1]:
            rate = measure_enqueue_only(key, tenants, jobs, warmup).enqueue_rate
            rates[key].append(rate)
            print(f"round {round_ + 1}: {ENQUEUES[key][0]:<36}{rate:8.0f} jobs/s", flush=True)
    medians = {key: statistics.median(values) for key, values in rates.items()}
    return {
        **medians,
        "ratio": medians["kumiko_atomic"] / medians["plain"],
        "ratio_reused": medians["kumiko_atomic"] / medians["plain_reused"],
        "rates": rates,
    }


def relay_rates(tenants: Sequence[Any], jobs: int) -> dict[str, float]:
    from django.utils import timezone

    from kumiko_jobs import transport
    from kumiko_jobs.models import JobRun
    from kumiko_jobs.worker.relay import relay_pending

    reset(tenants)
    enqueue_kumiko(tenants, jobs)
    transport.connection_for(QUEUE).flushdb()  # Redis restarted without its data
    JobRun.objects.update(queued_at=timezone.now() - timedelta(hours=1))
    started = time.perf_counter()
    lost = relay_pending(grace=0)
    push_seconds = time.perf_counter() - started
    queued = transport.queue_length(QUEUE)
    if lost.pushed != jobs or queued != jobs:
        print(f"  WARNING: relay pushed {lost.pushed}, queue holds {queued}, expected {jobs}")
    started = time.perf_counter()
    idle = relay_pending(grace=0)
    check_seconds = time.perf_counter() - started
    if idle.pushed:
        print(f"  WARNING: a second relay pass pushed {idle.pushed} again")
    reset(tenants)
    return {"push_per_s": jobs / push_seconds, "check_per_s": idle.checked / check_seconds}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.outbox",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--jobs", type=int, default=2000, help="enqueues per measurement (2000)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each, medians (3)")
    parser.add_argument("--tenants", type=int, default=4, help="tenants to spread over (4)")
    parser.add_argument("--warmup", type=int, default=100, help="untimed enqueues first (100)")
    parser.add_argument(
        "--relay-jobs", type=int, default=0, help="waiting runs for the relay (--jobs)"
    )
    parser.add_argument("--database", default=BENCH_DATABASE)
    parser.add_argument("--redis-db", type=int, default=BENCH_REDIS_DB)
    args = parser.parse_args(argv)
    if args.jobs < 1 or args.rounds < 1 or args.tenants < 1:
        parser.error("--jobs, --rounds and --tenants must be >= 1")
    sys.path.insert(0, str(ROOT))
    admin_url = prepare_environment(args.database, args.redis_db)
    try:
        from kumiko_jobs.core import conf

        tenants = create_tenants(args.tenants)
        enqueue = enqueue_rounds(tenants, args.jobs, args.rounds, args.warmup)
        relay = relay_rates(tenants, args.relay_jobs or args.jobs)
        verdict = "meets" if enqueue["ratio"] >= TARGET_ENQUEUE else "below"
        print()
        print(f"{args.jobs} enqueues over {args.tenants} tenants, median of {args.rounds} rounds")
        for key in ("plain", "plain_reused", "kumiko_atomic"):
            rounds = [round(r) for r in enqueue["rates"][key]]
            print(f"  {ENQUEUES[key][0]:<38}{enqueue[key]:8.0f} jobs/s  {rounds}")
        print(
            f"  ratio job.enqueue() in atomic() / django_rq.get_queue().enqueue() = "
            f"{enqueue['ratio']:.2f} ({verdict} the target {TARGET_ENQUEUE}); against one "
            f"reused queue object (django-rq's best case): {enqueue['ratio_reused']:.2f}"
        )
        print(
            f"  relay: {relay['push_per_s']:.0f} lost messages pushed per s; "
            f"{relay['check_per_s']:.0f} waiting runs checked per s when Redis holds them all"
        )
        rows = conf.get().RELAY_ROWS_PER_ROUND
        print(
            f"  so a maintenance round's slice of RELAY_ROWS_PER_ROUND = {rows:,} takes about "
            f"{rows / relay['check_per_s']:.2f} s whatever the backlog; a full pass (the CLI's "
            f"relay, and every round before slices) {100_000 / relay['check_per_s']:.1f} s at "
            f"100,000 waiting runs, {1_000_000 / relay['check_per_s']:.0f} s at 1,000,000"
        )
    finally:
        from django.db import connections

        from kumiko_jobs import transport

        transport.connection_for(QUEUE).flushdb()
        connections.close_all()
        drop_database(admin_url, args.database)
    return 0


if __name__ == "__main__":
    sys.exit(main())
