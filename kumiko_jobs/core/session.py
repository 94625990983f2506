"""Nothing outlives a run: the worker's connections go back to a clean session after each one.

The in-process worker keeps its connections from run to run (that is its speed), and a
PostgreSQL session keeps more than data: an open transaction, settings (``SET``,
``set_config(..., false)``, ``UPDATE pg_settings``), session advisory locks, prepared
statements, ``LISTEN`` channels, temporary tables, cursors held past their transaction. Left
behind by one run, any of them reaches the next, of whatever tenant.

* An open transaction (a raw ``BEGIN``, an ``atomic()`` never exited, autocommit switched off)
  is always looked for; the check is client-side (psycopg knows the server's transaction state
  from every reply), so it costs no round trip. It is rolled back, and the run fails.
* Everything else is reset with ``DISCARD ALL`` (spelled out, so that Django's time zone, and a
  tenant login's kept ``search_path``, are set again in the same statement): one statement per
  open connection, after **every** run. On a tenant login's pooled connection (``DB_ROLES``)
  the worker does not wait for its reply: it is sent, the run's finish is written meanwhile,
  and the reply is read after it, before the worker takes its next message (``send_discard``,
  ``settle_resets``; and in any case before the connection serves anything else); a reset
  that failed closes the connection then. It used to be sent only when the guard had seen a
  statement that might change the session; statements sent past it (libpq's
  ``pgconn.exec_()``, a hand-built ``psycopg.Cursor``) were never seen, and a session advisory
  lock, a temporary table or a setting they left stayed for the next run (issue 22). What a
  route is cannot be known from the routes one watches, so nothing is inferred from them.

docs/guard.md ("Nothing outlives a run") has the reasoning and the costs.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any

from django.db import connections
from django_tenants.postgresql_backend.base import DatabaseWrapper as TenantDatabaseWrapper
from psycopg import ClientCursor, generators, sql
from psycopg.pq import ExecStatus, TransactionStatus

logger = logging.getLogger("kumiko_jobs.session")


def in_transaction(conn: Any) -> bool:
    """Whether ``conn`` is inside a transaction: Django's atomic block or the server's own."""
    if conn.in_atomic_block:
        return True
    raw = conn.connection
    if raw is None:
        return False
    return bool(raw.info.transaction_status != TransactionStatus.IDLE)


def busy_aliases() -> frozenset[str]:
    """Aliases already inside a transaction before the run: a caller's (a run executed inline
    in a test's ``atomic()``), not the run's to end."""
    return frozenset(
        conn.alias for conn in connections.all(initialized_only=True) if in_transaction(conn)
    )


def clean_up(busy: frozenset[str]) -> list[str]:
    """Reset every open connection the run may have used; returns the aliases it left in a
    transaction.

    Every initialised connection of this thread with an open session is reset, whatever the run
    sent on it and by which route (module docstring); ``busy`` ones (a caller's transaction
    around an inline run) are the caller's. Never raises: a connection that cannot be cleaned
    is closed (the next run reconnects).
    """
    left_open = []
    for conn in connections.all(initialized_only=True):
        if conn.alias in busy or conn.connection is None:
            continue
        try:
            settle_reset(conn)  # a reset still unread (never here in the worker: defensive)
            if conn.connection is None:
                continue
            if in_transaction(conn):
                left_open.append(conn.alias)
                roll_back(conn)
            if _may_defer(conn):
                send_discard(conn)
            else:
                discard(conn)
        except Exception as exc:
            logger.warning("closing connection %r: it could not be reset (%r)", conn.alias, exc)
            forget_transaction(conn)
            with contextlib.suppress(Exception):
                conn.close()
    return left_open


def forget_transaction(conn: Any) -> None:
    """Django's bookkeeping of a transaction the run left: atomic blocks it never exited,
    savepoints, and ``on_commit`` callbacks, which must never run."""
    conn.in_atomic_block = False
    conn.atomic_blocks = []
    conn.savepoint_ids = []
    conn.savepoint_state = 0
    conn.needs_rollback = False
    conn.commit_on_exit = True
    conn.closed_in_transaction = False
    conn.run_on_commit = []


def roll_back(conn: Any) -> None:
    """End the transaction the run left open, whatever opened it."""
    forget_transaction(conn)
    conn.connection.rollback()  # psycopg sends ROLLBACK unless the server is idle
    if hasattr(conn, "search_path_set_schemas"):
        conn.search_path_set_schemas = None  # as django-tenants' own rollback() does
    autocommit = conn.settings_dict["AUTOCOMMIT"]
    if conn.get_autocommit() != autocommit:
        conn.set_autocommit(autocommit)


# DISCARD ALL, spelled out: DISCARD ALL itself refuses to run in a multi-statement query,
# and Django's time zone (and role) must be set again after it, in the same round trip.
DISCARD_ALL = (
    "CLOSE ALL; SET SESSION AUTHORIZATION DEFAULT; RESET ALL; DEALLOCATE ALL; UNLISTEN *; "
    "SELECT pg_advisory_unlock_all(); DISCARD PLANS; DISCARD TEMP; DISCARD SEQUENCES"
)


def reset_statement(conn: Any, kept_path: list[str] | None = None) -> str:
    """``DISCARD ALL`` and what Django sets up on a new connection, as one simple query.

    ``RESET ALL`` also resets ``TimeZone`` and the role, which Django sets after connecting
    (``_configure_connection``): both are set again here, with Django's own statements. With
    ``kept_path`` (a tenant login's path, which it keeps from run to run:
    guard/roles/search_path.py) the path is set again too, so the reset costs the next run no
    ``SET search_path``.
    """
    statements = [DISCARD_ALL]
    # Quoted client-side: Django's ops.compose_sql() would open a (django-tenants) cursor.
    raw = conn.connection
    quote = ClientCursor(raw).mogrify
    time_zone = getattr(conn, "timezone_name", None)
    if time_zone and hasattr(conn.ops, "set_time_zone_sql"):
        statements.append(quote(conn.ops.set_time_zone_sql(), [time_zone]))
    role = conn.settings_dict.get("OPTIONS", {}).get("assume_role")
    if role:
        statements.append(quote("SET ROLE %s", [role]))  # as Django sets it
    if kept_path:
        path = sql.SQL(", ").join(sql.Identifier(schema) for schema in kept_path)
        statements.append(sql.SQL("SET search_path = {}").format(path).as_string(raw))
    return "; ".join(statements)


def discard(conn: Any, *, raw: bool = False) -> None:
    """Back to a session as new, in one round trip (see ``reset_statement``).

    psycopg clears its own prepared-statement cache when it sees ``DEALLOCATE ALL`` go through.
    django-tenants forgets the search path it believes set, and sends it again on the next
    cursor (as it does after every run anyway), except on a tenant login whose kept path the
    reset has just set again (``guard.roles.search_path``: ``kept_path``, ``path_set_again``): the
    next run of that tenant sends no ``SET``.
    """
    kept_path = getattr(conn, "kept_path", None)
    kept = kept_path() if kept_path is not None else None
    statement = reset_statement(conn, kept)
    if raw:  # past Django's cursor, and so past a guard still installed on ``conn``
        conn.connection.execute(statement)
    else:
        with plain_cursor(conn) as cursor:
            cursor.execute(statement)
    if hasattr(conn, "search_path_set_schemas"):
        conn.search_path_set_schemas = None
    if kept is not None:
        conn.path_set_again(kept)


# A wrapper whose reset may be sent without waiting for its reply (``guard.roles.connections``
# sets it on the tenant logins' pooled wrappers: nothing reaches them between two runs but
# ``wrapper_for``, which calls ``settle_reset`` first).
DEFERS_RESET = "kumiko_defers_reset"
# On such a wrapper: the psycopg connection whose reset reply is still unread.
_PENDING = "_kumiko_reset_pending"


class _Unread(threading.local):
    def __init__(self) -> None:
        self.wrappers: list[Any] = []  # this thread's wrappers with a reset reply unread


_unread = _Unread()


def _may_defer(conn: Any) -> bool:
    """Whether ``conn``'s reset may be left unread (``send_discard``): a pooled tenant login,
    idle, with no error in the run (after one, the tenancy step asks ``is_usable()``, a
    statement), and no statement psycopg prepared (it would not see the ``DEALLOCATE ALL``)."""
    raw = conn.connection
    return (
        bool(getattr(conn, DEFERS_RESET, False))
        and not conn.errors_occurred
        and raw is not None
        and raw.prepare_threshold is None
        and raw.pgconn.transaction_status == TransactionStatus.IDLE
    )


def send_discard(conn: Any) -> None:
    """``discard(conn)`` without waiting for its reply: the reset is sent (one simple query, as
    ``discard`` sends it) and the worker goes on to the run's finish while PostgreSQL resets the
    session. ``settle_reset`` reads the reply before the connection is used again; until then
    nothing else may be sent on it (the pooled tenant logins: ``DEFERS_RESET``).

    The path is recorded as set again now: PostgreSQL runs a session's statements in order, so
    whatever runs next on it runs after the reset, and a reset that failed closes the connection
    (``settle_reset``), which forgets the record with it.
    """
    kept_path = getattr(conn, "kept_path", None)
    kept = kept_path() if kept_path is not None else None
    statement = reset_statement(conn, kept)
    raw = conn.connection
    send_reset(raw, statement)
    conn.__dict__[_PENDING] = raw
    _unread.wrappers.append(conn)
    if hasattr(conn, "search_path_set_schemas"):
        conn.search_path_set_schemas = None
    if kept is not None:
        conn.path_set_again(kept)


def send_reset(raw: Any, statement: str) -> None:
    """Send ``statement`` on psycopg connection ``raw`` as a simple query, and return once it is
    written, without reading the reply (tests count the resets here)."""
    raw.pgconn.send_query(statement.encode(raw.info.encoding))
    raw.wait(generators.send(raw.pgconn))


def reset_pending(conn: Any) -> bool:
    """Whether ``conn``'s last reset was sent and its reply not read yet."""
    raw = conn.__dict__.get(_PENDING)
    return raw is not None and raw is conn.connection and not raw.closed


def settle_resets() -> None:
    """``settle_reset`` every wrapper of this thread whose reset reply is unread: the records step
    calls it once the run's finish is written, so the reset is confirmed (or its session closed)
    before the worker takes its next message. By then the reply has long arrived: reading it
    costs no wait."""
    wrappers, _unread.wrappers = _unread.wrappers, []
    for conn in wrappers:
        settle_reset(conn)


def settle_reset(conn: Any) -> None:
    """Read the reply of the reset ``send_discard`` left unread on ``conn``, if any: before the
    connection serves anything else. If the reset failed (an error from any of its statements,
    which skips the rest of them) or the connection was lost, the connection is closed: its
    wrapper logs in anew at its next statement, to a new session. Never raises."""
    raw = conn.__dict__.pop(_PENDING, None)
    if raw is None or raw is not conn.connection or raw.closed:
        return  # none left unread, or that session is gone already
    try:
        results = raw.wait(generators.fetch_many(raw.pgconn))
        failed = [r for r in results if r.status == ExecStatus.FATAL_ERROR]
        if failed:
            message = failed[0].error_message.decode(raw.info.encoding, "replace")
            raise RuntimeError(message.strip())
        if raw.pgconn.transaction_status != TransactionStatus.IDLE:
            raise RuntimeError(f"left in state {raw.pgconn.transaction_status.name}")
    except Exception as exc:
        logger.warning("closing connection %r: its reset failed (%r)", conn.alias, exc)
        forget_transaction(conn)
        with contextlib.suppress(Exception):
            conn.close()


def reset_borrowed(conn: Any) -> None:
    """A connection an escape hatch borrowed (another tenant's role inside
    ``cross_tenant_reads``): always reset when the block ends, since the next user of it is
    that tenant's own run. Closed when it cannot be reset."""
    try:
        settle_reset(conn)
        if conn.connection is None:
            return  # closed by settle_reset: a new session at its next statement
        if in_transaction(conn):
            roll_back(conn)
        discard(conn, raw=True)  # the body's guard still covers it while the block unwinds
    except Exception as exc:
        logger.warning("closing borrowed connection: it could not be reset (%r)", exc)
        forget_transaction(conn)
        with contextlib.suppress(Exception):
            conn.close()


@contextlib.contextmanager
def plain_cursor(conn: Any) -> Any:
    """Django's cursor for ``conn`` (wrappers, error translation), without the ``SET
    search_path`` django-tenants would send first: the statements sent on it name no table."""
    if isinstance(conn, TenantDatabaseWrapper):
        cursor = super(TenantDatabaseWrapper, conn)._cursor()
    else:
        cursor = conn.cursor()
    try:
        yield cursor
    finally:
        cursor.close()
