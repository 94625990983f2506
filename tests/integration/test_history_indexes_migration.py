"""Migration 0010 builds its indexes without stopping writes to the run table (issue 15); 0014,
the failures' indexes, is built the same way.

The test holds a transaction that has written a run (as a worker mid-run does), so an index
build must wait for it, and while the build waits a third session inserts another run:
with the migration's own SQL (CREATE INDEX CONCURRENTLY) that insert goes through; with a
plain CREATE INDEX (the calibration) it queues behind the build's SHARE lock. Real
PostgreSQL, three sessions of their own; ``lock_timeout`` turns "would wait" into an error.
"""

from __future__ import annotations

import importlib
import io
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from django.contrib.postgres.operations import AddIndexConcurrently
from django.core.management import call_command
from django.db import connection
from django.db.migrations import RunPython

pytestmark = pytest.mark.usefixtures("live_db")

INSERT = (
    "INSERT INTO kumiko_jobs_jobrun (run_id, job_name, schema_name, subject, status, queue,"
    " attempts, max_attempts, defer_count, gate_defer_count, queued_at, triggered_by, trigger,"
    " correlation_id, trace_id, trace_context, payload, error_type, error_message, rq_job_id,"
    " cancel_requested_by) VALUES (%s, 'test.lock', 't1', '', 'queued', 'default', 0, 1, 0, 0,"
    " now(), '', '', '', '', '{}', '{}', '', '', '', '')"
)


def session() -> psycopg.Connection[Any]:
    params = connection.get_connection_params()
    for key in ("cursor_factory", "context", "prepare_threshold"):
        params.pop(key, None)
    conn = psycopg.connect(**params, autocommit=True)
    conn.execute("SET search_path = public")
    return conn


def index_statements(migration: str = "0010") -> list[str]:
    out = io.StringIO()
    call_command("sqlmigrate", "kumiko_jobs", migration, stdout=out)
    return [line.strip() for line in out.getvalue().splitlines() if "CREATE INDEX" in line]


@contextmanager
def build_waiting_for_a_writer(statement: str) -> Iterator[None]:
    """``statement`` running in its own session, stuck behind an open writing transaction;
    the block runs while it waits. The writer then commits and the build completes."""
    writer, builder = session(), session()
    errors: list[BaseException] = []
    try:
        writer.execute("BEGIN")
        writer.execute(INSERT, [uuid.uuid4()])
        pid = builder.info.backend_pid

        def build() -> None:
            try:
                builder.execute(statement)
            except BaseException as exc:  # reported by the main thread
                errors.append(exc)

        thread = threading.Thread(target=build)
        thread.start()
        # Wait (bounded: a guard against a hang, not a measurement) until the build waits.
        for _ in range(600):
            waiting = writer.execute(
                "SELECT count(*) FROM pg_locks WHERE pid = %s AND NOT granted",
                [pid],
            ).fetchone()
            if waiting and waiting[0]:
                break
            time.sleep(0.05)
        else:
            raise AssertionError("the index build never waited for the writer")
        try:
            yield
        finally:
            writer.execute("COMMIT")
            thread.join()
        assert not errors, errors
    finally:
        writer.close()
        builder.close()


def insert_from_another_session() -> None:
    other = session()
    try:
        other.execute("SET lock_timeout = '3s'")
        other.execute(INSERT, [uuid.uuid4()])
    finally:
        other.close()


@pytest.mark.parametrize("name", ["0010_history_indexes", "0014_failure_indexes"])
def test_migration_is_non_atomic_and_builds_every_index_concurrently(name):
    migration = importlib.import_module(f"kumiko_jobs.migrations.{name}")
    assert migration.Migration.atomic is False
    index_ops = [op for op in migration.Migration.operations if not isinstance(op, RunPython)]
    assert index_ops and all(isinstance(op, AddIndexConcurrently) for op in index_ops)
    statements = index_statements(name[:4])
    assert len(statements) == len(index_ops)
    assert all(s.startswith("CREATE INDEX CONCURRENTLY") for s in statements), statements


def test_inserts_go_on_while_the_migrations_index_build_waits():
    statement = next(s for s in index_statements() if '"kj_run_recent"' in s)
    with connection.cursor() as cursor:
        cursor.execute("DROP INDEX IF EXISTS kj_run_recent")
    try:
        with build_waiting_for_a_writer(statement):
            insert_from_another_session()  # not blocked: SHARE UPDATE EXCLUSIVE allows it
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT indisvalid FROM pg_index WHERE indexrelid = 'kj_run_recent'::regclass"
            )
            assert cursor.fetchone() == (True,)
    finally:
        with connection.cursor() as cursor:
            cursor.execute(
                statement.replace("CREATE INDEX CONCURRENTLY", "CREATE INDEX IF NOT EXISTS").rstrip(
                    ";"
                )
            )
            cursor.execute("DELETE FROM kumiko_jobs_jobrun WHERE job_name = 'test.lock'")


def test_calibration_a_plain_create_index_blocks_inserts_while_it_waits():
    statement = "CREATE INDEX kj_test_plain ON kumiko_jobs_jobrun (queued_at)"
    try:
        with (
            build_waiting_for_a_writer(statement),
            pytest.raises(psycopg.errors.LockNotAvailable),
        ):
            insert_from_another_session()
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP INDEX IF EXISTS kj_test_plain")
            cursor.execute("DELETE FROM kumiko_jobs_jobrun WHERE job_name = 'test.lock'")


def test_the_subject_trigram_index_exists_and_is_valid():
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT i.indisvalid, pg_get_indexdef(i.indexrelid) FROM pg_index i"
            " WHERE i.indexrelid = 'kj_run_subject_trgm'::regclass"
        )
        valid, definition = cursor.fetchone()
    assert valid
    assert "gin" in definition and "upper((subject)::text)" in definition
