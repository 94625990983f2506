"""Putting the guard on every connection the job body can use, and taking it off again.

:class:`GuardSession` installs ``wrapper.GuardWrapper`` (and the guarded cursors) on every
database alias for the body only, adopts connections opened during the body
(``connection_created``), refuses those opened in another thread, and closes, when the body
ends, the wrappers the job made itself: a reference the job kept must not carry an open,
unguarded session into a later run. Kept apart from the wrapper because it is about the
connections' lifetime (Django's handler, threads), not about statements.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import pickle
import threading
from collections.abc import Callable
from typing import Any

from django.db import connections
from django.db.backends.signals import connection_created

from ..core.grants import Grant
from . import denials
from .denials import Route
from .watch import Watch, current_watch, watching
from .wrapper import GuardWrapper, guarded_routes

__all__ = ["GuardSession"]

logger = logging.getLogger("kumiko_jobs.guard")


class GuardSession:
    """The guard on every connection the job body can use, for the body only.

    Installed on every alias at the start; a connection opened during the body (an alias
    added at run time, a wrapper made anew) is adopted when it connects (``connection_created``)
    and put in the run's schema; one opened in another thread that carries the run's context
    (the async ORM, ``asyncio.to_thread``) is refused, because the guard could not be removed
    from it once the run ends.
    """

    def __init__(self, watch: Watch, *, enforce: bool, report_use: Callable[[Grant], None]) -> None:
        self.watch = watch
        self.enforce = enforce
        self.wrapper = GuardWrapper(watch, enforce=enforce, report_use=report_use)
        self.thread = threading.get_ident()
        self._stack = contextlib.ExitStack()
        self._guarded: list[Any] = []
        self._kept: list[Any] = []
        self._objects: list[_ConnectionObjects] = []

    def __enter__(self) -> GuardSession:
        # The connection_created receiver finds this installation through the current Watch.
        self._stack.enter_context(watching(self.watch))
        for conn in connections.all():
            self._install(conn)
        self.watch.guard = self
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.watch.guard = None
        self._stack.close()
        for objects in self._objects:
            objects.restore()
        for conn in self._guarded:
            if any(conn is kept for kept in self._kept):
                continue  # a connection the runner switched to for a block (tenant_connections)
            if getattr(_thread_connections(), conn.alias, None) is not conn:
                # Not (or no longer) the thread's connection for its alias: a wrapper the job
                # made or replaced. Closed, so that a reference the job kept cannot carry an
                # open, unguarded session into a later run: it connects again, and is adopted.
                _close(conn)

    def _install(self, conn: Any) -> None:
        self._objects.append(_ConnectionObjects(conn))
        self._stack.enter_context(conn.execute_wrapper(self.wrapper))
        self._stack.enter_context(guarded_routes(conn, self.wrapper))
        self._guarded.append(conn)

    def cover(self, conn: Any) -> None:
        """A connection the runner switches the body to for an escape hatch's block (the
        project's, another tenant's role's: ``tenant_connections``): guarded like the body's,
        and not closed when the body ends (it is not the job's)."""
        if not any(conn is guarded for guarded in self._guarded):
            self._install(conn)
        if not any(conn is kept for kept in self._kept):
            self._kept.append(conn)

    def adopt(self, conn: Any) -> None:
        """``conn`` has just connected during the body (``connection_created``)."""
        if any(conn is guarded for guarded in self._guarded):
            return  # a guarded connection that reconnected
        watch = self.watch
        if threading.get_ident() != self.thread:
            if self.enforce:  # in log mode the refusal is only logged
                _close(conn)
            denials.refuse(
                watch,
                Route.DATABASE,
                f"a connection (alias {conn.alias!r}) was opened in another thread during the "
                "run: the async ORM (`asyncio.run(Model.objects.aget(...))`), "
                "`asyncio.to_thread` or `sync_to_async` run queries on a connection of their "
                "own, in the public schema, which the guard cannot follow. Use the synchronous "
                "ORM in the job (or `async_to_sync`, which runs the query in the job's thread).",
                enforce=self.enforce,
            )
            return
        if watch.tenant is not None and not hasattr(conn, "set_tenant"):
            if self.enforce:
                _close(conn)
            denials.refuse_not_a_tenant_alias(watch, conn.alias, enforce=self.enforce)
            return
        self._install(conn)
        if watch.tenant is not None:
            conn.set_tenant(watch.tenant)


class _ConnectionObjects:
    """What a run could leave on a connection's Python object for the next run, of any tenant
    (the in-process worker keeps its wrappers): an execute wrapper of the job's own put where
    the guard's ``pop()`` does not take it off (it would see every later statement and its
    parameters), and the connection's settings (Django shares the dict with
    ``settings.DATABASES``: an ``OPTIONS["options"] = "-c ..."`` written there starts every
    later session, of every tenant, with it, and ``RESET ALL`` keeps startup values).

    Taken before the guard's wrapper is added, put back after it is removed (the session reset
    never sees Python objects). Settings that changed are restored in place, and the connection
    is closed, since its session may have been opened with them."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.wrappers = conn.execute_wrappers
        self.wrappers_before = list(self.wrappers)
        self.settings = conn.settings_dict
        self.settings_before = _Snapshot.of(self.settings)

    def restore(self) -> None:
        conn = self.conn
        conn.execute_wrappers = self.wrappers
        if self.wrappers != self.wrappers_before:
            self.wrappers[:] = self.wrappers_before
        if conn.settings_dict is self.settings and self.settings_before.matches(self.settings):
            return
        conn.settings_dict = self.settings
        schema = self.settings.get(_TENANTS_OWN_KEY)
        self.settings.clear()
        self.settings.update(self.settings_before.copy())
        if schema is not None:
            self.settings[_TENANTS_OWN_KEY] = schema
        logger.warning(
            "the run changed the settings of database alias %r: restored, and the connection "
            "closed",
            conn.alias,
        )
        _close(conn)


# django-tenants keeps the schema it last set in the settings (``set_tenant``, ``set_schema``):
# its bookkeeping, which changes with every switch, not a setting of the session.
_TENANTS_OWN_KEY = "SCHEMA"


class _Snapshot:
    """A connection's settings as they were, to compare with and restore from.

    Taken twice per run and connection, so it is the settings pickled (a few microseconds:
    the nested dicts hold strings, numbers and classes) rather than deep-copied (tens of
    them); a value pickle refuses is deep-copied instead."""

    __slots__ = ("_copied", "_pickled")

    def __init__(self, pickled: bytes | None, copied: dict[str, Any] | None) -> None:
        self._pickled, self._copied = pickled, copied

    @classmethod
    def of(cls, settings: dict[str, Any]) -> _Snapshot:
        own = {k: v for k, v in settings.items() if k != _TENANTS_OWN_KEY}
        try:
            return cls(pickle.dumps(own, pickle.HIGHEST_PROTOCOL), None)
        except Exception:  # an unpicklable value (a project's own object in OPTIONS)
            return cls(None, copy.deepcopy(own))

    def matches(self, settings: dict[str, Any]) -> bool:
        now = _Snapshot.of(settings)
        if self._pickled is not None and now._pickled == self._pickled:
            return True  # equal bytes: equal settings (the usual answer, and the cheap one)
        # Unequal bytes may still be equal settings (a key removed and put back moves in the
        # dict's order): compared as values.
        return now.copy() == self.copy()

    def copy(self) -> dict[str, Any]:
        """A fresh copy of the settings as they were."""
        if self._pickled is not None:
            return dict(pickle.loads(self._pickled))  # our own bytes, from of()
        return copy.deepcopy(self._copied or {})


def _on_connection_created(sender: Any, connection: Any, **kwargs: Any) -> None:
    # A thread that carries the run's context (contextvars) sees the run here, also in
    # sync_to_async's executor thread; a plain thread does not (docs/guard.md, Not covered).
    watch = current_watch()
    if watch is None:
        return
    if watch.ended or (not watch.in_body and watch.thread not in (None, threading.get_ident())):
        _refuse_outliving(watch, connection)
    installed = watch.guard
    if installed is not None:
        installed.adopt(connection)


def _refuse_outliving(watch: Watch, conn: Any) -> None:
    """A connection made from a run's context where no wall stands: after the run ended, or in
    another thread outside the body. It would log in with the project's credentials, in public,
    unguarded (both ``DB_ROLES`` modes, every ``DB_GUARD`` mode): closed and refused."""
    _close(conn)
    when = "after the run ended" if watch.ended else "in another thread, outside the job body"
    denials.refuse_outside_body(
        watch,
        Route.CONNECTION,
        f"a connection (alias {conn.alias!r}) was opened from the run's context {when}. A "
        "thread that carries a run's context (contextvars.copy_context().run, an executor "
        "started by the job) must finish its database work inside the job body: join it "
        "before the job returns.",
    )


connection_created.connect(_on_connection_created, dispatch_uid="kumiko_jobs.db_guard")


def _thread_connections() -> Any:
    """This thread's wrappers by alias, without creating any (``connections[alias]`` would)."""
    return getattr(connections, "_connections")  # noqa: B009 (private to Django's handler)


def _close(conn: Any) -> None:
    """Close ``conn`` whatever Django thinks of it (in an atomic block, another thread)."""
    raw = conn.connection
    conn.in_atomic_block, conn.atomic_blocks, conn.savepoint_ids = False, [], []
    conn.needs_rollback = False
    conn.connection = None
    if raw is not None:
        with contextlib.suppress(Exception):
            raw.close()
