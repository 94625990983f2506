"""What PostgreSQL spends on a run's start and finish statements (bench/README.md, "2026-12-06").

    python -m bench.run_row_cost RUNS LABEL [--database=NAME] [--async-start] [--all-async]
                                 [--prepared] [--deallocate-each-run] [--fenced]
                                 [--ddl=SQL ...]

A replay, not the worker: in a database that holds kumiko's run tables (one kept by
``bench.throughput --keep-database``, or a copy of its four tables: ``pg_dump -s -t
kumiko_jobs_jobrun -t kumiko_jobs_jobattempt -t kumiko_jobs_jobfailure -t customers_client``
plus the tenants' rows and ``CREATE EXTENSION pg_trgm``), it TRUNCATEs the runs, inserts RUNS
queued runs as the bench enqueues them (a correlation id, no subject), and sends each the start
and the finish statement (their text as ``bench.atomic_cost --show`` printed it on 2026-12-06,
values inlined as Django's client-side binding does), in autocommit as the worker does. It
prints one JSON line: the backend's CPU per run (``/proc/<pid>/stat``, so PostgreSQL must run on
this machine and be readable), the wall clock, and from ``EXPLAIN (ANALYZE, BUFFERS, WAL)`` of
ten more runs the planning and execution time and the WAL records and bytes of each statement.
``--ddl=SQL`` runs SQL first (an index to try); ``--async-start`` sends the start with
``synchronous_commit = off``, ``--all-async`` both; ``--prepared`` binds on the server and
prepares both statements (psycopg's ``prepare=True``, as ``kumiko_jobs/history/prepared.py``
does); ``--deallocate-each-run`` sends ``DEALLOCATE ALL`` (as a simple query, as the session
reset does) after each run's start, where ``DB_ROLES`` off resets the history's connection, so
that a prepared start and finish are prepared again for every run; ``--fenced`` sends the finish
as it has been since 2026-12-07 (written only while the run still runs its attempt). It destroys
the runs of the database it is given.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from datetime import UTC, datetime

import psycopg

DSN = "postgresql://postgres@127.0.0.1:5432/{database}"

START = """WITH started AS (UPDATE "public"."kumiko_jobs_jobrun" SET "status" = 'running', "attempts" = 1, "started_at" = %(t)s::timestamptz, "finished_at" = NULL, "scheduled_for" = NULL, "defer_count" = 0, "gate_defer_count" = 0, "rq_job_id" = 'kj-' || %(id)s || '-a1-d0-g0', "atomic_key" = '' WHERE "run_id" = %(id)s::uuid AND (("status" = 'queued' AND "attempts" + 1 = 1 AND "defer_count" = 0 AND "gate_defer_count" = 0) OR ("status" = 'deferred' AND GREATEST("attempts", 1) = 1 AND (("defer_count" + 1 = 0 AND "gate_defer_count" = 0) OR ("defer_count" = 0 AND "gate_defer_count" + 1 = 0)))) RETURNING "workflow_id" AS workflow_id) SELECT (SELECT count(*) FROM started), (SELECT workflow_id FROM started), tenant."id", tenant."schema_name", tenant."name", tenant."is_active", tenant."created_on" FROM (SELECT 1) AS one LEFT JOIN "public"."customers_client" AS tenant ON tenant."schema_name" = 'bench1'"""  # noqa: E501

FINISH = """WITH attempt AS (INSERT INTO "public"."kumiko_jobs_jobattempt" ("run_id", "number", "started_at", "finished_at", "duration_ms", "outcome", "error_type", "error_message", "traceback", "log", "worker") VALUES (%(id)s::uuid, 1, %(t)s::timestamptz, %(t)s::timestamptz, 13.1, 'succeeded', '', '', '', '[]'::jsonb, 'vm:17576')), cleared AS (DELETE FROM "public"."kumiko_jobs_jobfailure" WHERE "schema_name" = 'bench1' AND "job_name" = 'billing.bench_write' AND "subject" = '') UPDATE "public"."kumiko_jobs_jobrun" SET "status" = 'succeeded', "duration_ms" = 13.1, "waiting_for" = '', "finished_at" = %(t)s::timestamptz, "error_type" = '', "error_message" = '', "result" = NULL FROM (SELECT 1) AS commit_mode WHERE "run_id" = %(id)s::uuid"""  # noqa: E501

# The finish as fenced since 2026-12-07 (``--fenced``): only while the run still runs attempt 1.
FINISH_FENCED = """WITH run AS (UPDATE "public"."kumiko_jobs_jobrun" SET "status" = 'succeeded', "duration_ms" = 13.1, "waiting_for" = '', "finished_at" = %(t)s::timestamptz, "error_type" = '', "error_message" = '', "result" = NULL FROM (SELECT 1) AS commit_mode WHERE "run_id" = %(id)s::uuid AND "status" = 'running' AND "attempts" = 1 RETURNING 1), attempt AS (INSERT INTO "public"."kumiko_jobs_jobattempt" ("run_id", "number", "started_at", "finished_at", "duration_ms", "outcome", "error_type", "error_message", "traceback", "log", "worker") SELECT %(id)s::uuid, 1::integer, %(t)s::timestamptz, %(t)s::timestamptz, 13.1::double precision, 'succeeded'::text, ''::text, ''::text, ''::text, '[]'::jsonb, 'vm:17576'::text FROM run), cleared AS (DELETE FROM "public"."kumiko_jobs_jobfailure" WHERE "schema_name" = 'bench1' AND "job_name" = 'billing.bench_write' AND "subject" = '' AND EXISTS (SELECT FROM run)) SELECT count(*) FROM run"""  # noqa: E501

INSERT = """INSERT INTO kumiko_jobs_jobrun (run_id, job_name, schema_name, subject, status, queue, attempts, max_attempts, defer_count, gate_defer_count, queued_at, triggered_by, trigger, correlation_id, trace_id, payload, error_type, error_message, rq_job_id, trace_context, waiting_for, atomic_key, priority, progress_message, cancel_requested_by)
SELECT gen_random_uuid(), 'billing.bench_write', 'bench' || (g %% 4 + 1), '', 'queued', 'default', 0, 1, 0, 0, now(), '', '', md5(g::text), '', '{"n": 0}', '', '', '', '{}', '', '', 0, '', ''
FROM generate_series(1, %(n)s) g RETURNING run_id"""  # noqa: E501


def cpu_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime (clock ticks)


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    label = sys.argv[2] if len(sys.argv) > 2 else "?"
    database = next(
        (a.split("=", 1)[1] for a in sys.argv if a.startswith("--database=")), "kumiko_bench_hot_rc"
    )
    async_start = "--async-start" in sys.argv
    all_async = "--all-async" in sys.argv
    deallocate = "--deallocate-each-run" in sys.argv
    finish_sql = FINISH_FENCED if "--fenced" in sys.argv else FINISH
    with psycopg.connect(DSN.format(database=database), autocommit=True) as conn:
        prepared = "--prepared" in sys.argv
        cur = conn.cursor() if prepared else psycopg.ClientCursor(conn)
        reset = psycopg.ClientCursor(conn)
        for ddl in [a for a in sys.argv if a.startswith("--ddl=")]:
            cur.execute(ddl[6:])
        cur.execute("TRUNCATE kumiko_jobs_jobattempt, kumiko_jobs_jobrun CASCADE")
        cur.execute("VACUUM ANALYZE kumiko_jobs_jobrun")
        cur.execute(INSERT, {"n": n + 20})
        ids = [str(r[0]) for r in cur.fetchall()]
        cur.execute("VACUUM ANALYZE kumiko_jobs_jobrun")
        if all_async:
            cur.execute("SET synchronous_commit = off")
        cur.execute("SELECT pg_backend_pid()")
        pid = cur.fetchone()[0]
        # EXPLAIN a sample (their own rows), rolled into the stats below.
        plans = {"start": [], "finish": []}
        for rid in ids[n : n + 10]:
            t = datetime.now(UTC)
            for name, sql in (("start", START), ("finish", finish_sql)):
                cur.execute(
                    "EXPLAIN (ANALYZE, BUFFERS, WAL, FORMAT JSON) " + sql, {"id": rid, "t": t}
                )
                plans[name].append(cur.fetchone()[0][0])
        tick = 100
        c0 = cpu_ticks(pid)
        w0 = time.perf_counter()
        starts, finishes = [], []
        for rid in ids[:n]:
            t = datetime.now(UTC)
            a = time.perf_counter()
            if async_start:
                cur.execute(
                    START.replace(
                        "FROM (SELECT 1) AS one",
                        "FROM (SELECT set_config('synchronous_commit', 'off', true)) AS one",
                    ),
                    {"id": rid, "t": t},
                )
            else:
                cur.execute(START, {"id": rid, "t": t}, prepare=prepared or None)
            cur.fetchone()
            if deallocate:  # the body's reset sits between the start and the finish
                reset.execute("DEALLOCATE ALL")
            b = time.perf_counter()
            cur.execute(finish_sql, {"id": rid, "t": t}, prepare=prepared or None)
            if finish_sql is FINISH_FENCED:
                assert cur.fetchone() == (1,)  # the fence let it through
            c = time.perf_counter()
            starts.append(b - a)
            finishes.append(c - b)
        wall = time.perf_counter() - w0
        cpu = (cpu_ticks(pid) - c0) / tick
    out = {
        "label": label,
        "n": n,
        "backend_cpu_ms_per_run": round(cpu / n * 1000, 3),
        "wall_ms_per_run": round(wall / n * 1000, 3),
        "start_p50_ms": round(statistics.median(starts) * 1000, 3),
        "finish_p50_ms": round(statistics.median(finishes) * 1000, 3),
        "prepared": prepared,
        "deallocate_each_run": deallocate,
    }
    for name, ps in plans.items():
        out[f"{name}_plan_ms"] = round(statistics.median(p["Planning Time"] for p in ps), 3)
        out[f"{name}_exec_ms"] = round(statistics.median(p["Execution Time"] for p in ps), 3)
        # WAL of the whole statement: the top node's counts include its children.
        out[f"{name}_wal_bytes"] = statistics.median(p["Plan"].get("WAL Bytes", 0) for p in ps)
        out[f"{name}_wal_records"] = statistics.median(p["Plan"].get("WAL Records", 0) for p in ps)
        out[f"{name}_fpi"] = statistics.median(p["Plan"].get("WAL FPI", 0) for p in ps)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
