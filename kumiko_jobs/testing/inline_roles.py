"""Under ``DB_ROLES``, a body run inside a test's transaction runs as its tenant's role.

A worker's body logs in as its tenant's role (``guard.roles.connections``), so PostgreSQL refuses
whatever that role may not do. Inside pytest-django's ``db`` fixture the body must see the
test's uncommitted rows, which no other login can; so it runs on the test's own connection
after ``SET ROLE <the tenant's role>``: PostgreSQL checks its statements against the same
privileges as on a worker (an ``unsafe_raw`` block that reads another tenant's schema is
refused here too, instead of passing in tests and failing on every worker). The escape hatches
switch the role as a worker switches logins (``guard.roles.connections.inline_roles``):
``global_writes()`` to the tenant's writer, ``cross_tenant_reads(t)`` to ``t``'s reader,
``system_db()`` back to the project's user. PostgreSQL's ``permission denied`` is the run's
denial (``DatabaseAccessDenied``), recorded as a worker records it.

``SET ROLE`` is no wall (any SQL can ``RESET ROLE``), and it need not be one here: the test
reproduces the privileges, the worker's separate login is the isolation. A superuser may become
any role; a project user that is not one (``CREATEROLE``, docs/guard.md) is granted membership
in the role for the body (``GRANT ... TO session_user``) and it is revoked after it, inside the
test's transaction: no other session sees the membership, and a rolled-back test keeps none.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from django.db import connection
from psycopg import sql
from psycopg.pq import TransactionStatus

from ..guard.roles import names as role_names
from ..guard.roles import refusals


class MissingTenantRole(AssertionError):
    """``DB_ROLES`` is on and the run's tenant has no role in the test database."""


def role_of(tenant: Any) -> str:
    """The tenant's role, which must exist (a clear error naming the fix otherwise)."""
    role = role_names.role_name(tenant.pk)
    with connection.cursor() as cursor:
        cursor.execute("SELECT to_regrole(quote_ident(%s)) IS NOT NULL", [role])
        (exists,) = cursor.fetchone()
    if not exists:
        raise MissingTenantRole(
            f"KUMIKO_JOBS['DB_ROLES'] is on and tenant {tenant.schema_name!r} has no database "
            f"role ({role}) in the test database, so its jobs cannot run as they would on a "
            "worker. Create the session's tenants with DB_ROLES on (saving a tenant creates its "
            "role), or call kumiko_jobs.guard.roles.sync.sync_all() after creating them."
        )
    return role


class InlineRoles:
    """The role switches of one inline body on the caller's connection (module doc)."""

    def __init__(self, conn: Any, tenant: Any) -> None:
        self.conn = conn
        self.tenant = tenant
        self.raw = conn.connection  # psycopg's: kumiko's own switches are not the body's SQL
        row = self.raw.execute(
            "SELECT current_user, rolsuper FROM pg_roles WHERE rolname = session_user"
        ).fetchone()
        self.before, self.superuser = row[0], bool(row[1])
        self.current: str = self.before
        self.granted: list[str] = []
        self.factories: tuple[Any, Any] | None = None

    def enter(self, role: str) -> None:
        """The body's role, and PostgreSQL's refusals recorded as the run's denials."""
        self._become(role)
        raw = self.raw
        self.factories = (raw.cursor_factory, raw.server_cursor_factory)
        raw.cursor_factory = refusals.recording(raw.cursor_factory)
        if raw.server_cursor_factory is not None:
            raw.server_cursor_factory = refusals.recording(raw.server_cursor_factory)

    def leave(self) -> None:
        """Back to the caller's role; memberships granted for the body revoked. Not when the
        transaction failed: rolling back to the body's savepoint undoes all of it."""
        if self.factories is not None:
            self.raw.cursor_factory, self.raw.server_cursor_factory = self.factories
            self.factories = None
        if self._aborted():
            return
        self._become(self.before)
        for role in self.granted:
            self.raw.execute(
                sql.SQL("REVOKE {} FROM {}").format(
                    sql.Identifier(role), sql.Identifier(self.session_user)
                )
            )
        self.granted.clear()

    @contextlib.contextmanager
    def switch(self, kind: str, watch: Any, tenant: Any = None) -> Iterator[None]:
        """An escape hatch's identity, for its block (``guard.roles.connections.inline_roles``)."""
        if kind == "writer":
            target = role_names.writer_name(self.tenant.pk)
        elif kind == "reader":
            if tenant is None or tenant.pk == self.tenant.pk:
                yield  # its own schema: the body's role already reads it
                return
            target = role_names.reader_name(tenant.pk)
        else:  # "project": ctx.system_db()
            target = self.before
        previous = self.current
        self._become(target)
        try:
            yield
        finally:
            if not self._aborted():
                self._become(previous)

    @property
    def session_user(self) -> str:
        return str(self.raw.info.user)

    def _become(self, role: str) -> None:
        if role != self.session_user and not self.superuser and role not in self.granted:
            member = self.raw.execute(
                "SELECT pg_has_role(session_user, %s, 'MEMBER')", [role]
            ).fetchone()[0]
            if not member:
                # Granted by the session's own user: the role in force may be a tenant's.
                self.raw.execute("RESET ROLE")
                self.raw.execute(
                    sql.SQL("GRANT {} TO {}").format(
                        sql.Identifier(role), sql.Identifier(self.session_user)
                    )
                )
                self.granted.append(role)
        self.raw.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(role)))
        self.current = role

    def _aborted(self) -> bool:
        return bool(self.raw.info.transaction_status == TransactionStatus.INERROR)
