"""The job body's connections log in as its tenant's role (docs/guard.md, "Two walls").

For a tenant run with ``DB_ROLES`` on, the tenancy step swaps every django-tenants alias of the
worker's thread (``connections[alias] = ...``) to a wrapper built from the alias's settings with
the tenant role's name and derived password (``guard.roles.names``), for the body only: the run's
history stays on the project's own connections, which the swap sets aside. Everything the body
reaches through Django (``connection``, ``connections[alias]``, the ORM, cursors, the raw
psycopg connection under them, connections opened during the run) is the tenant's login
session, which no SQL can turn into another identity.

Wrappers are kept per (alias, role) in a small LRU pool per thread (``DB_ROLE_POOL_SIZE``):
a worker serving a few tenants reconnects never, one serving thousands reconnects when a tenant
comes back after the pool forgot it. A forked work horse starts with an empty pool (one
connection per run): the parent's connections are never used in the child.

A ``permission denied`` from PostgreSQL inside a run is recorded on the run like a guard
denial (``DatabaseAccessDenied``; the run fails even if the job catches it), on every psycopg
route, hand-built cursors included.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections import OrderedDict
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

import psycopg
from django.db import connections
from django.db.backends.signals import connection_created
from django.db.utils import load_backend
from psycopg import ServerCursor

from ...core import conf, idle_connections, project_settings, session
from .. import denials
from ..watch import Watch, current_watch, watching
from . import names as role_names
from . import refusals, search_path

ROLE_ATTRIBUTE = "kumiko_db_role"
TENANT_ENGINE = "django_tenants.postgresql_backend"


class _Pool(threading.local):
    def __init__(self) -> None:
        self.pid = os.getpid()
        self.wrappers: OrderedDict[tuple[str, str], Any] = OrderedDict()
        self.connects = 0  # connections opened by this thread's pool (the benchmark reads it)


_pool = _Pool()


def _wrappers() -> OrderedDict[tuple[str, str], Any]:
    if _pool.pid != os.getpid():  # a forked child: the parent's sockets are not ours to use
        _pool.pid, _pool.wrappers = os.getpid(), OrderedDict()
    return _pool.wrappers


def connects() -> int:
    """How many tenant-role connections this thread's pool has opened: what the benchmark reads to
    show how often a worker reconnects.
    """
    return _pool.connects


def tenant_aliases() -> list[str]:
    """The database aliases using django-tenants' backend: the ones a tenant body's identity swap
    covers.
    """
    return [
        a for a, engine in project_settings.database_engines().items() if engine == TENANT_ENGINE
    ]


# Set by kumiko_jobs.testing, inside the attempt's context, when it runs a body in a caller's
# transaction with DB_ROLES on: the inline body runs as its tenant's role on the caller's
# connection (SET ROLE, the one identity switch that still sees the caller's rows), and the
# escape hatches below switch that connection's role as a worker switches logins:
# ``switch(kind, watch, tenant)`` for "writer", "reader", "project".
inline_roles: ContextVar[Any] = ContextVar("kumiko_jobs_inline_roles", default=None)


def _inline_switch(kind: str, watch: Watch, tenant: Any = None) -> Any:
    roles = inline_roles.get()
    return contextlib.nullcontext() if roles is None else roles.switch(kind, watch, tenant)


def enabled_for(watch: Watch) -> bool:
    """Whether the body of this run logs in as its tenant's role: a tenant run, with ``DB_ROLES``
    on, not run inline in a test's transaction (whose uncommitted rows no other login could see).

    The inline case is the run's own fact (``Watch.in_callers_transaction``, set by
    ``testing.run_jobs`` when it starts the run), not a context variable: one set by a job's
    code turned the wall off for every later run of its worker (issue 22).
    """
    return watch.tenant is not None and conf.get().DB_ROLES and not watch.in_callers_transaction


def wrapper_for(alias: str, tenant_pk: Any, suffix: str = "") -> Any:
    """The pooled wrapper of ``alias`` logged in as the tenant's role (not connected yet), or
    as one of its escape-hatch logins (``roles.names.READER_SUFFIX``, ``WRITER_SUFFIX``)."""
    role = role_names.role_name(tenant_pk, alias) + suffix
    pool = _wrappers()
    key = (alias, role)
    wrapper = pool.pop(key, None)
    if wrapper is None:
        wrapper = _new_wrapper(alias, role)
    else:
        # The last run's session reset was sent without waiting (core.session.send_discard):
        # its reply is read now, before anything else; a reset that failed closes the session.
        session.settle_reset(wrapper)
        # Ended by PostgreSQL while pooled (a restart, idle_session_timeout): closed here, before
        # the run sends anything, so the wrapper logs in anew as the same role at its first
        # statement, where the run's guard adopts it (core.idle_connections).
        idle_connections.close_if_died(wrapper)
    pool[key] = wrapper
    while len(pool) > conf.get().DB_ROLE_POOL_SIZE:
        _, evicted = pool.popitem(last=False)
        with contextlib.suppress(Exception):
            evicted.close()
    return wrapper


def _new_wrapper(alias: str, role: str) -> Any:
    settings = project_settings.database_settings(alias)
    settings["USER"] = role
    settings["PASSWORD"] = role_names.password(role)
    options = dict(settings.get("OPTIONS") or {})
    # The project's assume_role is a role the tenant cannot (and must not) become; a psycopg
    # pool would hand out the project's connections.
    options.pop("assume_role", None)
    options.pop("pool", None)
    settings["OPTIONS"] = options
    # It serves one tenant: its search path is set once, not again for every run.
    wrapper = search_path.keeping(load_backend(settings["ENGINE"]).DatabaseWrapper)(settings, alias)
    setattr(wrapper, ROLE_ATTRIBUTE, role)
    # Only wrapper_for() hands it out again, and it reads the reset's reply first.
    setattr(wrapper, session.DEFERS_RESET, True)
    original = wrapper.get_new_connection

    def get_new_connection(conn_params: Any) -> Any:
        try:
            raw = original(conn_params)
        except psycopg.OperationalError as exc:
            raise _login_failure(role, exc) from exc
        raw.cursor_factory = refusals.recording(raw.cursor_factory)
        raw.server_cursor_factory = refusals.recording(raw.server_cursor_factory or ServerCursor)
        _pool.connects += 1
        return raw

    wrapper.get_new_connection = get_new_connection
    return wrapper


def _login_failure(role: str, exc: psycopg.OperationalError) -> psycopg.OperationalError:
    """A tenant login refused because its role is missing or its password out of date (roles
    not created yet: tenants made before DB_ROLES was turned on, a restored database, another
    SECRET_KEY) says how to fix it first, where a run's error and `kumiko_jobs runs` show it;
    any other failure (the server down) is left as it is."""
    text = str(exc)
    if f'role "{role}" does not exist' not in text and f'for user "{role}"' not in text:
        return exc
    return psycopg.OperationalError(
        f"the tenant's database role {role} is missing or its password is out of date: run "
        f"`manage.py kumiko_jobs roles` (DB_ROLES; `manage.py check --database default` names "
        f"such tenants, kumiko_jobs.E012). PostgreSQL said: {text}"
    )


def close_all() -> None:
    """Close every pooled tenant connection of this thread (tests; a worker's shutdown)."""
    pool = _wrappers()
    while pool:
        _, wrapper = pool.popitem()
        with contextlib.suppress(Exception):
            wrapper.close()


# --- identity switches --------------------------------------------------------------------------


class Identity:
    """The run's swap: which wrappers the thread's aliases had before, and which the body got."""

    def __init__(self) -> None:
        self.thread = threading.get_ident()
        self.aliases = tenant_aliases()
        self.project: dict[str, Any] = {}
        self.tenant: dict[str, Any] = {}
        self.project_used = False

    def swap_to(self, wrappers: dict[str, Any]) -> dict[str, Any]:
        """Put ``wrappers`` in place of this thread's connections for their aliases (None removes
        one); returns what was there, to swap back.
        """
        local = _thread_connections()
        previous = {alias: getattr(local, alias, None) for alias in wrappers}
        for alias, wrapper in wrappers.items():
            if wrapper is None:
                with contextlib.suppress(AttributeError):
                    delattr(local, alias)
            else:
                setattr(local, alias, wrapper)
        return previous

    def project_wrapper(self, alias: str) -> Any:
        """The project's own connection for ``alias`` that the body's swap set aside, made as Django
        would and kept for the run when the thread had none yet.
        """
        wrapper = self.project.get(alias)
        if wrapper is None:  # the thread had none yet: made as Django would, kept for the run
            wrapper = self.project[alias] = connections.create_connection(alias)
        return wrapper


def _thread_connections() -> Any:
    return getattr(connections, "_connections")  # noqa: B009 (private to Django's handler)


@contextlib.contextmanager
def body_identity(watch: Watch) -> Iterator[Identity | None]:
    """For the body of a tenant run: every django-tenants alias logs in as the tenant's role.
    Yields the swap, or None (DB_ROLES off, or a system run: the project's own user)."""
    if not enabled_for(watch):
        yield None
        return
    identity = Identity()
    identity.tenant = {a: wrapper_for(a, watch.tenant.pk) for a in identity.aliases}
    identity.project = {a: w for a, w in identity.swap_to(identity.tenant).items() if w is not None}
    watch.db_identity = identity
    try:
        # The connection_created receiver and the tenant role's cursors (a denial recorded on
        # the run) find the identity through the current Watch.
        with watching(watch):
            yield identity
    finally:
        watch.db_identity = None
        identity.swap_to({a: identity.project.get(a) for a in identity.aliases})


@contextlib.contextmanager
def writer_identity(watch: Watch) -> Iterator[None]:
    """``ctx.global_writes()`` inside a tenant body: the tenant's writer login (its own
    privileges plus writes on the shared tables, nothing on other tenants), in the run's
    schema, guarded like the body's, for the block; reset when the block ends."""
    identity: Identity | None = watch.db_identity
    if identity is None:
        with _inline_switch("writer", watch):
            yield
        return
    wrappers = {
        a: wrapper_for(a, watch.tenant.pk, role_names.WRITER_SUFFIX) for a in identity.aliases
    }
    with _switched(watch, identity, wrappers, reset=True):
        yield


@contextlib.contextmanager
def project_identity(watch: Watch) -> Iterator[None]:
    """``ctx.system_db()`` inside a body with a tenant identity: the project's own
    connections, in the run's schema, for the block."""
    identity: Identity | None = watch.db_identity
    if identity is None:
        with _inline_switch("project", watch):
            yield
        return
    wrappers = {a: identity.project_wrapper(a) for a in identity.aliases}
    identity.project_used = True  # reset by the tenancy step after the run
    with _switched(watch, identity, wrappers, reset=False):
        yield


@contextlib.contextmanager
def _switched(
    watch: Watch, identity: Identity, wrappers: dict[str, Any], *, reset: bool
) -> Iterator[None]:
    """The block's connections in place of the body's, in the run's schema, guarded like the
    body's; with ``reset``, their sessions are reset when the block ends (pooled logins)."""
    for wrapper in wrappers.values():
        wrapper.set_tenant(watch.tenant)
        if watch.guard is not None:
            watch.guard.cover(wrapper)
    previous = identity.swap_to(wrappers)
    try:
        yield
    finally:
        identity.swap_to(previous)
        for wrapper in wrappers.values():
            if reset:
                session.reset_borrowed(wrapper)
            wrapper.set_schema_to_public()


@contextlib.contextmanager
def read_identity(watch: Watch, tenant: Any) -> Iterator[None]:
    """``ctx.cross_tenant_reads(t)`` inside a tenant body: ``t``'s reader login (SELECT only),
    in ``t``'s schema, in a READ ONLY transaction: PostgreSQL confines the block to reads of
    ``t`` and the shared tables, whatever transaction the block's own code ends."""
    from django.db import transaction

    identity: Identity | None = watch.db_identity
    if identity is None or tenant.pk == watch.tenant.pk:
        with _inline_switch("reader", watch, tenant):
            yield
        return
    wrappers = {a: wrapper_for(a, tenant.pk, role_names.READER_SUFFIX) for a in identity.aliases}
    previous = identity.swap_to(wrappers)
    try:
        with contextlib.ExitStack() as stack:
            for alias, wrapper in wrappers.items():
                wrapper.set_tenant(tenant)
                stack.enter_context(transaction.atomic(using=alias))
                wrapper.connection.execute("SET TRANSACTION READ ONLY")
                if watch.guard is not None:
                    watch.guard.cover(wrapper)
            yield
    finally:
        identity.swap_to(previous)
        for wrapper in wrappers.values():
            # The other tenant's own runs use this connection next: whatever the block left
            # on its session (a temp table shadowing one of that tenant's tables, a setting)
            # goes, one round trip per block.
            session.reset_borrowed(wrapper)
            wrapper.set_schema_to_public()


def _on_connection_created(sender: Any, connection: Any, **kwargs: Any) -> None:
    """During a tenant body with roles on, a connection with the project's credentials made
    anew (``connections.create_connection()``, a wrapper copied from settings, another thread
    carrying the run's context) is closed and refused: the body's identity is its tenant's."""
    watch = current_watch()
    identity: Identity | None = watch.db_identity if watch is not None else None
    if identity is None or getattr(connection, ROLE_ATTRIBUTE, None):
        return
    if any(connection is w for w in identity.project.values()) and threading.get_ident() == (
        identity.thread
    ):
        return  # the project's connection, in an identity switch the runner made
    with contextlib.suppress(Exception):
        connection.close()
    assert watch is not None
    denials.refuse(
        watch,
        denials.Route.CONNECTION,
        f"a connection (alias {connection.alias!r}) with the project's credentials was opened "
        "during the run; the job body connects as its tenant's role only (docs/guard.md, Two "
        "walls).",
    )


connection_created.connect(_on_connection_created, dispatch_uid="kumiko_jobs.tenant_connections")
