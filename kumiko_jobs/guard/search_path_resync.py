"""The path the guard judges by is the path the server has, even after a rollback Django never saw.

The guard reads an unqualified name as the run's tenant's table because django-tenants set the
connection's ``search_path`` there (``SET search_path``, sent once per ``set_tenant`` with
``TENANT_LIMIT_SET_CALLS``, and recorded in ``search_path_set_schemas``). A ``SET`` sent inside
a transaction is undone when that transaction, or a savepoint before it, rolls back: the server
goes back to the last path committed, which with ``DB_ROLES`` off is ``public`` (the history's
own statements leave it there) or another tenant's (a ``cross_tenant_reads`` block's switch).
Django's own rollbacks clear django-tenants' record, so its next cursor sets the path again; a
raw ``ROLLBACK`` or ``ROLLBACK TO SAVEPOINT`` the job sends (allowed: savepoints are how Django
nests ``atomic()``), or a ``COMMIT`` of a failed transaction, was not seen by anyone, and the
next statements, judged as the tenant's, ran on the operators' tables (their sessions) or on the
other tenant's. Found by an attacker's pass; tests/integration/test_guard_rollback_path.py.

So: after a statement that may undo a ``SET`` (``Shape.undoes_sets``) the record is forgotten
(``forget``), and before every statement the guard allows, a forgotten record (this, or
Django's own rollbacks, on a cursor the job kept) is made good on that same cursor (``ensure``):
the ``SET`` django-tenants would send, then the record. One attribute read per statement
otherwise; the ``SET`` only after such a rollback.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from psycopg import sql

__all__ = ["ensure", "forget"]


def forget(conn: Any) -> None:
    """The server's path may have been rolled back: set it again before the next statement."""
    if hasattr(conn, "_get_cursor_search_paths"):
        conn.search_path_set_schemas = None


def ensure(conn: Any, execute: Callable[..., Any], context: Mapping[str, Any]) -> None:
    """Before a statement: if django-tenants' record of the path is gone, send its ``SET`` on
    this cursor (``execute``: the next of the execute wrappers) and record it again."""
    paths_of = getattr(conn, "_get_cursor_search_paths", None)
    if paths_of is None or conn.search_path_set_schemas is not None:
        return
    if not getattr(conn, "schema_name", None):
        return  # django-tenants refuses a cursor without a schema: nothing to set here
    paths = list(paths_of())
    statement = sql.SQL("SET search_path = {}").format(
        sql.SQL(", ").join(sql.Literal(path) for path in paths)
    )
    execute(statement, None, False, context)
    conn.search_path_set_schemas = paths
