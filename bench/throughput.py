"""Throughput of one worker: plain django-rq against kumiko_jobs' full pipeline.

One run measures, on the same machine, services and data:

(a) plain django-rq: ``django_rq.get_queue().enqueue(plain_write, schema, n)`` drained by RQ's
    ``SimpleWorker``; the function enters the tenant with ``schema_context`` and writes one row;
(b) the same write as the kumiko job ``billing.bench_write``, enqueued with
    ``bench_write.enqueue(tenant=..., n=...)`` and drained by ``kumiko_jobs.worker.Worker``
    (records, retries, gates, tenancy, DB guard, tracing: whatever ``DEFAULT_STEPS`` holds);
(c) the kumiko job drained by ``kumiko_jobs.worker.ForkingWorker`` (one fork per job).

Each worker runs in this process in burst mode, after a warm-up, and only its drain is timed;
enqueueing is timed separately (plain ``queue.enqueue`` against ``job.enqueue``, the latter
also inside ``transaction.atomic()`` as in a request). Everything happens in a database of its
own (created, then dropped) and Redis database 2 (flushed), so nothing else is disturbed.

    python -m bench.throughput [--jobs 2000] [--tenants 4] [--rounds 1] [--json] [--profile]
                               [--db-roles on|off] [--db-role-pool-size N]

With ``DB_ROLES`` on (the example project's setting) the tenant job bodies log in as their
tenant's role; each round line also says how many tenant-role connections the in-process
worker opened while draining (the forking worker opens them in its work horses, unseen here).

A benchmark, not a test: it asserts nothing about speed. It does check that every job did
its write (and every kumiko run succeeded), since a fast wrong answer is not a number.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import platform
import pstats
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = Path(__file__).resolve().parent / "results"
BENCH_DATABASE = "kumiko_bench"
BENCH_REDIS_DB = 2
QUEUE = "default"
TARGET_B_OVER_A = 0.75  # issue 2, once run records exist
TARGET_ENQUEUE = 0.7  # issue 7, enqueue with the transactional outbox


# --------------------------------------------------------------------------- environment


def _with_path(url: str, path: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, parts.fragment))


def prepare_environment(database: str, redis_db: int) -> str:
    """Services up, bench database fresh, Django loaded. Returns the admin database URL."""
    from example_project.devservices import (
        DEFAULT_DATABASE_URL,
        DEFAULT_REDIS_URL,
        ensure_database,
        ensure_services,
    )

    base_db = os.environ.get("DATABASE_URL") or DEFAULT_DATABASE_URL
    base_redis = os.environ.get("REDIS_URL") or DEFAULT_REDIS_URL
    os.environ["DATABASE_URL"] = _with_path(base_db, f"/{database}")
    os.environ["REDIS_URL"] = _with_path(base_redis, f"/{redis_db}")
    # DEBUG keeps every query in memory and would tax the pipeline that makes more of them.
    os.environ["KUMIKO_EXAMPLE_DEBUG"] = "0"
    os.environ.setdefault("KUMIKO_LOG", "CRITICAL")
    os.environ.setdefault("RQ_LOG", "ERROR")
    ensure_services(verbose=True, create_database=False)
    admin_url = _with_path(os.environ["DATABASE_URL"], "/postgres")
    drop_database(admin_url, database)  # a leftover of an interrupted run is not a fresh start
    ensure_database(os.environ["DATABASE_URL"])
    os.environ["DJANGO_SETTINGS_MODULE"] = "example_project.settings"
    import django

    django.setup()
    return admin_url


def drop_database(admin_url: str, database: str) -> None:
    import psycopg
    from psycopg import sql

    from kumiko_jobs.guard.roles import names as role_names

    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(database))
        )
        # Its tenant roles (DB_ROLES) are cluster-wide: they go with it.
        role_names.drop_roles_of_dropped_database(conn.cursor(), database)


def print_load(machine: dict[str, Any]) -> None:
    """The closing line of every benchmark: how busy the machine was (numbers are noisy)."""
    load = os.getloadavg() if hasattr(os, "getloadavg") else (0.0, 0.0, 0.0)
    print(
        f"  load average {machine['loadavg_at_start'][0]:.2f} at start, "
        f"{load[0]:.2f} at end, {machine['cpus']} CPUs"
    )


def write_results(name: str, stamp: str, data: dict[str, Any]) -> None:
    RESULTS_DIR.mkdir(exist_ok=True)
    path = RESULTS_DIR / f"{name}-{stamp}.json"
    path.write_text(json.dumps(data, indent=2) + "\n")
    print(f"\nwrote {path.relative_to(ROOT)}")


def clean_up(admin_url: str, database: str, *, keep_database: bool) -> None:
    """Empty the bench's own Redis database, close connections, drop its database."""
    from django.db import connections

    from kumiko_jobs import transport

    transport.connection_for(QUEUE).flushdb()  # the bench's own Redis database
    connections.close_all()
    if not keep_database:
        drop_database(admin_url, database)


def create_tenants(count: int) -> list[Any]:
    from django.core.management import call_command

    from example_project.customers.models import Client

    call_command("migrate_schemas", shared=True, interactive=False, verbosity=0)
    Client.objects.get_or_create(schema_name="public", defaults={"name": "Operator"})
    tenants = []
    for i in range(1, count + 1):
        tenant = Client(schema_name=f"bench{i}", name=f"Bench {i}")
        tenant.save(verbosity=0)
        tenants.append(tenant)
    return tenants


def reset(tenants: Sequence[Any]) -> None:
    """Empty the written tables, kumiko's history and the bench's Redis database."""
    from django.apps import apps
    from django.db import connection

    from kumiko_jobs import transport

    tables = [
        connection.ops.quote_name(m._meta.db_table)
        for m in apps.get_app_config("kumiko_jobs").get_models()
    ]
    tables += [f'"{t.schema_name}".billing_activitylog' for t in tenants]
    connection.set_schema_to_public()  # type: ignore[attr-defined]  # django-tenants adds it
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {', '.join(tables)}")
    # The bench owns this Redis database (see prepare_environment).
    transport.connection_for(QUEUE).flushdb()


def written_rows(tenants: Sequence[Any]) -> int:
    from django.db import connection

    connection.set_schema_to_public()  # type: ignore[attr-defined]  # django-tenants adds it
    counts = " + ".join(
        f'(SELECT count(*) FROM "{t.schema_name}".billing_activitylog)' for t in tenants
    )
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {counts}")
        row = cursor.fetchone()
    return int(row[0]) if row else 0


def succeeded_runs() -> int:
    from kumiko_jobs.models import JobRun, RunStatus

    return JobRun.objects.filter(status=RunStatus.SUCCEEDED).count()


def first_failure() -> str:
    """The error of one run that did not succeed: a wrong answer should say why."""
    from kumiko_jobs.models import JobRun, RunStatus

    run = JobRun.objects.exclude(status=RunStatus.SUCCEEDED).order_by("queued_at").first()
    return f"{run.status} {run.error_type}: {run.error_message[:300]}" if run else ""


# --------------------------------------------------------------------------- enqueueing


def plain_queue() -> Any:
    import django_rq

    return django_rq.get_queue(QUEUE)


def kumiko_queue() -> Any:
    from kumiko_jobs import transport

    return transport.get_queue(QUEUE)


def enqueue_plain(tenants: Sequence[Any], count: int) -> float:
    """``django_rq.get_queue().enqueue(...)`` per job, as a view would write it."""
    import django_rq

    from bench.workloads import plain_write

    schemas = [t.schema_name for t in tenants]
    started = time.perf_counter()
    for n in range(count):
        django_rq.get_queue(QUEUE).enqueue(plain_write, schemas[n % len(schemas)], n)
    return time.perf_counter() - started


def enqueue_plain_reused(tenants: Sequence[Any], count: int) -> float:
    """One queue object for all jobs: django-rq's best case (get_queue makes a new client)."""
    from bench.workloads import plain_write

    queue = plain_queue()
    schemas = [t.schema_name for t in tenants]
    started = time.perf_counter()
    for n in range(count):
        queue.enqueue(plain_write, schemas[n % len(schemas)], n)
    return time.perf_counter() - started


def enqueue_kumiko(tenants: Sequence[Any], count: int) -> float:
    """``job.enqueue(tenant=..., ...)`` outside a transaction: pushed at once."""
    from example_project.billing.jobs import bench_write

    started = time.perf_counter()
    for n in range(count):
        bench_write.enqueue(tenant=tenants[n % len(tenants)], n=n)
    return time.perf_counter() - started


def enqueue_kumiko_atomic(tenants: Sequence[Any], count: int) -> float:
    """One transaction per enqueue, like a request with ATOMIC_REQUESTS: pushed on commit."""
    from django.db import transaction

    from example_project.billing.jobs import bench_write

    started = time.perf_counter()
    for n in range(count):
        with transaction.atomic():
            bench_write.enqueue(tenant=tenants[n % len(tenants)], n=n)
    return time.perf_counter() - started


def enqueue_kumiko_atomic_job(tenants: Sequence[Any], count: int) -> float:
    """``job.enqueue()`` of ``bench_write_atomic`` (the same write, ``@job(atomic=True)``)."""
    from example_project.billing.jobs import bench_write_atomic

    started = time.perf_counter()
    for n in range(count):
        bench_write_atomic.enqueue(tenant=tenants[n % len(tenants)], n=n)
    return time.perf_counter() - started


Enqueue = Callable[[Sequence[Any], int], float]
# key -> (label, function); every round times each of them over --jobs jobs.
ENQUEUES: dict[str, tuple[str, Enqueue]] = {
    "plain": ("django_rq.get_queue().enqueue()", enqueue_plain),
    "plain_reused": ("queue.enqueue(), queue reused", enqueue_plain_reused),
    "kumiko": ("job.enqueue()", enqueue_kumiko),
    "kumiko_atomic": ("job.enqueue() in atomic()", enqueue_kumiko_atomic),
    "kumiko_atomic_job": ("job.enqueue(), atomic=True job", enqueue_kumiko_atomic_job),
}


# --------------------------------------------------------------------------- draining


def drain(worker_class: type, queue: Any) -> float:
    # The queue's own serializer, as `manage.py rqworker` passes it from RQ_QUEUES: the
    # example's queues are JSON (no pickle in any process), and RQ's worker would otherwise
    # unpickle JSON messages.
    ended: list[float] = []

    class Timed(worker_class):  # type: ignore[misc]
        # The drain ends when the worker finds the queue empty, before its teardown: with
        # redis-py 8.2, RQ's own teardown can wait up to 60 s on its pub/sub thread (a lost
        # race; kumiko's worker bases avoid it, transport/rq_worker.py), which is no part of
        # draining and would make plain RQ look slower than it is.
        def teardown(self) -> None:
            ended.append(time.perf_counter())
            super().teardown()

    worker = Timed([queue], connection=queue.connection, serializer=queue.serializer)
    started = time.perf_counter()
    worker.work(burst=True, logging_level="WARNING")
    return (ended[0] if ended else time.perf_counter()) - started


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _backend_cpu_seconds() -> float | None:
    """CPU time (user + system) of this database's client backends so far, read from ``/proc``.

    Only when PostgreSQL runs on this machine and its processes are readable (the bench's
    user is root, or postgres): otherwise None. Counts the backends of every connection to
    the bench database, the tenant roles' included; a backend that exits during a drain (a
    tenant connection evicted from the pool) takes its CPU with it.
    """
    from django.db import connection

    connection.set_schema_to_public()  # type: ignore[attr-defined]  # django-tenants adds it
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND backend_type = 'client backend'"
        )
        pids = [row[0] for row in cursor.fetchall()]
    total = 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            return None
        total += (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS  # utime, stime
    return total


def redis_cpu_seconds(redis: Any) -> float:
    """The Redis server's CPU time so far (user + system, ``INFO cpu``): the whole server's,
    so only a figure of this bench while nothing else uses that server (a quiet machine)."""
    cpu = redis.info("cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


@dataclass(frozen=True)
class Drained:
    seconds: float  # wall clock
    worker_cpu: float  # this process's CPU time (user + system, all threads)
    database_cpu: float | None  # PostgreSQL's client backends' CPU time, None: not readable
    redis_cpu: float = 0.0  # the Redis server's CPU time (all its clients', see above)


def drain_measured(worker_class: type, queue: Any) -> Drained:
    """``drain``, with the CPU time the worker process and PostgreSQL spent on it.

    CPU time per job moves far less with the machine's load than the wall clock does: on a
    shared machine it tells a cut in work from a quieter minute. Redis's CPU is reported beside
    them but not in ``cpu_ms_per_job``: its server is shared by every user of the machine.
    """
    database_before = _backend_cpu_seconds()
    redis_before = redis_cpu_seconds(queue.connection)
    cpu_before = time.process_time()
    seconds = drain(worker_class, queue)
    worker_cpu = time.process_time() - cpu_before
    redis_cpu = redis_cpu_seconds(queue.connection) - redis_before
    database_after = _backend_cpu_seconds()
    database_cpu = (
        database_after - database_before
        if database_before is not None and database_after is not None
        else None
    )
    return Drained(seconds, worker_cpu, database_cpu, redis_cpu)


def _rq_simple_worker() -> type:
    from rq import SimpleWorker

    return SimpleWorker


def _kumiko_worker() -> type:
    from kumiko_jobs.worker import Worker

    return Worker


def _kumiko_forking_worker() -> type:
    from kumiko_jobs.worker import ForkingWorker

    return ForkingWorker


@dataclass(frozen=True)
class Variant:
    key: str
    label: str
    enqueue: str  # a key of ENQUEUES: the enqueue timed while filling this variant's queue
    queue: Callable[[], Any]
    worker: Callable[[], type]
    kumiko: bool


VARIANTS = (
    Variant(
        "a",
        "django-rq SimpleWorker, plain function",
        "plain",
        plain_queue,
        _rq_simple_worker,
        kumiko=False,
    ),
    Variant(
        "b",
        "kumiko_jobs Worker, full pipeline",
        "kumiko",
        kumiko_queue,
        _kumiko_worker,
        kumiko=True,
    ),
    Variant(
        "c",
        "kumiko_jobs ForkingWorker, full pipeline",
        "kumiko_atomic",
        kumiko_queue,
        _kumiko_forking_worker,
        kumiko=True,
    ),
    # --atomic: (b) with the job declared atomic=True (body and success in one transaction).
    Variant(
        "d",
        "kumiko_jobs Worker, job atomic=True",
        "kumiko_atomic_job",
        kumiko_queue,
        _kumiko_worker,
        kumiko=True,
    ),
)


@dataclass
class Measurement:
    key: str  # a variant key (drain and enqueue), or an ENQUEUES key (enqueue only)
    jobs: int
    enqueue_seconds: float
    drain_seconds: float | None = None
    ok: bool = True
    problem: str = ""
    tenant_connects: int = 0  # tenant-role connections the drain opened (in-process only)
    worker_cpu_seconds: float | None = None  # the drain's CPU time in this process
    database_cpu_seconds: float | None = None  # ... and in PostgreSQL's backends
    redis_cpu_seconds: float | None = None  # ... and in the Redis server (shared: see Drained)

    @property
    def enqueue_rate(self) -> float:
        return self.jobs / self.enqueue_seconds

    @property
    def drain_rate(self) -> float | None:
        return self.jobs / self.drain_seconds if self.drain_seconds else None

    @property
    def cpu_ms_per_job(self) -> float | None:
        """Worker and PostgreSQL CPU per drained job (None: the database's was not readable)."""
        if self.worker_cpu_seconds is None or self.database_cpu_seconds is None:
            return None
        return 1000 * (self.worker_cpu_seconds + self.database_cpu_seconds) / self.jobs


def measure(variant: Variant, tenants: Sequence[Any], jobs: int, warmup: int) -> Measurement:
    worker = variant.worker()
    enqueue = ENQUEUES[variant.enqueue][1]
    reset(tenants)
    if warmup:
        # Imports, connections, plan caches and the first fork's copy-on-write all happen here.
        enqueue(tenants, warmup)
        drain(worker, variant.queue())
    reset(tenants)
    from kumiko_jobs.guard.roles import connections as tenant_connections

    enqueue_seconds = enqueue(tenants, jobs)
    connects = tenant_connections.connects()
    drained = drain_measured(worker, variant.queue())
    connects = tenant_connections.connects() - connects
    problems = []
    rows = written_rows(tenants)
    if rows != jobs:
        problems.append(f"{rows} of {jobs} writes happened")
    if variant.kumiko and (runs := succeeded_runs()) != jobs:
        problems.append(f"{runs} of {jobs} runs succeeded (first other: {first_failure()})")
    return Measurement(
        variant.key,
        jobs,
        enqueue_seconds,
        drained.seconds,
        not problems,
        "; ".join(problems),
        connects,
        drained.worker_cpu,
        drained.database_cpu,
        drained.redis_cpu,
    )


def measure_enqueue_only(key: str, tenants: Sequence[Any], jobs: int, warmup: int) -> Measurement:
    enqueue = ENQUEUES[key][1]
    reset(tenants)
    if warmup:
        enqueue(tenants, warmup)
    reset(tenants)
    seconds = enqueue(tenants, jobs)
    reset(tenants)  # nobody drains these
    return Measurement(key, jobs, seconds)


# --------------------------------------------------------------------------- profiling


@contextmanager
def counting_round_trips() -> Iterator[dict[str, int]]:
    """Count what each job costs in round trips, whatever the machine's load meanwhile.

    SQL statements through Django's cursors (``search_path`` for django-tenants' own ``SET``),
    new PostgreSQL connections, and Redis round trips (a pipeline counts once). Only this
    thread's connections are seen, so a forking worker's children are not.
    """
    from django.db import connections
    from django.db.backends.base.base import BaseDatabaseWrapper
    from redis.client import Pipeline, Redis

    counts = {"sql": 0, "search_path": 0, "db_connects": 0, "redis": 0}

    def count_sql(
        execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any
    ) -> Any:
        counts["sql"] += 1
        counts["search_path"] += sql.startswith("SET search_path")
        return execute(sql, params, many, context)

    def counted(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            counts[name] += 1
            return original(*args, **kwargs)

        return wrapper

    # Patched on the classes for the measurement only; restored below whatever happens.
    patches = [
        (BaseDatabaseWrapper, "connect", "db_connects"),
        (Redis, "execute_command", "redis"),
        (Pipeline, "execute", "redis"),
    ]
    originals = [(cls, attr, cls.__dict__[attr]) for cls, attr, _ in patches]
    for cls, attr, name in patches:
        setattr(cls, attr, counted(name, cls.__dict__[attr]))
    wrappers = [conn.execute_wrapper(count_sql) for conn in connections.all()]
    for wrapper in wrappers:
        wrapper.__enter__()
    try:
        yield counts
    finally:
        for wrapper in reversed(wrappers):
            wrapper.__exit__(None, None, None)
        for cls, attr, original in originals:
            setattr(cls, attr, original)


def profiled(name: str, run: Callable[[], Any], jobs: int, stamp: str) -> dict[str, Any]:
    """cProfile ``run`` (which handles ``jobs`` jobs); keep the .prof file and a text report."""
    profiler = cProfile.Profile()
    with counting_round_trips() as counts:
        started = time.perf_counter()
        profiler.enable()
        run()
        profiler.disable()
        seconds = time.perf_counter() - started
    RESULTS_DIR.mkdir(exist_ok=True)
    path = RESULTS_DIR / f"profile-{name}-{stamp}.prof"
    profiler.dump_stats(path)
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text)
    stats.sort_stats("tottime").print_stats(20)
    stats.sort_stats("cumulative").print_stats(40)
    return {
        "name": name,
        "jobs": jobs,
        "ms_per_job": 1000 * seconds / jobs,  # under the profiler: compare, do not quote
        "per_job": {key: value / jobs for key, value in counts.items()},
        "file": str(path.relative_to(ROOT)),
        "report": text.getvalue(),
    }


def profile_drain(variant: Variant, tenants: Sequence[Any], jobs: int, stamp: str) -> Any:
    worker_class = variant.worker()
    enqueue = ENQUEUES[variant.enqueue][1]
    reset(tenants)
    enqueue(tenants, min(jobs, 100))
    drain(worker_class, variant.queue())
    reset(tenants)
    enqueue(tenants, jobs)
    queue = variant.queue()
    # The queue's serializer, as drain() passes it: (a)'s messages are JSON, not pickle.
    worker = worker_class([queue], connection=queue.connection, serializer=queue.serializer)
    return profiled(
        f"drain-{variant.key}",
        lambda: worker.work(burst=True, logging_level="WARNING"),
        jobs,
        stamp,
    )


def profile_enqueue(key: str, tenants: Sequence[Any], jobs: int, stamp: str) -> Any:
    enqueue = ENQUEUES[key][1]
    reset(tenants)
    enqueue(tenants, min(jobs, 100))
    reset(tenants)
    try:
        return profiled(f"enqueue-{key}", lambda: enqueue(tenants, jobs), jobs, stamp)
    finally:
        reset(tenants)


# --------------------------------------------------------------------------- report


@dataclass
class Results:
    jobs: int
    tenants: int
    rounds: int
    warmup: int
    started_at: str
    machine: dict[str, Any]
    measurements: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    profiles: list[dict[str, Any]] = field(default_factory=list)


def machine_facts() -> dict[str, Any]:
    import django
    import django_rq
    import rq

    load = os.getloadavg() if hasattr(os, "getloadavg") else (0.0, 0.0, 0.0)
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "loadavg_at_start": [round(x, 2) for x in load],
        "django": django.get_version(),
        "rq": rq.__version__ if hasattr(rq, "__version__") else rq.VERSION,
        "django_rq": getattr(django_rq, "__version__", "?"),
        "database": os.environ["DATABASE_URL"].rsplit("@", 1)[-1],
        "redis": os.environ["REDIS_URL"],
    }


def summarize(measurements: Sequence[Measurement]) -> dict[str, Any]:
    """Medians per variant and enqueue kind, and the ratios of those that were measured."""

    def median(values: Iterable[float | None]) -> float | None:
        present = [v for v in values if v is not None]
        return statistics.median(present) if present else None

    def ratio(top: float | None, bottom: float | None) -> float | None:
        return top / bottom if top is not None and bottom else None

    drain = {v.key: median(m.drain_rate for m in measurements if m.key == v.key) for v in VARIANTS}
    by_enqueue = {v.key: v.enqueue for v in VARIANTS}
    enqueue = {
        key: median(
            m.enqueue_rate for m in measurements if m.key == key or by_enqueue.get(m.key) == key
        )
        for key in ENQUEUES
    }
    # Each round measures a and b back to back; pairing them cancels the machine's drift
    # between rounds, which the ratio of the medians does not.
    a_rates = [m.drain_rate for m in measurements if m.key == "a"]
    b_rates = [m.drain_rate for m in measurements if m.key == "b"]
    per_round = [ratio(b, a) for a, b in zip(a_rates, b_rates, strict=False)]
    d_rates = [m.drain_rate for m in measurements if m.key == "d"]
    d_per_round = [ratio(d, a) for a, d in zip(a_rates, d_rates, strict=False)]
    # The same pairing on CPU per job (worker and PostgreSQL): a's CPU over b's, so that it
    # reads like the throughput ratio (above 1: b costs less than a).
    a_cpu = [m.cpu_ms_per_job for m in measurements if m.key == "a"]
    b_cpu = [m.cpu_ms_per_job for m in measurements if m.key == "b"]
    d_cpu = [m.cpu_ms_per_job for m in measurements if m.key == "d"]
    cpu_b_per_round = [ratio(a, b) for a, b in zip(a_cpu, b_cpu, strict=False)]
    cpu_d_per_round = [ratio(a, d) for a, d in zip(a_cpu, d_cpu, strict=False)]

    def cpu_parts(key: str) -> dict[str, float | None]:
        of_key = [m for m in measurements if m.key == key and m.drain_seconds is not None]
        return {
            "worker_ms_per_job": median(
                None if m.worker_cpu_seconds is None else 1000 * m.worker_cpu_seconds / m.jobs
                for m in of_key
            ),
            "database_ms_per_job": median(
                None if m.database_cpu_seconds is None else 1000 * m.database_cpu_seconds / m.jobs
                for m in of_key
            ),
            "redis_ms_per_job": median(
                None if m.redis_cpu_seconds is None else 1000 * m.redis_cpu_seconds / m.jobs
                for m in of_key
            ),
        }

    return {
        "drain_jobs_per_s": drain,
        "enqueue_jobs_per_s": enqueue,
        "b_over_a": median(per_round),
        "b_over_a_per_round": per_round,
        "b_over_a_of_medians": ratio(drain["b"], drain["a"]),
        "b_over_c": ratio(drain["b"], drain["c"]),
        "d_over_a": median(d_per_round),
        "d_over_a_per_round": d_per_round,
        "cpu": {v.key: cpu_parts(v.key) for v in VARIANTS},
        "cpu_b_over_a": median(cpu_b_per_round),
        "cpu_b_over_a_per_round": cpu_b_per_round,
        "cpu_d_over_a": median(cpu_d_per_round),
        "cpu_d_over_a_per_round": cpu_d_per_round,
        "enqueue_kumiko_over_plain": ratio(enqueue["kumiko"], enqueue["plain"]),
        "enqueue_kumiko_over_plain_reused": ratio(enqueue["kumiko"], enqueue["plain_reused"]),
        "enqueue_kumiko_atomic_over_plain": ratio(enqueue["kumiko_atomic"], enqueue["plain"]),
        "all_ok": all(m.ok for m in measurements),
    }


def _num(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def print_report(results: Results) -> None:
    s = results.summary
    rounds = f", median of {results.rounds} rounds" if results.rounds > 1 else ""
    print()
    print(
        f"{results.jobs} jobs over {results.tenants} tenants, one worker in this process, "
        f"warm-up {results.warmup}{rounds}"
    )
    print()
    print(f"  {'drain (worker only)':<48}{'jobs/s':>8}    {'enqueue':<34}{'jobs/s':>8}")
    enqueue_keys = list(ENQUEUES)
    for i in range(max(len(VARIANTS), len(enqueue_keys))):
        left = right = ""
        if i < len(VARIANTS):
            v = VARIANTS[i]
            left = f"({v.key}) {v.label:<44}{_num(s['drain_jobs_per_s'][v.key], '>8.1f'):>8}"
        if i < len(enqueue_keys):
            key = enqueue_keys[i]
            right = f"{ENQUEUES[key][0]:<34}{_num(s['enqueue_jobs_per_s'][key], '>8.0f'):>8}"
        print(f"  {left:<56}    {right}")
    print()
    b_a = s["b_over_a"]
    if b_a is not None:
        verdict = "meets" if b_a >= TARGET_B_OVER_A else "below"
        print(f"  drain    b/a = {b_a:.2f}   ({verdict} the target {TARGET_B_OVER_A})")
        if len(s["b_over_a_per_round"]) > 1:
            rounds_text = ", ".join(_num(r, ".2f") for r in s["b_over_a_per_round"])
            print(
                f"           per round {rounds_text} (b/a is their median); "
                f"ratio of the medians {_num(s['b_over_a_of_medians'], '.2f')}"
            )
    if s.get("d_over_a") is not None:
        rounds_text = ", ".join(_num(r, ".2f") for r in s["d_over_a_per_round"])
        print(f"  drain    d/a = {s['d_over_a']:.2f}   (atomic=True; per round {rounds_text})")
    if s.get("cpu_b_over_a") is not None:
        rounds_text = ", ".join(_num(r, ".2f") for r in s["cpu_b_over_a_per_round"])
        print(
            f"  CPU      b/a = {s['cpu_b_over_a']:.2f}   (a's CPU per job over b's; "
            f"per round {rounds_text})"
        )
        if s.get("cpu_d_over_a") is not None:
            rounds_text = ", ".join(_num(r, ".2f") for r in s["cpu_d_over_a_per_round"])
            print(f"  CPU      d/a = {s['cpu_d_over_a']:.2f}   (per round {rounds_text})")
        for key, parts in s["cpu"].items():
            if parts["worker_ms_per_job"] is not None:
                print(
                    f"  CPU ms per job ({key}): worker {_num(parts['worker_ms_per_job'], '.3f')}, "
                    f"PostgreSQL {_num(parts['database_ms_per_job'], '.3f')}, "
                    f"Redis server {_num(parts['redis_ms_per_job'], '.3f')} (medians)"
                )
    if s["b_over_c"] is not None:
        print(f"  drain    b/c = {s['b_over_c']:.2f}   (in-process worker against a fork per job)")
    enq = s["enqueue_kumiko_over_plain"]
    if enq is not None:
        verdict = "meets" if enq >= TARGET_ENQUEUE else "below"
        print(
            f"  enqueue  kumiko/plain = {enq:.2f}   ({verdict} issue 7's target "
            f"{TARGET_ENQUEUE}); against a reused queue "
            f"{_num(s['enqueue_kumiko_over_plain_reused'], '.2f')}; in atomic() "
            f"{_num(s['enqueue_kumiko_atomic_over_plain'], '.2f')}"
        )
    for m in results.measurements:
        if not m["ok"]:
            print(f"  WARNING ({m['key']}): {m['problem']} - the numbers above are not valid")
    print_load(results.machine)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.throughput",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--jobs", type=int, default=2000, help="jobs per variant (2000)")
    parser.add_argument("--tenants", type=int, default=4, help="tenants to spread over (4)")
    parser.add_argument("--warmup", type=int, default=100, help="untimed jobs first (100)")
    parser.add_argument(
        "--rounds", type=int, default=1, help="repeat a, b, c this often and report medians (1)"
    )
    parser.add_argument("--only", default="abc", help="variants to run, e.g. 'ab' (all)")
    parser.add_argument(
        "--atomic", action="store_true", help="also (d): the job declared atomic=True"
    )
    parser.add_argument("--json", action="store_true", help="also write bench/results/*.json")
    parser.add_argument(
        "--profile",
        type=int,
        nargs="?",
        const=1000,
        default=0,
        metavar="N",
        help="afterwards, cProfile (a) and (b) draining N jobs (1000)",
    )
    parser.add_argument(
        "--database", default=BENCH_DATABASE, help=f"database to create and drop ({BENCH_DATABASE})"
    )
    parser.add_argument(
        "--redis-db",
        type=int,
        default=BENCH_REDIS_DB,
        help=f"Redis database to flush and use ({BENCH_REDIS_DB})",
    )
    parser.add_argument("--keep-database", action="store_true", help="do not drop it at the end")
    parser.add_argument(
        "--db-roles",
        choices=("on", "off"),
        default=None,
        help="KUMIKO_JOBS['DB_ROLES'] for this run (the project's setting)",
    )
    parser.add_argument(
        "--db-role-pool-size",
        type=int,
        default=None,
        help="KUMIKO_JOBS['DB_ROLE_POOL_SIZE'] (32); below --tenants every run connects",
    )
    parser.add_argument(
        "--asynchronous-history",
        action="store_true",
        help="run with KUMIKO_JOBS['HISTORY_SYNCHRONOUS_COMMIT'] = False",
    )
    parser.add_argument(
        "--fairness",
        choices=("tenant", "fifo"),
        default=None,
        help="KUMIKO_JOBS['FAIRNESS'] of the kumiko workers (the default: 'tenant')",
    )
    args = parser.parse_args(argv)
    if args.jobs < 1 or args.tenants < 1 or args.rounds < 1 or args.warmup < 0:
        parser.error("--jobs, --tenants and --rounds must be >= 1, --warmup >= 0")
    if args.atomic and "d" not in args.only:
        args.only += "d"
    if not set(args.only) <= set("abcd") or not args.only:
        parser.error("--only takes letters of 'abcd'")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    sys.path.insert(0, str(ROOT))  # RQ imports bench.workloads by name in the worker
    admin_url = prepare_environment(args.database, args.redis_db)
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    if args.asynchronous_history:
        from django.conf import settings
        from django.test import override_settings

        # Entered for the rest of the process; Django's setting_changed resets kumiko's conf.
        override_settings(
            KUMIKO_JOBS={**settings.KUMIKO_JOBS, "HISTORY_SYNCHRONOUS_COMMIT": False}
        ).enable()
        print("history statements: asynchronous commit (HISTORY_SYNCHRONOUS_COMMIT = False)")
    roles: dict[str, Any] = {}
    if args.db_roles is not None:
        roles["DB_ROLES"] = args.db_roles == "on"
    if args.db_role_pool_size is not None:
        roles["DB_ROLE_POOL_SIZE"] = args.db_role_pool_size
    if args.fairness is not None:
        roles["FAIRNESS"] = args.fairness
    if roles:
        from django.conf import settings
        from django.test import override_settings

        override_settings(KUMIKO_JOBS={**settings.KUMIKO_JOBS, **roles}).enable()
    from kumiko_jobs.core import conf as kumiko_conf

    print(
        f"FAIRNESS {kumiko_conf.get().FAIRNESS}, "
        f"DB_ROLES {kumiko_conf.get().DB_ROLES}, DB_ROLE_POOL_SIZE "
        f"{kumiko_conf.get().DB_ROLE_POOL_SIZE}, {args.tenants} tenant(s)"
    )
    try:
        tenants = create_tenants(args.tenants)
        results = Results(
            jobs=args.jobs,
            tenants=args.tenants,
            rounds=args.rounds,
            warmup=args.warmup,
            started_at=stamp,
            machine=machine_facts(),
        )
        measurements = []
        for round_ in range(1, args.rounds + 1):
            for variant in VARIANTS:
                if variant.key not in args.only:
                    continue
                print(f"round {round_}: ({variant.key}) {variant.label} ...", end=" ", flush=True)
                m = measure(variant, tenants, args.jobs, args.warmup)
                measurements.append(m)
                cpu = m.cpu_ms_per_job
                print(
                    f"drain {m.drain_rate:.1f} jobs/s"
                    + ("" if cpu is None else f" ({cpu:.2f} ms CPU per job)")
                    + f"; {ENQUEUES[variant.enqueue][0]} "
                    f"{m.enqueue_rate:.0f} jobs/s; {m.tenant_connects} tenant connects; "
                    f"load {os.getloadavg()[0]:.2f}" + ("" if m.ok else f"  WARNING: {m.problem}"),
                    flush=True,
                )
            if "a" in args.only:
                m = measure_enqueue_only("plain_reused", tenants, args.jobs, args.warmup)
                measurements.append(m)
                label = ENQUEUES["plain_reused"][0]
                print(f"round {round_}: {label} {m.enqueue_rate:.0f} jobs/s", flush=True)
        results.measurements = [
            {
                **asdict(m),
                "enqueue_rate": m.enqueue_rate,
                "drain_rate": m.drain_rate,
                "cpu_ms_per_job": m.cpu_ms_per_job,
            }
            for m in measurements
        ]
        results.summary = summarize(measurements)
        print_report(results)
        if args.profile:
            profiled_variants = [
                v for v in VARIANTS if v.key in "ab" or (v.key == "d" and "d" in args.only)
            ]
            profiles = [profile_drain(v, tenants, args.profile, stamp) for v in profiled_variants]
            profiles += [
                profile_enqueue(key, tenants, args.profile, stamp) for key in ("plain", "kumiko")
            ]
            for prof in profiles:
                print(f"\n===== profile {prof['name']}: {prof['jobs']} jobs =====")
                print(prof["report"])
            print()
            print(
                f"{'per job':<16}{'ms (profiled)':>14}{'SQL':>6}{'of it SET':>11}"
                f"{'DB connects':>13}{'Redis trips':>13}"
            )
            for prof in profiles:
                c = prof["per_job"]
                print(
                    f"{prof['name']:<16}{prof['ms_per_job']:>14.2f}{c['sql']:>6.1f}"
                    f"{c['search_path']:>11.1f}{c['db_connects']:>13.2f}{c['redis']:>13.1f}"
                )
            print(f"cProfile files: {', '.join(p['file'] for p in profiles)}")
            results.profiles = profiles
        if args.json:
            data = asdict(results)
            for prof in data["profiles"]:
                prof.pop("report")
            write_results("throughput", stamp, data)
    finally:
        clean_up(admin_url, args.database, keep_database=args.keep_database)
    return 0


if __name__ == "__main__":
    sys.exit(main())
