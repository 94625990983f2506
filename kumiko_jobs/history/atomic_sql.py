"""The atomic run's statements on the body's connection (docs/reliability.md, "Exactly once for
database-only jobs"): its transaction and that transaction's id, and its success, recorded in
the same transaction through migration 0029's function (with the attempt's finish, in the
common case).

Apart from ``run_sql`` (the start and the finish every run costs) because they are a concern of
their own: they run on the body's connection, inside the job's transaction, where the start
and the finish run on the project's connection in transactions of their own. ``transitions``
is the only caller of ``atomic_success`` (a write of the history); the atomic step opens the
transaction (``atomic_transaction``).
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import psycopg
from django.db import DEFAULT_DB_ALIAS, connection, connections, transaction
from psycopg import generators
from psycopg.pq import ExecStatus, TransactionStatus

from ..core import project_settings
from ..core.db import ATOMIC_FUNCTION
from .run_sql import public_cursor


@contextmanager
def atomic_transaction() -> Iterator[str]:
    """The atomic run's transaction on the body's connection (the default alias), yielding its
    id (``atomic_begin``); rolled back if the block raises or calls ``atomic_roll_back``."""
    with transaction.atomic(using=DEFAULT_DB_ALIAS):
        xid = atomic_begin()
        yield xid


def atomic_roll_back() -> None:
    """The atomic run did not succeed: its transaction (``atomic_transaction``) rolls back."""
    transaction.set_rollback(True, using=DEFAULT_DB_ALIAS)


def atomic_function() -> str:
    """The schema-qualified name of the success function (migrations 0011, 0017), so it is found
    whatever the connection's ``search_path``.
    """
    return f"{connection.ops.quote_name(project_settings.public_schema_name())}.{ATOMIC_FUNCTION}"


def atomic_begin() -> str:
    """Inside the atomic run's open transaction on the body's connection: its id (assigned
    now, so that the success record can tell the same transaction from a later one).

    When nothing has been sent in the transaction yet (the outermost block: psycopg would send
    its ``BEGIN`` first, a round trip of its own), the ``BEGIN`` psycopg would send and the
    query go as one simple query: one round trip. psycopg then sees the transaction open, as
    after its own ``BEGIN``, and sends none. Inside a caller's transaction (a savepoint), the
    query alone, as before.
    """
    wrapper = connections[DEFAULT_DB_ALIAS]
    wrapper.ensure_connection()
    raw = wrapper.connection
    if raw.autocommit or raw.pgconn.transaction_status != TransactionStatus.IDLE:
        with public_cursor() as cursor:
            cursor.execute("SELECT pg_current_xact_id()::text")
            row = cursor.fetchone()
        return str(row[0])
    # psycopg's own BEGIN for this connection (with its isolation level, if one is set).
    begin = raw._get_tx_start_command()
    with wrapper.wrap_database_errors:
        raw.pgconn.send_query(begin + b"; SELECT pg_current_xact_id()::text")
        results = raw.wait(generators.execute(raw.pgconn))
        for result in results:
            if result.status == ExecStatus.FATAL_ERROR:
                raise psycopg.errors.error_from_result(result, encoding=raw.info.encoding)
    value = results[-1].get_value(0, 0)
    assert value is not None
    return bytes(value).decode()


def atomic_digest(secret: str) -> str:
    """What the run's row holds of an atomic delivery's secret (``Delivery.atomic_secret``):
    its SHA-256, written with the start (``start``, ``transitions.take_over``), before the
    body's transaction opens and committed with the start, so the success function sees it at
    any isolation level. Tenant logins cannot write that column (no privilege on kumiko's tables;
    the classifier refuses it), and only the runner holds the secret: migration 0017's function
    accepts the success of this attempt only with it."""
    return hashlib.sha256(secret.encode()).hexdigest()


def atomic_success(
    *,
    run_id: str,
    attempt: int,
    xid: str,
    key: str,
    finished_at: datetime,
    result: Any,
    commit: bool = False,
    finish: Mapping[str, Any] | None = None,
) -> bool:
    """The run's success, in the body's transaction, through migration 0029's function: the
    body's login may hold no privilege on kumiko's tables (DB_ROLES). The function also sets
    ``synchronous_commit = on`` for the transaction and refuses when the job ended the
    transaction the runner opened (``xid``), without the attempt's secret (``key``, see
    ``atomic_digest``), or when the run no longer runs this attempt.

    ``finish`` (``riding_finish``): the attempt's row and the run's last columns, written by the
    function in the same transaction, so no finish statement follows on the project's connection.

    With ``commit`` (the outermost transaction), the ``COMMIT`` follows in the same simple
    query (``SELECT ...; COMMIT``): one round trip for both. If the function refuses, PostgreSQL
    skips the ``COMMIT`` and the transaction is left aborted, for the caller's block to roll
    back. Returns whether the ``COMMIT`` was sent (not on a server-side-binding cursor, which
    takes one statement at a time: the caller's block then commits, as without ``commit``).
    """
    from psycopg.types.json import Jsonb

    with public_cursor() as cursor:
        commits = commit and isinstance(cursor.cursor, psycopg.ClientCursor)
        cursor.execute(
            f"SELECT {atomic_function()}(%s, %s, %s::xid8, %s, %s, %s, %s)"
            + ("; COMMIT" if commits else ""),
            [
                uuid.UUID(run_id),
                attempt,
                xid,
                finished_at,
                None if result is None else Jsonb(result),
                key,
                None if finish is None else Jsonb(dict(finish)),
            ],
        )
    return commits


def riding_finish(
    attempt: Mapping[str, Any], run: Mapping[str, Any], clear_subject: str | None
) -> dict[str, Any]:
    """What the success function writes of a successful attempt's finish (migration 0029):
    ``attempt`` and ``run`` are the finish's columns (``transitions.attempt_columns`` and
    ``run_columns``); ``clear_subject``, the subject whose tenant-visible failure the success
    clears (the function takes the schema and the job from the run's row). The outcome, the
    error columns and ``finished_at`` are the function's own."""
    finish: dict[str, Any] = {
        "started_at": attempt["started_at"].isoformat(),
        "duration_ms": attempt["duration_ms"],
        "log": attempt["log"],
        "worker": attempt["worker"],
    }
    if "progress" in run:
        finish["progress"] = run["progress"]
        finish["progress_message"] = run["progress_message"]
    if clear_subject is not None:
        finish["clear_subject"] = clear_subject
    return finish
