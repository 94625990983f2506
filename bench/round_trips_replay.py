"""What a reply the worker no longer waits for is worth: the run's statements replayed, timed.

    python -m bench.round_trips_replay [--blocks 10] [--runs 300] [--database kumiko_rt]

Two replays with psycopg on a scratch database (created and dropped), each in alternating
blocks of ``--runs`` runs, medians of the blocks' wall clock per run:

* **reset**: a tenant body's ``INSERT`` on one connection, the session reset on it (kumiko's
  statement, ``core.session.DISCARD_ALL`` and the time zone and path), and the finish as a
  prepared ``UPDATE`` on a second connection; the reset waited for (main before 2026-12-06
  night) or sent, and its reply read after the finish (``core.session.send_discard``);
* **atomic**: an atomic body, ``BEGIN``, the xid read, the ``INSERT``, a success function
  (``SECURITY``-less stand-in for migration 0017's: the same checks' shape and one ``UPDATE``)
  and ``COMMIT``, as five round trips or as three (``BEGIN; SELECT ...``, the ``INSERT``,
  ``SELECT ...; COMMIT``: ``history.run_sql``);
* **finish**: that atomic body (three round trips) followed by the run's finish on a second
  connection (the attempt's ``INSERT`` and the run's ``UPDATE`` in one statement, its own
  synchronous commit: before migration 0029), or with the attempt's row written by the success
  function inside the body's transaction and no finish after it (0029's riding finish).

``--only reset,atomic,finish`` picks replays (all by default).

Timings, so they move with the machine's load: print ``uptime`` beside them.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence

import psycopg
from psycopg import generators
from psycopg.pq import ExecStatus

DSN = "host=127.0.0.1 user=postgres dbname={}"
RESET = (
    "CLOSE ALL; SET SESSION AUTHORIZATION DEFAULT; RESET ALL; DEALLOCATE ALL; UNLISTEN *; "
    "SELECT pg_advisory_unlock_all(); DISCARD PLANS; DISCARD TEMP; DISCARD SEQUENCES; "
    "SELECT set_config('TimeZone', 'UTC', false); SET search_path = \"public\""
)
SUCCESS = """CREATE OR REPLACE FUNCTION success(p int, x xid8) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
  PERFORM set_config('synchronous_commit', 'on', true);
  IF pg_current_xact_id_if_assigned() IS DISTINCT FROM x THEN RAISE EXCEPTION 'x'; END IF;
  UPDATE run SET n = n + 1 WHERE id = p;
END $$"""

# 0029's shape: the success function also writes the attempt's row (a stand-in, as SUCCESS).
SUCCESS_WITH_FINISH = """CREATE FUNCTION success_finish(p int, x xid8, d float8) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
  PERFORM set_config('synchronous_commit', 'on', true);
  IF pg_current_xact_id_if_assigned() IS DISTINCT FROM x THEN RAISE EXCEPTION 'x'; END IF;
  UPDATE run SET n = n + 1, duration = d WHERE id = p;
  INSERT INTO attempt (run, duration, log) VALUES (p, d, '[]');
END $$"""

Conn = psycopg.Connection[tuple[object, ...]]


def _connect(database: str) -> Conn:
    return psycopg.connect(
        DSN.format(database), autocommit=True, cursor_factory=psycopg.ClientCursor
    )


def _replay(blocks: int, runs: int, one: Callable[[int, bool], None]) -> dict[bool, list[float]]:
    """Microseconds per run for each block, ``False`` (as on main) and ``True`` (branch)."""
    results: dict[bool, list[float]] = {False: [], True: []}
    for block in range(blocks):
        for new in (False, True) if block % 2 == 0 else (True, False):
            started = time.perf_counter()
            for n in range(runs):
                one(n, new)
            results[new].append((time.perf_counter() - started) / runs * 1e6)
    return results


def reset_replay(database: str, blocks: int, runs: int) -> dict[bool, list[float]]:
    body, history = _connect(database), _connect(database)
    body.execute("CREATE TABLE log (id bigserial PRIMARY KEY, message text, at timestamptz)")
    history.execute("CREATE TABLE IF NOT EXISTS run (id int PRIMARY KEY, status text, n int)")
    history.execute(
        "INSERT INTO run SELECT g, 'queued', 0 FROM generate_series(1, 10) g ON CONFLICT DO NOTHING"
    )

    def one(n: int, unwaited: bool) -> None:
        body.execute("INSERT INTO log (message, at) VALUES (%s, now())", [f"w{n}"])
        if unwaited:
            body.pgconn.send_query(RESET.encode())
            body.wait(generators.send(body.pgconn))
        else:
            body.execute(RESET)
        history.execute(
            "UPDATE run SET n = n + 1, status = 'succeeded' WHERE id = %s",
            [n % 10 + 1],
            prepare=True,
        )
        if unwaited:
            replies = body.wait(generators.fetch_many(body.pgconn))
            assert all(r.status != ExecStatus.FATAL_ERROR for r in replies)

    try:
        return _replay(blocks, runs, one)
    finally:
        body.close()
        history.close()


def atomic_replay(database: str, blocks: int, runs: int) -> dict[bool, list[float]]:
    conn = _connect(database)
    conn.execute("CREATE TABLE alog (id bigserial PRIMARY KEY, message text, at timestamptz)")
    conn.execute("CREATE TABLE IF NOT EXISTS run (id int PRIMARY KEY, status text, n int)")
    conn.execute(
        "INSERT INTO run SELECT g, 'running', 0 FROM generate_series(1, 10) g "
        "ON CONFLICT DO NOTHING"
    )
    conn.execute(SUCCESS)

    def one(n: int, combined: bool) -> None:
        if combined:
            conn.pgconn.send_query(b"BEGIN; SELECT pg_current_xact_id()::text")
            value = conn.wait(generators.execute(conn.pgconn))[-1].get_value(0, 0)
            xid = bytes(value or b"").decode()
        else:
            conn.execute("BEGIN")
            row = conn.execute("SELECT pg_current_xact_id()::text").fetchone()
            xid = str(row[0]) if row else ""
        conn.execute("INSERT INTO alog (message, at) VALUES (%s, now())", [f"w{n}"])
        if combined:
            conn.execute("SELECT success(%s, %s::xid8); COMMIT", [n % 10 + 1, xid])
        else:
            conn.execute("SELECT success(%s, %s::xid8)", [n % 10 + 1, xid])
            conn.execute("COMMIT")

    try:
        return _replay(blocks, runs, one)
    finally:
        conn.close()


def finish_replay(database: str, blocks: int, runs: int) -> dict[bool, list[float]]:
    body, history = _connect(database), _connect(database)
    body.execute("CREATE TABLE flog (id bigserial PRIMARY KEY, message text, at timestamptz)")
    body.execute("CREATE TABLE frun (id int PRIMARY KEY, status text, n int)")
    body.execute("INSERT INTO frun SELECT g, 'running', 0 FROM generate_series(1, 10) g")
    body.execute("CREATE TABLE IF NOT EXISTS run (id int PRIMARY KEY, status text, n int)")
    body.execute("ALTER TABLE run ADD COLUMN IF NOT EXISTS duration float8")
    body.execute(
        "INSERT INTO run SELECT g, 'running', 0 FROM generate_series(1, 10) g "
        "ON CONFLICT DO NOTHING"
    )
    body.execute(
        "CREATE TABLE attempt (id bigserial PRIMARY KEY, run int, duration float8, log jsonb)"
    )
    body.execute(SUCCESS)
    body.execute(SUCCESS_WITH_FINISH)

    def one(n: int, riding: bool) -> None:
        run = n % 10 + 1
        body.pgconn.send_query(b"BEGIN; SELECT pg_current_xact_id()::text")
        value = body.wait(generators.execute(body.pgconn))[-1].get_value(0, 0)
        xid = bytes(value or b"").decode()
        body.execute("INSERT INTO flog (message, at) VALUES (%s, now())", [f"w{n}"])
        if riding:
            body.execute("SELECT success_finish(%s, %s::xid8, 1.5); COMMIT", [run, xid])
            return
        body.execute("SELECT success(%s, %s::xid8); COMMIT", [run, xid])
        history.execute(
            "WITH a AS (INSERT INTO attempt (run, duration, log) VALUES (%s, 1.5, '[]')) "
            "UPDATE run SET duration = 1.5 WHERE id = %s",
            [run, run],
            prepare=True,
        )

    try:
        return _replay(blocks, runs, one)
    finally:
        body.close()
        history.close()


REPLAYS = {
    "reset": (reset_replay, ("reset waited for", "reset read after the finish")),
    "atomic": (atomic_replay, ("5 round trips", "3 round trips")),
    "finish": (finish_replay, ("finish after the COMMIT", "finish in the success")),
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.round_trips_replay", description=__doc__)
    parser.add_argument("--blocks", type=int, default=10)
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--database", default="kumiko_rt")
    parser.add_argument("--only", default=",".join(REPLAYS), help="replays, comma-separated")
    args = parser.parse_args(argv)
    with psycopg.connect(DSN.format("postgres"), autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{args.database}"')
        admin.execute(f'CREATE DATABASE "{args.database}"')
    try:
        for name in args.only.split(","):
            replay, labels = REPLAYS[name]
            found = replay(args.database, args.blocks, args.runs)
            for new, label in zip((False, True), labels, strict=True):
                blocks = " ".join(f"{v:.0f}" for v in found[new])
                median = statistics.median(found[new])
                print(f"{name:<7}{label:<30}{median:>8.1f} us per run  (blocks: {blocks})")
    finally:
        with psycopg.connect(DSN.format("postgres"), autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{args.database}"')
    return 0


if __name__ == "__main__":
    sys.exit(main())
