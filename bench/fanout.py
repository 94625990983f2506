"""Per-tenant fan-out to 1,000 tenants against a loop of 1,000 single enqueues.

One run measures, on the same machine, services and data, the two ways of putting one message
per tenant on the queue for the per-tenant job ``billing.bench_fanout``:

(fan-out) ``bench_fanout.enqueue(n=0)`` without a tenant, then a kumiko worker runs that parent
          run: ``kumiko_jobs.fanout.fan_out`` reads the tenants ``FANOUT_CHUNK_SIZE`` at a time
          and, per chunk, inserts the child rows (one ``INSERT ... ON CONFLICT DO NOTHING
          RETURNING``, committed) and pushes their messages (``transport.push_many``, one
          pipeline per 500). Timed: the worker taking and running the parent message.
(singles) ``bench_fanout.enqueue(tenant=t, n=0)`` for every tenant in a loop, outside a
          transaction (each call writes its row and pushes at once), as code without fan-out
          would do it. Timed: the loop.

Both end with the same state: one queued run row and one queue message per tenant (checked).
Untimed passes count the SQL statements and Redis round trips of each way, and the peak of the
Python memory the worker allocates during the parent run (``tracemalloc``). With ``--cron``, a
per-tenant cron job's tick goes through the real scheduler path, ``transport.Scheduler``'s
``enqueue_job`` for the cron alarm (``schedules.fire`` writes the tick's run row and pushes one
message): how long the scheduler process is busy per tick, whatever the tenant count, since the
fan-out itself runs in a worker.
The children are not run: only the enqueue side is measured, so the tenants are plain rows made
with ``Client.objects.bulk_create`` (no ``save()``, so django-tenants creates and migrates no
schema; 1,000 real schemas would take many minutes and change nothing measured here).

    python -m bench.fanout [--tenants 1000] [--rounds 3] [--tenant-concurrency N] [--no-singles]
                           [--chunk-size N] [--cron] [--json]

Everything happens in a database of its own (created, then dropped) and Redis database 3
(flushed). A benchmark, not a test: it asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from bench import common
from bench.throughput import (
    QUEUE,
    ROOT,
    clean_up,
    counting_round_trips,
    create_tenants,
    machine_facts,
    prepare_environment,
    print_load,
    reset,
    write_results,
)

BENCH_DATABASE = "kumiko_bench_fanout"
BENCH_REDIS_DB = 3
# Wraps exactly the timed part of a measurement (the round-trip counter in the warm-up).
Around = Callable[[], AbstractContextManager[Any]]


# --------------------------------------------------------------------------- setup


def create_schemaless_tenants(count: int) -> list[Any]:
    """``count`` tenant rows without schemas (enough to be enqueued for, not to run in)."""
    from example_project.customers.models import Client

    create_tenants(0)  # the shared schema and the public tenant; no tenant schema
    Client.objects.bulk_create(
        [Client(schema_name=f"fan{i:05d}", name=f"Fan-out {i}") for i in range(1, count + 1)],
        batch_size=500,
    )
    return list(Client.objects.filter(schema_name__startswith="fan").order_by("pk"))


# --------------------------------------------------------------------------- measuring


@contextmanager
def timing(target: Any, attr: str, totals: dict[str, float], name: str) -> Iterator[None]:
    """Add the time spent in ``target.attr`` to ``totals[name]`` while the block runs."""
    original = getattr(target, attr)

    def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            totals[name] = totals.get(name, 0.0) + time.perf_counter() - started

    setattr(target, attr, timed)
    try:
        yield
    finally:
        setattr(target, attr, original)


@dataclass
class Measurement:
    key: str  # "fanout" or "singles"
    tenants: int
    seconds: float
    phases: dict[str, float] = field(default_factory=dict)  # fan-out only: where it went
    ok: bool = True
    problem: str = ""

    @property
    def rate(self) -> float:
        return self.tenants / self.seconds


def check(tenants: int, runs: Any, key: str) -> list[str]:
    """Both ways must leave one queued run and one queue message per tenant."""
    from kumiko_jobs import transport
    from kumiko_jobs.models import RunStatus

    problems = []
    rows = runs.filter(status=RunStatus.QUEUED).values_list("schema_name", flat=True)
    if (n := len(set(rows))) != tenants:
        problems.append(f"{key}: {n} of {tenants} tenants have a queued run")
    if (n := transport.queue_length(QUEUE)) != tenants:
        problems.append(f"{key}: {n} messages on the queue, expected {tenants}")
    return problems


def measure_fanout(tenants: Sequence[Any], around: Around = nullcontext) -> Measurement:
    from example_project.billing.jobs import bench_fanout
    from kumiko_jobs import transport
    from kumiko_jobs.enqueueing import fanout
    from kumiko_jobs.models import JobRun, RunStatus
    from kumiko_jobs.worker import Worker

    reset([])  # kumiko's tables and the bench's Redis database (the tenants have no tables)
    handle = bench_fanout.enqueue(n=0)  # the parent, without a tenant: a fan-out
    queue = transport.get_queue(QUEUE)
    worker = Worker([queue], connection=queue.connection)
    phases: dict[str, float] = {}
    with ExitStack() as stack:
        stack.enter_context(timing(fanout, "tenant_chunks", phases, "tenant_pages"))
        stack.enter_context(timing(fanout, "insert_new", phases, "rows"))
        stack.enter_context(timing(transport, "push_many", phases, "push_many"))
        with around():
            started = time.perf_counter()
            worker.work(burst=True, max_jobs=1, logging_level="WARNING")
            seconds = time.perf_counter() - started
    # tenant_chunks is a generator: the call returns at once, the pages are read as it is
    # iterated; their time stays in "rest" with the envelopes, rows objects and signing.
    phases.pop("tenant_pages", None)
    phases["rest"] = seconds - sum(phases.values())
    problems = []
    status = JobRun.objects.get(pk=handle.run_id).status
    if status != RunStatus.SUCCEEDED:
        problems.append(f"the fan-out run is {status}")
    problems += check(len(tenants), JobRun.objects.filter(parent_run_id=handle.run_id), "fan-out")
    return Measurement("fanout", len(tenants), seconds, phases, not problems, "; ".join(problems))


def measure_singles(tenants: Sequence[Any], around: Around = nullcontext) -> Measurement:
    from example_project.billing.jobs import bench_fanout
    from kumiko_jobs.models import JobRun

    reset([])
    with around():
        started = time.perf_counter()
        for tenant in tenants:
            bench_fanout.enqueue(tenant=tenant, n=0)
        seconds = time.perf_counter() - started
    problems = check(len(tenants), JobRun.objects.all(), "singles")
    return Measurement(
        "singles", len(tenants), seconds, ok=not problems, problem="; ".join(problems)
    )


@contextmanager
def peak_memory(into: dict[str, int]) -> Iterator[None]:
    """The peak of Python's traced allocations meanwhile (bytes above the start)."""
    import tracemalloc

    tracemalloc.start()
    try:
        start, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        yield
        _, peak = tracemalloc.get_traced_memory()
        into["peak_bytes"] = peak - start
    finally:
        tracemalloc.stop()


def cron_definition() -> Any:
    """A per-tenant cron job for the tick (registered for the measurement only, like a
    test's: ``cron_ticks`` holds ``registry.override``)."""
    from example_project.billing.jobs import bench_fanout
    from kumiko_jobs.definition.options import build_definition

    definition = build_definition(
        bench_fanout.func, {"name": "bench.fanout_cron", "per_tenant": True, "cron": "0 3 * * *"}
    )
    return definition


def measure_cron_tick(definition: Any, around: Around = nullcontext) -> dict[str, Any]:
    """One tick of a per-tenant cron job through ``transport.Scheduler.enqueue_job``."""
    from kumiko_jobs import transport
    from kumiko_jobs.enqueueing.schedules import schedule_id, sync_schedules
    from kumiko_jobs.models import JobRun

    reset([])
    sync_schedules()
    queue = transport.get_queue(QUEUE)
    scheduler = transport.Scheduler(queue=queue, connection=queue.connection)
    (alarm,) = [j for j in scheduler.get_jobs() if j.id == schedule_id(definition)]
    with around():
        started = time.perf_counter()
        scheduler.enqueue_job(alarm)
        seconds = time.perf_counter() - started
    rows = JobRun.objects.filter(job_name=definition.name, trigger="cron").count()
    return {"seconds": seconds, "ok": rows == 1 and transport.queue_length(QUEUE) == 1}


MEASURES: dict[str, tuple[str, Callable[..., Measurement]]] = {
    "fanout": ("fan-out: parent run, push_many", measure_fanout),
    "singles": ("loop of job.enqueue(tenant=...)", measure_singles),
}


@contextmanager
def counting_into(totals: dict[str, int]) -> Iterator[None]:
    with counting_round_trips() as counts:
        yield
    totals.update(counts)


def round_trips(tenants: Sequence[Any], keys: Sequence[str]) -> dict[str, dict[str, float]]:
    """SQL statements and Redis round trips of each way's timed part, in an untimed pass.

    The counting wraps every call, so this pass doubles as the warm-up and is never timed.
    """
    counts = {}
    for key in keys:
        _, measure = MEASURES[key]
        counted: dict[str, int] = {}
        m = measure(tenants, functools.partial(counting_into, counted))
        if not m.ok:
            print(f"  WARNING (warm-up, {key}): {m.problem}")
        counts[key] = {name: float(value) for name, value in counted.items()}
    return counts


# --------------------------------------------------------------------------- report


@dataclass
class Results:
    tenants: int
    rounds: int
    tenant_concurrency: int | None
    started_at: str
    machine: dict[str, Any]
    note: str
    measurements: list[dict[str, Any]] = field(default_factory=list)
    round_trips: dict[str, dict[str, float]] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    chunk_size: int = 0
    fanout_peak_bytes: int = 0
    cron: dict[str, Any] = field(default_factory=dict)


def summarize(measurements: Sequence[Measurement]) -> dict[str, Any]:
    keys = [key for key in MEASURES if any(m.key == key for m in measurements)]
    seconds = {
        key: statistics.median(m.seconds for m in measurements if m.key == key) for key in keys
    }
    fanouts = [m for m in measurements if m.key == "fanout"]
    phases = {
        name: statistics.median(m.phases.get(name, 0.0) for m in fanouts)
        for name in ("rows", "push_many", "rest")
    }
    tenants = measurements[0].tenants
    return {
        "seconds": seconds,
        "messages_per_s": {key: tenants / s for key, s in seconds.items()},
        "fanout_over_singles": (
            seconds["singles"] / seconds["fanout"] if "singles" in seconds else None
        ),
        "fanout_phases_seconds": phases,
        "all_ok": all(m.ok for m in measurements),
    }


def print_report(results: Results) -> None:
    s = results.summary
    rounds = f", median of {results.rounds} rounds" if results.rounds > 1 else ""
    limit = results.tenant_concurrency
    print()
    print(f"one message per tenant for {results.tenants} tenants{rounds}")
    print(f"  ({results.note})")
    if limit:
        print(f"  TENANT_CONCURRENCY={limit}: every message goes through RQ's RateLimit")
    print()
    print(f"  {'':<36}{'seconds':>9}{'messages/s':>12}{'SQL':>8}{'Redis trips':>13}")
    for key, (label, _) in MEASURES.items():
        if key not in s["seconds"]:
            continue
        trips = results.round_trips.get(key, {})
        print(
            f"  {label:<36}{s['seconds'][key]:>9.3f}{s['messages_per_s'][key]:>12.0f}"
            f"{trips.get('sql', 0):>8.0f}{trips.get('redis', 0):>13.0f}"
        )
    print()
    if s["fanout_over_singles"] is not None:
        print(f"  fan-out / singles = {s['fanout_over_singles']:.1f}x the messages per second")
    p = s["fanout_phases_seconds"]
    print(
        f"  the parent run (FANOUT_CHUNK_SIZE={results.chunk_size}): child rows (one INSERT per "
        f"chunk) {p['rows']:.3f} s, push_many {p['push_many']:.3f} s, the rest (tenant pages, "
        f"{results.tenants} signed envelopes, run record, worker) {p['rest']:.3f} s"
    )
    print(
        f"  peak Python memory the worker allocated during the parent run: "
        f"{results.fanout_peak_bytes / 2**20:.1f} MiB (tracemalloc, untimed pass)"
    )
    if results.cron:
        c = results.cron
        print(
            f"  per-tenant cron tick, scheduler side (transport.Scheduler.enqueue_job): "
            f"{c['seconds'] * 1000:.1f} ms median of {c['rounds']}, {c['sql']:.0f} SQL, "
            f"{c['redis']:.0f} Redis trips" + ("" if c["ok"] else "  WARNING: not one run+message")
        )
    for m in results.measurements:
        if not m["ok"]:
            print(f"  WARNING ({m['key']}): {m['problem']} - the numbers above are not valid")
    print_load(results.machine)


def cron_ticks(rounds: int) -> dict[str, Any]:
    from kumiko_jobs.definition.registry import registry

    definition = cron_definition()
    counted: dict[str, int] = {}
    with registry.override(definition):
        first = measure_cron_tick(definition, functools.partial(counting_into, counted))
        timed = [measure_cron_tick(definition) for _ in range(max(rounds, 3))]
    return {
        "seconds": statistics.median(t["seconds"] for t in timed),
        "rounds": len(timed),
        "sql": counted.get("sql", 0),
        "redis": counted.get("redis", 0),
        "ok": first["ok"] and all(t["ok"] for t in timed),
    }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = common.parser(
        "python -m bench.fanout", __doc__, database=BENCH_DATABASE, redis_db=BENCH_REDIS_DB
    )
    parser.add_argument("--tenants", type=int, default=1000, help="tenants to fan out to (1000)")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds, medians (3)")
    parser.add_argument(
        "--tenant-concurrency",
        type=int,
        default=None,
        metavar="N",
        help="set KUMIKO_JOBS['TENANT_CONCURRENCY']=N for both ways (off)",
    )
    parser.add_argument(
        "--no-singles", action="store_true", help="skip the loop of single enqueues (slow)"
    )
    parser.add_argument(
        "--chunk-size",
        type=int,
        default=None,
        metavar="N",
        help="set KUMIKO_JOBS['FANOUT_CHUNK_SIZE']=N (the setting's default)",
    )
    parser.add_argument(
        "--cron", action="store_true", help="also time a per-tenant cron tick (scheduler side)"
    )
    args = parser.parse_args(argv)
    if args.tenants < 1 or args.rounds < 1:
        parser.error("--tenants and --rounds must be >= 1")
    if args.tenant_concurrency is not None and args.tenant_concurrency < 1:
        parser.error("--tenant-concurrency must be >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    sys.path.insert(0, str(ROOT))
    admin_url = prepare_environment(args.database, args.redis_db)
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    from django.conf import settings
    from django.test import override_settings

    kumiko = dict(getattr(settings, "KUMIKO_JOBS", {}))
    if args.tenant_concurrency:
        kumiko["TENANT_CONCURRENCY"] = args.tenant_concurrency
    if args.chunk_size:
        kumiko["FANOUT_CHUNK_SIZE"] = args.chunk_size
    keys = ["fanout"] if args.no_singles else list(MEASURES)
    try:
        with override_settings(KUMIKO_JOBS=kumiko):
            print(f"creating {args.tenants} tenant rows (bulk_create, no schemas) ...", flush=True)
            tenants = create_schemaless_tenants(args.tenants)
            results = Results(
                tenants=len(tenants),
                rounds=args.rounds,
                tenant_concurrency=args.tenant_concurrency,
                started_at=stamp,
                machine=machine_facts(),
                note="tenants are rows without schemas; only the enqueue side is measured",
            )
            print("warm-up, counting SQL statements and Redis round trips ...", flush=True)
            from kumiko_jobs.core import conf

            results.chunk_size = conf.get().FANOUT_CHUNK_SIZE
            results.round_trips = round_trips(tenants, keys)
            print("peak memory of the parent run (tracemalloc) ...", flush=True)
            memory: dict[str, int] = {}
            measure_fanout(tenants, functools.partial(peak_memory, memory))
            results.fanout_peak_bytes = memory["peak_bytes"]
            if args.cron:
                results.cron = cron_ticks(args.rounds)
            measurements = []
            for round_ in range(1, args.rounds + 1):
                for label, measure in (MEASURES[key] for key in keys):
                    m = measure(tenants)
                    measurements.append(m)
                    print(
                        f"round {round_}: {label}: {m.seconds:.3f} s, {m.rate:.0f} messages/s"
                        + ("" if m.ok else f"  WARNING: {m.problem}"),
                        flush=True,
                    )
            results.measurements = [{**asdict(m), "rate": m.rate} for m in measurements]
            results.summary = summarize(measurements)
            print_report(results)
        if args.json:
            write_results("fanout", stamp, asdict(results))
    finally:
        clean_up(admin_url, args.database, keep_database=args.keep_database)
    return 0


if __name__ == "__main__":
    sys.exit(main())
