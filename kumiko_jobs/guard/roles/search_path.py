"""A tenant role's connection keeps its ``search_path`` from run to run instead of setting it again.

django-tenants sends ``SET search_path`` on the first cursor after every ``set_tenant`` (with
``TENANT_LIMIT_SET_CALLS``; before every query without it). A worker calls ``set_tenant`` at
least twice per run: into the run's tenant for the body, back to public after it. On the
project's connection that is needed, since the next run may be another tenant's. A tenant
role's pooled connection (``guard.roles.connections``) serves one tenant only, so every run of it
set the same path again: one round trip per run for nothing.

``keeping(base)`` is django-tenants' wrapper class with one change: ``set_tenant`` keeps the
record that the path is set when the path it asks for is the one the server already has on
this same session. What the server has is known only from django-tenants' own bookkeeping
(``search_path_set_schemas``), and trusted only when it cannot have been undone since:

* set by a ``SET`` that ran outside a transaction (in autocommit the ``SET`` is committed
  session state; one inside a transaction can be rolled back by a raw ``ROLLBACK`` or
  ``ROLLBACK TO SAVEPOINT`` that Django never sees),
* on the same psycopg connection (a reconnect, however it came about, starts from the role's
  default path),
* not behind a pooler in transaction mode (``DB_POOLER = "transaction"``: the next
  transaction may run on another server session, whose path nobody set),
* and not cleared since: every ``search_path_set_schemas = None`` outside ``set_tenant``
  (django-tenants' ``close``, ``rollback``, ``savepoint_rollback``, a failed ``SET``;
  kumiko's ``DISCARD ALL`` and its rollback of a transaction a run left open,
  ``core.session``) forgets it.

Whatever a job does to its session's path (under the guard's ``unsafe_raw``, with the guard off,
or past it on the raw driver), the tenancy step resets every session after every run with
``DISCARD ALL`` and sets the kept path again in the same round trip (``kept_path``,
``path_set_again``): the server's path is then known again, whatever the run did.
Without ``TENANT_LIMIT_SET_CALLS`` django-tenants sets the path before every query whatever
this records, so nothing changes there.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from psycopg.pq import TransactionStatus

from ...core import conf, project_settings

__all__ = ["keeping", "settle"]


# Over 60 lines because it holds a class: the subclass of a base known only at run time
# (django-tenants' wrapper, or the project's subclass of it), whose methods are each short and
# read together, since they share the record of the server's path.
@cache
def keeping(base: type) -> type:  # long: one class, defined around its run-time base
    """``base`` (django-tenants' ``DatabaseWrapper``, or a subclass) keeping its search path across
    ``set_tenant`` calls (module docstring); one class per base."""

    class KeepsSearchPath(base):  # type: ignore[misc]  # a class known at run time only
        _kumiko_keeps_search_path = True
        # Inside set_tenant: its "None" means "another tenant", not "the server's path is unknown".
        _kumiko_in_set_tenant = False
        # The path the server has (a trusted SET), and the psycopg connection it was set on.
        _kumiko_server_path: list[str] | None = None
        _kumiko_server_connection: Any = None

        @property
        def search_path_set_schemas(self) -> list[str] | None:
            """django-tenants' record of the path it set (None: set it before the next query)."""
            return self.__dict__.get("_kumiko_path_set")

        @search_path_set_schemas.setter
        def search_path_set_schemas(self, value: list[str] | None) -> None:
            self.__dict__["_kumiko_path_set"] = value
            if self._kumiko_in_set_tenant:
                return
            raw = getattr(self, "connection", None)
            trusted = (
                value is not None
                and raw is not None
                and raw.info.transaction_status == TransactionStatus.IDLE
            )
            self._kumiko_server_path = list(value) if trusted and value is not None else None
            self._kumiko_server_connection = raw if trusted else None

        def kept_path(self) -> list[str] | None:
            """The path the server has on this session, when it is trusted (module docstring):
            the session reset sets it again in the same round trip (``core.session.discard``)."""
            raw = getattr(self, "connection", None)
            if raw is None or raw is not self._kumiko_server_connection:
                return None
            return None if self._kumiko_server_path is None else list(self._kumiko_server_path)

        def path_set_again(self, path: list[str]) -> None:
            """The session reset has just set ``path`` again, in autocommit, on this session: the
            server has it, so it is kept (and counts as set if the wrapper points there now)."""
            self._kumiko_server_path = list(path)
            self._kumiko_server_connection = self.connection
            try:
                wanted = self._get_cursor_search_paths()
            except Exception:  # an invalid schema name: django-tenants refuses it at the cursor
                wanted = None
            self.__dict__["_kumiko_path_set"] = list(path) if wanted == path else None

        def set_tenant(self, tenant: Any, include_public: bool = True) -> None:
            """django-tenants' ``set_tenant``, keeping the record of a path the server already has
            on this session (module docstring)."""
            self._kumiko_in_set_tenant = True
            try:
                super().set_tenant(tenant, include_public)
            finally:
                self._kumiko_in_set_tenant = False
            known = self._kumiko_server_path
            raw = self.connection
            if known is None or raw is None or raw is not self._kumiko_server_connection:
                return
            if conf.get().DB_POOLER == "transaction":
                return  # each transaction may get another server session: nothing is kept
            try:
                wanted = self._get_cursor_search_paths()
            except Exception:  # an invalid schema name: django-tenants refuses it at the cursor
                return
            if wanted == known:
                self.__dict__["_kumiko_path_set"] = known

    KeepsSearchPath.__name__ = KeepsSearchPath.__qualname__ = f"KeepsSearchPath{base.__name__}"
    return KeepsSearchPath


def settle(wrapper: Any) -> None:
    """Set ``wrapper``'s search path now, in autocommit, if it is not known to be set: before a
    transaction opens on it (``@job(atomic=True)``), so that the ``SET`` is kept for later runs
    instead of being sent inside the transaction, where it is not trusted (module docstring).

    Only on a tenant role's connection made by ``keeping`` and with ``TENANT_LIMIT_SET_CALLS``
    (without it django-tenants sets the path before every query, and this would add one);
    costs no round trip when the path is kept, one ``SET`` otherwise, the one the body's first
    query would have sent.
    """
    if not getattr(wrapper, "_kumiko_keeps_search_path", False):
        return
    if not project_settings.limit_set_calls() or wrapper.in_atomic_block:
        return
    if wrapper.search_path_set_schemas is not None:
        return
    wrapper.ensure_connection()
    if wrapper.connection.info.transaction_status != TransactionStatus.IDLE:
        return
    with wrapper.cursor():
        pass  # django-tenants sends the SET when it hands out the cursor
