"""The run's start and finish as prepared statements, on the connection that writes the history.

Why: sent as text, the two statements are parsed and planned by PostgreSQL for every run, about
a third of the backend's CPU per run (bench/README.md, "2026-12-06"). Prepared at the protocol
level (psycopg's ``prepare=True`` on a server-side-binding cursor: Parse once per session, then
Bind and Execute), they are parsed once, and after PostgreSQL's five custom plans they run on
its generic plan.

When: with ``DB_ROLES`` on and ``HISTORY_PREPARED_STATEMENTS`` (the default). A tenant body then
runs on its tenant's login, and the history on the project's connection, which no session reset
touches between tenant runs: the statements live as long as that connection. With ``DB_ROLES``
off the body runs on the history's connection, and the session reset after every run
(``core.session``: ``DEALLOCATE ALL``, which must stay, so that nothing a job prepared reaches
the next run) throws them away: both would be prepared again for every run, a round trip more
each and no planning saved, so they are sent as before (measured: bench/README.md, "2026-12-06
(evening)").

How psycopg keeps track: Django turns psycopg's preparing off (``prepare_threshold = None``, for
poolers); the history's connection gets a threshold no statement reaches, so only these two
(``prepare=True``) are prepared, while psycopg's bookkeeping sees every statement's result on
that connection. A ``DEALLOCATE ALL``, ``DISCARD ALL``, ``ROLLBACK``, ``DROP`` or ``ALTER`` among
them (the session reset's, after a system run or ``ctx.system_db()`` used the project's
connection) clears its cache, and the next start prepares again. A new connection (one lost and
opened again, a slot's own) starts with an empty cache and gets the threshold at its first start.

What it cannot see, it repairs: a statement PostgreSQL no longer has (``prepared statement ...
does not exist``: deallocated past psycopg) or whose result changed shape (``cached plan must not
change result type``: a migration changed a column the start returns while the worker ran)
fails at Bind, before anything executed. Outside a transaction the connection is closed and the
statement sent once more on a new one, prepared anew; inside one (a run executed inline in a
caller's ``atomic()``) the error is raised.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

import psycopg
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections
from psycopg.abc import Params, QueryNoTemplate
from psycopg.pq import Format

from ..core import conf, session

# A threshold no statement reaches: psycopg counts every statement, and prepares only those
# executed with ``prepare=True``.
ONLY_WHEN_ASKED = sys.maxsize
# What a prepared statement that went stale raises at Bind (nothing executed yet).
_GONE = "26000"  # invalid_sql_statement_name: prepared statement ... does not exist
_RESHAPED = "cached plan must not change result type"  # feature_not_supported, 0A000


class PreparingCursor(psycopg.Cursor[Any]):
    """A server-side-binding cursor whose every statement is prepared (psycopg's cache)."""

    # One signature for psycopg's overloads (Django passes a str and a parameter list).
    def execute(  # type: ignore[override]
        self,
        query: QueryNoTemplate,
        params: Params | None = None,
        *,
        prepare: bool | None = None,
        binary: bool | None = None,
    ) -> PreparingCursor:
        super().execute(query, params, prepare=True, binary=binary)
        return self


def enabled() -> bool:
    """Whether the history's two statements are prepared (module doc, "When")."""
    settings = conf.get()
    return settings.DB_ROLES and settings.HISTORY_PREPARED_STATEMENTS


def _preparing(cursor: Any) -> None:
    """Swap Django's client-side-binding cursor inside ``cursor`` (Django's wrapper: execute
    wrappers, error translation, query logging stay) for a ``PreparingCursor`` on the same
    connection, reading time stamps in the same time zone."""
    client = cursor.cursor
    raw = client.connection
    if raw.prepare_threshold is None:
        raw.prepare_threshold = ONLY_WHEN_ASKED
    prepared = PreparingCursor(raw)
    oid = raw.adapters.types["timestamptz"].oid
    loader = client.adapters.get_loader(oid, Format.TEXT)
    if loader is not raw.adapters.get_loader(oid, Format.TEXT):  # Django set the cursor's own
        prepared.adapters.register_loader(oid, loader)
    client.close()
    cursor.cursor = prepared


def _stale(exc: DatabaseError) -> bool:
    cause = exc.__cause__
    sqlstate = getattr(cause, "sqlstate", None)
    return sqlstate == _GONE or (sqlstate == "0A000" and _RESHAPED in str(cause))


def execute(
    public_cursor: Callable[[], AbstractContextManager[Any]],
    sql: str,
    params: Sequence[Any],
    *,
    fetch: bool,
) -> Any:
    """Send one of the history's hot statements on ``public_cursor()``, prepared when
    ``enabled()``; returns its first row when ``fetch``."""
    if not enabled():
        with public_cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.fetchone() if fetch else None
    try:
        return _send_prepared(public_cursor, sql, params, fetch)
    except DatabaseError as exc:
        wrapper = connections[DEFAULT_DB_ALIAS]
        if not _stale(exc) or session.in_transaction(wrapper):
            raise
        wrapper.close()  # its cache names statements the server no longer has (module doc)
    return _send_prepared(public_cursor, sql, params, fetch)


def _send_prepared(
    public_cursor: Callable[[], AbstractContextManager[Any]],
    sql: str,
    params: Sequence[Any],
    fetch: bool,
) -> Any:
    with public_cursor() as cursor:
        _preparing(cursor)
        cursor.execute(sql, params)
        return cursor.fetchone() if fetch else None
