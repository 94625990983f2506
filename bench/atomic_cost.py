"""What ``@job(atomic=True)`` costs per run: PostgreSQL and Redis round trips, counted.

    python -m bench.atomic_cost [--jobs 200] [--tenants 4] [--db-roles on|off]

Drains ``--jobs`` runs of ``bench_write`` and as many of ``bench_write_atomic`` (the same one
``INSERT``, declared ``atomic=True``) with one in-process kumiko worker, and counts, per run:

* **PostgreSQL queries**: every query psycopg sends on any connection of this process (the
  project's and, with ``DB_ROLES``, the tenant logins'), including the ``BEGIN`` and ``COMMIT``
  psycopg sends itself and django-tenants' ``SET search_path``; each is one round trip;
* **commits** among them (``COMMIT`` sent by psycopg, or ending a query as an atomic run's
  success sends it; statements in autocommit commit on their own and are counted under queries
  only);
* **waited**: the queries whose reply the worker waited for before going on (all of them but
  a tenant login's session reset, which ``core.session.send_discard`` sends without waiting and
  reads after the run's finish);
* **Redis round trips** (a pipeline counts once).

Counts, not timings: they do not depend on the machine's load. Runs psycopg's pure-Python
implementation (``PSYCOPG_IMPL=python``), whose connection methods can be counted; set before
psycopg is imported. Uses the soak's database (``kumiko_soak``, created and dropped) and a
Redis server of its own.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

os.environ["PSYCOPG_IMPL"] = "python"

SEND_METHODS = ("exec_", "exec_params", "exec_prepared", "send_query", "send_query_params")
SEND_METHODS += ("send_query_prepared", "send_prepare")


@contextmanager
def counting(statements: list[str] | None = None) -> Iterator[dict[str, int]]:
    """Counts of what this process sends; with ``statements``, each PostgreSQL query's text
    (its first 200 characters) is appended to it as well."""
    from psycopg.pq import pq_ctypes
    from redis.client import Pipeline, Redis

    from kumiko_jobs.core import session

    counts = {"pg_queries": 0, "pg_commits": 0, "pg_begins": 0, "redis": 0, "pg_unwaited": 0}

    def pg(original: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(self: Any, command: Any, *args: Any, **kwargs: Any) -> Any:
            counts["pg_queries"] += 1
            text = bytes(command).strip().upper() if isinstance(command, bytes | bytearray) else b""
            counts["pg_commits"] += text == b"COMMIT" or text.endswith(b"; COMMIT")
            counts["pg_begins"] += text.startswith(b"BEGIN")
            if statements is not None:
                shown = bytes(command) if isinstance(command, bytes | bytearray) else command
                statements.append(" ".join(str(shown, "utf-8", "replace").split())[:200])
            return original(self, command, *args, **kwargs)

        return wrapper

    def redis(original: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            counts["redis"] += 1
            return original(*args, **kwargs)

        return wrapper

    patches: list[tuple[Any, str, Any]] = [
        (pq_ctypes.PGconn, name, pg) for name in SEND_METHODS if hasattr(pq_ctypes.PGconn, name)
    ]
    patches += [(Redis, "execute_command", redis), (Pipeline, "execute", redis)]

    def unwaited(original: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            counts["pg_unwaited"] += 1
            return original(*args, **kwargs)

        return wrapper

    if hasattr(session, "send_reset"):  # not before the reset was sent without waiting
        patches.append((session, "send_reset", unwaited))
    originals = [(cls, name, cls.__dict__[name]) for cls, name, _ in patches]
    for cls, name, wrap in patches:
        setattr(cls, name, wrap(cls.__dict__[name]))
    try:
        yield counts
    finally:
        for cls, name, original in originals:
            setattr(cls, name, original)


def per_run(
    job: Any, tenants: Sequence[Any], jobs: int, statements: list[str] | None = None
) -> dict[str, float]:
    from bench.throughput import QUEUE, drain, reset, succeeded_runs, written_rows
    from kumiko_jobs import transport
    from kumiko_jobs.worker import Worker

    reset(tenants)
    for n in range(jobs):
        job.enqueue(tenant=tenants[n % len(tenants)], n=n)
    queue = transport.get_queue(QUEUE)
    drain(Worker, queue)  # warm: connections, role logins, caches (not counted)
    reset(tenants)
    for n in range(jobs):
        job.enqueue(tenant=tenants[n % len(tenants)], n=n)
    with counting(statements) as counts:
        drain(Worker, queue)
    if succeeded_runs() != jobs or written_rows(tenants) != jobs:
        raise SystemExit(f"{job.name}: expected {jobs} succeeded runs and rows")
    return {key: value / jobs for key, value in counts.items()}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.atomic_cost", description=__doc__)
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--tenants", type=int, default=4)
    parser.add_argument("--db-roles", choices=("on", "off"), default="on")
    parser.add_argument("--database", default="kumiko_soak")
    parser.add_argument(
        "--show", action="store_true", help="also print the statements of one run of each job"
    )
    args = parser.parse_args(argv)
    from bench.soak import OwnRedis

    redis = OwnRedis().start()
    os.environ["REDIS_URL"] = redis.url()
    from bench.throughput import create_tenants, drop_database, prepare_environment

    admin_url = prepare_environment(args.database, 0)
    try:
        from django.conf import settings
        from django.test import override_settings

        override_settings(
            KUMIKO_JOBS={**settings.KUMIKO_JOBS, "DB_ROLES": args.db_roles == "on"}
        ).enable()
        from example_project.billing.jobs import bench_write, bench_write_atomic

        tenants = create_tenants(args.tenants)
        rows = [(j.name, per_run(j, tenants, args.jobs)) for j in (bench_write, bench_write_atomic)]
        print(f"\nper run, {args.jobs} runs, {args.tenants} tenants, DB_ROLES {args.db_roles}")
        print(f"  {'job':<34}{'PG queries':>11}{'waited':>8}{'BEGIN':>7}{'COMMIT':>8}{'Redis':>7}")
        for name, c in rows:
            waited = c["pg_queries"] - c["pg_unwaited"]
            print(
                f"  {name:<34}{c['pg_queries']:>11.2f}{waited:>8.2f}{c['pg_begins']:>7.2f}"
                f"{c['pg_commits']:>8.2f}{c['redis']:>7.2f}"
            )
        if args.show:
            for job in (bench_write, bench_write_atomic):
                statements: list[str] = []
                per_run(job, tenants[:1], 1, statements)
                print(f"\nthe PostgreSQL queries of one run of {job.name}:")
                for text in statements:
                    print(f"  {text}")
        return 0
    finally:
        from django.db import connections

        connections.close_all()
        drop_database(admin_url, args.database)
        redis.close()


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.exit(main())
