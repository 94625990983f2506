"""Overhead of the DB guard on the statements a job sends: 1-row ORM selects and inserts.

One run, on the real PostgreSQL, in a database of its own (created, then dropped) with one
tenant. The same loops run in that tenant:

* ``off``: no execute wrapper, as with ``DB_GUARD = "off"``;
* ``guard``: ``kumiko_jobs.guard.wrapper.GuardWrapper`` on ``connection.execute_wrapper`` for
  every alias, exactly as the ``db_guard`` step installs it for a job body (enforce mode, no
  grant open), so every statement, including django-tenants' own ``SET search_path``, is
  classified.

Each round times ``--ops`` selects (``ActivityLog.objects.get(pk=...)``) and ``--ops`` inserts
(``ActivityLog.objects.create(...)``, autocommit, as a job without ``atomic()`` runs) per mode,
after a warm-up, in blocks of ``--block`` ops that alternate between the modes (ABBA), so that
load from anything else on the machine hits both alike; a round's figure is the median block.
The overhead (target <= 5 %) is the median over ``--rounds`` rounds of each round's median
paired-block ratio; also reported: the process CPU time the guard adds per operation (the
guard is pure client-side CPU, so this is the least noisy estimate on a busy machine) and the
cost of one guard call on its own (a no-op ``execute``).

    python -m bench.guard [--ops 5000] [--rounds 5] [--warmup 500] [--block 100] [--atomic]
                          [--json]
    python -m bench.guard --classify-only     # the pure classifier alone, no database

The classifier alone (``guard.classify``, also printed by the full run): microseconds per call
on a cache hit (the same ORM statement again, as a job loop sends it) and on a cache miss (a
distinct statement text each call, so the parse tree is built and walked every time).

A benchmark, not a test: it asserts nothing about speed, but it does check that the guard is
really in place (a cross-tenant select is refused) and that every insert landed.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
BENCH_DATABASE = "kumiko_bench_guard"
TENANT = "guardbench"
TARGET_OVERHEAD = 0.05


def _with_path(url: str, path: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, parts.fragment))


def prepare_environment() -> str:
    """Services up, a fresh bench database, Django loaded. Returns the admin database URL."""
    sys.path.insert(0, str(ROOT))
    from example_project.devservices import DEFAULT_DATABASE_URL, ensure_database, ensure_services

    base = os.environ.get("DATABASE_URL") or DEFAULT_DATABASE_URL
    os.environ["DATABASE_URL"] = _with_path(base, f"/{BENCH_DATABASE}")
    os.environ["KUMIKO_EXAMPLE_DEBUG"] = "0"  # DEBUG keeps every query in memory
    os.environ.setdefault("KUMIKO_LOG", "CRITICAL")
    ensure_services(verbose=False, create_database=False)
    admin_url = _with_path(os.environ["DATABASE_URL"], "/postgres")
    drop_database(admin_url)
    ensure_database(os.environ["DATABASE_URL"])
    os.environ["DJANGO_SETTINGS_MODULE"] = "example_project.settings"
    import django

    django.setup()
    return admin_url


def drop_database(admin_url: str) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(BENCH_DATABASE)
            )
        )


def create_tenant() -> Any:
    from django.core.management import call_command

    from example_project.customers.models import Client

    call_command("migrate_schemas", shared=True, interactive=False, verbosity=0)
    Client.objects.get_or_create(schema_name="public", defaults={"name": "Operator"})
    tenant = Client(schema_name=TENANT, name="Guard bench")
    tenant.save(verbosity=0)
    return tenant


def guard_state(tenant: Any) -> Any:
    """The RunState the db_guard step would hold for a tenant run of ``billing.bench_write``."""
    from kumiko_jobs.core.envelope import Envelope, new_run_id
    from kumiko_jobs.definition.registry import registry
    from kumiko_jobs.run.state import RunState

    definition = registry.get("billing.bench_write")
    envelope = Envelope(
        job=definition.name, schema=tenant.schema_name, kwargs={"n": 0}, run_id=new_run_id()
    )
    return RunState.new(envelope, definition, tenant=tenant)


def guard_wrapper(state: Any) -> Any:
    """The ``GuardWrapper`` the db_guard step installs for ``state``'s body (enforce mode)."""
    from kumiko_jobs.guard.wrapper import GuardWrapper
    from kumiko_jobs.history import audit

    report = functools.partial(audit.record_use, state)
    return GuardWrapper(state.watch, enforce=True, report_use=report)


@contextlib.contextmanager
def guarded(state: Any) -> Iterator[Any]:
    """What ``kumiko_jobs.run.steps.db_guard.db_guard`` does around a job body."""
    from django.db import connections

    wrapper = guard_wrapper(state)
    with contextlib.ExitStack() as stack:
        for conn in connections.all():
            stack.enter_context(conn.execute_wrapper(wrapper))
        yield wrapper


def timed(operation: Callable[[int], None], count: int) -> tuple[float, float]:
    """Wall-clock and process-CPU microseconds per call of ``operation(i)``, i < count."""
    wall, cpu = time.perf_counter(), time.process_time()
    for i in range(count):
        operation(i)
    return (
        (time.perf_counter() - wall) / count * 1e6,
        (time.process_time() - cpu) / count * 1e6,
    )


def run_round(state: Any, ops: int, warmup: int, block: int, atomic: bool) -> dict[str, Any]:
    """One round: per operation, blocks of ``block`` ops alternating off/guard (ABBA).

    Returns, per operation, the median wall and CPU µs/op of each mode's blocks and the median
    of the paired ratios (each guard block against the off block next to it in time), which is
    what a load spike from anything else on the machine disturbs least.
    """
    from django.db import transaction

    from example_project.billing.models import ActivityLog

    pk = ActivityLog.objects.create(job="bench", message="anchor").pk

    def select(i: int) -> None:
        ActivityLog.objects.get(pk=pk)

    def insert(i: int) -> None:
        ActivityLog.objects.create(job="bench", message=f"write {i}")

    def in_mode(mode: str, operation: Callable[[int], None], count: int) -> tuple[float, float]:
        with contextlib.ExitStack() as stack:
            if mode == "guard":
                stack.enter_context(guarded(state))
            if atomic:
                stack.enter_context(transaction.atomic())
            return timed(operation, count)

    result: dict[str, Any] = {}
    for name, operation in (("select", select), ("insert", insert)):
        for mode in ("off", "guard"):
            in_mode(mode, operation, warmup)
        pairs: list[dict[str, tuple[float, float]]] = []
        for number in range(ops // block):
            order = ("off", "guard") if number % 2 == 0 else ("guard", "off")
            pairs.append({mode: in_mode(mode, operation, block) for mode in order})
        result[name] = {
            "off_us": statistics.median(p["off"][0] for p in pairs),
            "guard_us": statistics.median(p["guard"][0] for p in pairs),
            "off_cpu_us": statistics.median(p["off"][1] for p in pairs),
            "guard_cpu_us": statistics.median(p["guard"][1] for p in pairs),
            "paired_overhead": statistics.median(p["guard"][0] / p["off"][0] - 1 for p in pairs),
        }
    return result


def guard_call_cost(state: Any, count: int) -> float:
    """Microseconds of one GuardWrapper call on an ORM select, with a no-op execute."""
    from django.db import connection

    from example_project.billing.models import ActivityLog

    wrapper = guard_wrapper(state)
    query = ActivityLog.objects.filter(pk=1).query
    sql, params = query.get_compiler(connection.alias).as_sql()
    context = {"connection": connection, "cursor": None}

    def noop(sql: str, params: Any, many: bool, context: Any) -> None:
        return None

    return timed(lambda i: wrapper(noop, sql, params, False, context), count)[0]


# Statements as the ORM sends them; "{n}" makes each text of the miss loop distinct (a
# constant in the statement), so that no call there hits the cache.
CLASSIFY_SAMPLES = (
    'SELECT "billing_activitylog"."id", "billing_activitylog"."job", '
    '"billing_activitylog"."message", "billing_activitylog"."created_at" '
    'FROM "billing_activitylog" WHERE "billing_activitylog"."id" = %s LIMIT {n}',
    'INSERT INTO "billing_activitylog" ("job", "message", "created_at") VALUES (%s, {n}, %s) '
    'RETURNING "billing_activitylog"."id"',
    'SELECT "billing_invoice"."id", "billing_customer"."name" FROM "billing_invoice" '
    'INNER JOIN "billing_customer" ON ("billing_invoice"."customer_id" = "billing_customer"."id")'
    ' WHERE ("billing_invoice"."amount" > {n} AND "billing_customer"."email" IN (%s, %s))',
)


def classify_cost(count: int) -> dict[str, float]:
    """Microseconds per ``guard.classify`` call: cache hit and cache miss (distinct texts)."""
    from kumiko_jobs import guard

    policy = guard.Policy(schema="t1", shared_tables=frozenset({"kumiko_jobs_jobrun"}))
    hit_sql = CLASSIFY_SAMPLES[0].format(n=21)
    assert guard.classify(hit_sql, policy).allowed
    start = time.perf_counter()
    for _ in range(count):
        guard.classify(hit_sql, policy)
    hit = (time.perf_counter() - start) / count * 1e6
    texts = [CLASSIFY_SAMPLES[i % 3].format(n=i + 1) for i in range(count)]
    assert all(guard.classify(text, policy).allowed for text in texts[:3])
    guard.statement_shape.cache_clear()
    start = time.perf_counter()
    for text in texts:
        guard.classify(text, policy)
    miss = (time.perf_counter() - start) / count * 1e6
    return {"cache_hit_us": round(hit, 2), "cache_miss_us": round(miss, 2)}


def check_guard_is_live(state: Any) -> None:
    """A fast wrong answer is not a number: the installed wrapper must refuse a crossing."""
    from django.db import connection

    from kumiko_jobs.core.exceptions import DatabaseAccessDenied

    with guarded(state), connection.cursor() as cursor:
        try:
            cursor.execute("SELECT * FROM public.kumiko_jobs_jobrun, other_tenant.t")
        except DatabaseAccessDenied:
            return
    raise SystemExit("the guard did not refuse a cross-schema select: not measuring")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", type=int, default=5000, help="selects and inserts per mode")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=500)
    parser.add_argument("--block", type=int, default=100, help="ops per interleaved block")
    parser.add_argument("--atomic", action="store_true", help="each mode in one transaction")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument(
        "--classify-only", action="store_true", help="only the pure classifier, no database"
    )
    args = parser.parse_args(argv)
    if args.classify_only:
        sys.path.insert(0, str(ROOT))
        costs = [classify_cost(4000) for _ in range(5)]
        result = {key: statistics.median(c[key] for c in costs) for key in costs[0]}
        print(
            json.dumps(result)
            if args.json
            else (
                f"guard.classify: cache hit {result['cache_hit_us']:.2f} µs/call, "
                f"cache miss {result['cache_miss_us']:.2f} µs/call (median of 5 x 4000 calls)"
            )
        )
        return 0

    admin_url = prepare_environment()
    try:
        from django.db import connection
        from django_tenants.utils import tenant_context

        tenant = create_tenant()
        state = guard_state(tenant)
        rounds: list[dict[str, Any]] = []
        with tenant_context(tenant):
            check_guard_is_live(state)
            for number in range(args.rounds):
                rounds.append(run_round(state, args.ops, args.warmup, args.block, args.atomic))
                print(f"round {number + 1}: {rounds[-1]}", file=sys.stderr)
            from example_project.billing.models import ActivityLog

            per_mode = args.warmup + args.ops // args.block * args.block
            expected = args.rounds * (2 * per_mode + 1)  # + one anchor a round
            written = ActivityLog.objects.count()
            if written != expected:
                raise SystemExit(f"expected {expected} inserted rows, found {written}")
            call_us = guard_call_cost(state, 20000)
            costs = classify_cost(4000)
        connection.close()
    finally:
        drop_database(admin_url)

    summary: dict[str, Any] = {
        "ops": args.ops,
        "rounds": args.rounds,
        "atomic": args.atomic,
        "block": args.block,
        "python": platform.python_version(),
        "guard_call_us": round(call_us, 2),
        **costs,
    }
    for op in ("select", "insert"):
        off = statistics.median(r[op]["off_us"] for r in rounds)
        on = statistics.median(r[op]["guard_us"] for r in rounds)
        cpu_added = statistics.median(r[op]["guard_cpu_us"] - r[op]["off_cpu_us"] for r in rounds)
        per_round = [r[op]["paired_overhead"] * 100 for r in rounds]
        summary[op] = {
            "off_us": round(off, 1),
            "guard_us": round(on, 1),
            "overhead_pct": round(statistics.median(per_round), 2),
            "overhead_pct_per_round": [round(p, 2) for p in per_round],
            "guard_cpu_added_us": round(cpu_added, 1),
            "cpu_overhead_pct": round(cpu_added / off * 100, 2),
        }
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    mode = "one transaction per block" if args.atomic else "autocommit"
    print(
        f"DB guard overhead: {args.rounds} rounds x {args.ops} ops per mode and operation "
        f"(blocks of {args.block}, interleaved), {mode}"
    )
    print(
        f"{'':8} {'off µs/op':>10} {'guard µs/op':>12} {'overhead':>9} {'CPU added':>10}"
        f" {'(% of op)':>9}   overhead per round"
    )
    for op in ("select", "insert"):
        row = summary[op]
        rounds_text = " ".join(f"{p:+.1f}%" for p in row["overhead_pct_per_round"])
        print(
            f"{op:8} {row['off_us']:>10.1f} {row['guard_us']:>12.1f} "
            f"{row['overhead_pct']:>+8.2f}% {row['guard_cpu_added_us']:>8.1f}µs"
            f" {row['cpu_overhead_pct']:>+8.2f}%   {rounds_text}"
        )
    print(
        "overhead: median over rounds of the median paired-block ratio (guard/off - 1); "
        "CPU added: guard - off process time per op"
    )
    print(f"one guard call on an ORM select (no-op execute): {call_us:.2f} µs")
    print(
        f"guard.classify alone: cache hit {costs['cache_hit_us']:.2f} µs, "
        f"cache miss (distinct texts) {costs['cache_miss_us']:.2f} µs"
    )
    worst = max(summary[op]["overhead_pct"] for op in ("select", "insert"))
    verdict = "within" if worst <= TARGET_OVERHEAD * 100 else "ABOVE"
    print(f"target <= {TARGET_OVERHEAD:.0%}: {verdict} (worst {worst:+.2f}%)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
