"""A group of 10,000 members with a callback: the enqueue's memory, time, statements and Redis
round trips, then (``--run``) the members run by an in-process kumiko worker, with the SQL
statements their finishes cost and the callback's release counted.

(enqueue) ``kumiko_jobs.workflow(group([soak.work.step(n=i) ...], then=soak.work.step(n=-1)))
          .enqueue(tenant=t)`` in one transaction: the workflow row, the step rows and the
          members' run rows inserted ``CHUNK`` (500) at a time; on commit the members' messages
          are read back from their rows chunk by chunk and pushed with one pipeline per chunk.
          Measured: wall time of the enqueue and of the commit (the pushes), the Python memory
          allocated meanwhile (``tracemalloc`` peak, a separate untimed pass), SQL statements
          and Redis round trips.
(run)     a kumiko ``Worker`` in burst mode over the queue: every member's finish, the
          callback's release in the last one's, the callback's run. Measured: time, SQL
          statements per member (beside a plain run's 4: start, search_path, job, finish), and
          the callback's runs (must be 1).

    python -m bench.workflows [--members 10000] [--run] [--json]

Database ``kumiko_bench_workflows`` (created, then dropped) and Redis database 5 (flushed). A
benchmark, not a test: it asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import sys
import time
import tracemalloc
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from bench.throughput import (
    QUEUE,
    clean_up,
    counting_round_trips,
    create_tenants,
    machine_facts,
    prepare_environment,
    print_load,
    reset,
    write_results,
)

BENCH_DATABASE = "kumiko_bench_workflows"
BENCH_REDIS_DB = 8  # shared with admin_scale.py, which never runs a worker


def _flow(members: int) -> Any:
    import kumiko_jobs
    from kumiko_jobs.definition.registry import registry

    work = registry.get("soak.work")
    return kumiko_jobs.workflow(
        kumiko_jobs.group(
            (work.step(n=i) for i in range(members)),  # type: ignore[attr-defined]
            then=work.step(n=-1, key="callback"),  # type: ignore[attr-defined]
        ),
        name="bench",
    )


@contextmanager
def _traced() -> Iterator[dict[str, int]]:
    found = {"peak": 0}
    tracemalloc.start()
    try:
        yield found
    finally:
        found["peak"] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()


def enqueue_once(tenant: Any, members: int) -> tuple[Any, dict[str, float]]:
    """One enqueue in a transaction; (handle, timings of the enqueue and of the commit)."""
    from django.db import transaction

    flow = _flow(members)
    started = time.perf_counter()
    with transaction.atomic():
        handle = flow.enqueue(tenant=tenant)
        written = time.perf_counter()
    committed = time.perf_counter()
    return handle, {"rows_s": written - started, "push_s": committed - written}


def measure(members: int, run: bool) -> dict[str, Any]:
    tenants = create_tenants(1)
    tenant = tenants[0]
    results: dict[str, Any] = {"members": members}

    reset(tenants)
    flow = None
    with _traced() as memory:
        flow = _flow(members)
        from django.db import transaction

        with transaction.atomic():
            flow.enqueue(tenant=tenant)
    results["enqueue_peak_mib"] = round(memory["peak"] / 2**20, 2)

    reset(tenants)
    with counting_round_trips() as counts:
        handle, timings = enqueue_once(tenant, members)
    results.update({k: round(v, 3) for k, v in timings.items()})
    results["enqueue_sql"] = counts["sql"]
    results["enqueue_redis"] = counts["redis"]
    from kumiko_jobs import transport

    results["queued_messages"] = transport.get_queue(QUEUE).count
    if run:
        results.update(_run(handle, members))
    return results


def _run(handle: Any, members: int) -> dict[str, Any]:
    from kumiko_jobs import transport
    from kumiko_jobs.models import JobRun, WorkflowStep
    from kumiko_jobs.worker import Worker

    queue = transport.get_queue(QUEUE)
    started = time.perf_counter()
    with counting_round_trips() as counts:
        Worker([queue], connection=queue.connection).work(burst=True)
    elapsed = time.perf_counter() - started
    # Redis databases below 9 are shared between the benchmarks: one flushed by another bench
    # while this one ran loses messages, which the relay pushes again from their rows (as it
    # does in a deployment). Counted, so a figure never hides it.
    from kumiko_jobs.worker.relay import relay_pending

    relayed = relay_pending(grace=0).pushed
    if relayed:
        Worker([queue], connection=queue.connection).work(burst=True)
    workflow = handle.refresh()
    callback = WorkflowStep.objects.get(workflow_id=handle.workflow_id, key="callback")
    return {
        "run_s": round(elapsed, 2),
        "run_sql_per_run": round(counts["sql"] / (members + 1), 2),
        "run_redis_per_run": round(counts["redis"] / (members + 1), 2),
        "relayed_after_burst": relayed,
        "workflow_status": workflow.status,
        "steps_pending": workflow.steps_pending,
        "callback_runs": JobRun.objects.filter(run_id=callback.run_id).count(),
        "callback_state": callback.state,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, default=10_000)
    parser.add_argument("--run", action="store_true", help="also run the members and callback")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--keep-database", action="store_true")
    args = parser.parse_args(argv)
    admin_url = prepare_environment(BENCH_DATABASE, BENCH_REDIS_DB)
    machine = machine_facts()
    try:
        results = measure(args.members, args.run)
    finally:
        clean_up(admin_url, BENCH_DATABASE, keep_database=args.keep_database)
    print(f"workflow group of {args.members} members and a callback")
    for key, value in results.items():
        print(f"  {key}: {value}")
    print_load(machine)
    if args.json:
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        write_results("workflows", stamp, {"machine": machine, "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
