"""A connection kept between runs may have died while idle: close it before a run uses it.

A worker keeps its connections from run to run (``run.steps.tenancy.reset_connections``), the
tenant roles' logins too (``guard.roles.connections``). While one sits idle, PostgreSQL may end its
session: a restart or failover, ``pg_terminate_backend``, ``idle_session_timeout``, a proxy
closing it. psycopg learns of it only when it next sends a statement, so the next run would
fail on its first one (docs/reliability.md, "Outages").

Django's answer is ``CONN_HEALTH_CHECKS``: a ``SELECT 1`` before a connection's first use in a
request, one round trip every time. Here it costs none: a session that ends sends its client
a FATAL error and closes the socket, so the socket of an idle connection turns readable. One
``poll()`` with no wait per kept connection per run sees it; a connection whose socket is
readable while nothing was asked of it is closed, and its wrapper connects anew (with the same
settings, so as the same role) at its next statement. The check runs before any statement of
the run, so nothing is ever sent twice. The only other thing PostgreSQL sends unprompted is a
``NOTIFY`` to a session that ran ``LISTEN``, which kumiko resets after a run (core.session):
such a connection would cost one reconnect, never a failure.

What it cannot see: a peer that vanished without a word (a cable cut, a silent firewall drop),
which only a round trip or TCP keepalives find; the statement then fails as before.
"""

from __future__ import annotations

import contextlib
import select
from typing import Any

from django.db import connections
from psycopg.pq import ConnStatus, TransactionStatus


def died(raw: Any) -> bool:
    """Whether psycopg connection ``raw``, idle, was closed or spoken to by the server (module
    doc): no round trip, one ``poll()``."""
    if raw.closed or raw.broken:
        return True
    pgconn = raw.pgconn
    if pgconn.status != ConnStatus.OK:
        return True
    if pgconn.transaction_status != TransactionStatus.IDLE:
        return False  # a statement in flight or a transaction: not idle, not ours to judge
    try:
        poller = select.poll()
        poller.register(pgconn.socket, select.POLLIN)
        return bool(poller.poll(0))
    except Exception:  # psycopg raises if the socket is already gone: dead too
        return True


def close_if_died(conn: Any) -> bool:
    """Close Django's wrapper ``conn`` if its connection died while idle, so that its next
    statement connects anew; True if it did. A connection inside ``atomic()`` is left alone:
    closing it would lose the transaction's place (it fails at its next statement as before)."""
    raw = conn.connection
    if raw is None or conn.in_atomic_block or not died(raw):
        return False
    with contextlib.suppress(Exception):  # a dead socket may refuse even its own close
        conn.close()
    return True


def close_dead() -> list[str]:
    """Before a run: close this thread's Django connections that died while idle (the history's
    and, without ``DB_ROLES``, the body's). Returns their aliases."""
    return [conn.alias for conn in connections.all(initialized_only=True) if close_if_died(conn)]
