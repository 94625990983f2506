"""The guard's part of a run (``Watch``) and the run's Watch in this context (``current_watch``).

Everything the guard and the tenant's login (``guard.wrapper``, ``guard.roles.connections``) need
to know about a run, and everything they record on it, in one place: the run's schema, tenant
and write origin, the grants its job declares, the escape hatches open right now, the
violations (kept, so a job that catches the denial still fails), the installed guard, the
body's database identity, and where the run is (its thread, the body's window, its end). The
run holds its Watch (``RunState.watch``); the guard reads the Watch and never the run, so the
guard sits below the run side and imports nothing of it. ``JobContext`` opens and closes the
hatches, through the methods below only.

Pure data: this module imports nothing of Django and of kumiko only the grants' enum (which
imports nothing), so that the run state, which is imported while Django's apps load (the
logging filter), can hold a Watch. Grants are ``Grant`` members here as everywhere in the guard.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..core.grants import Grant


class Installation(Protocol):
    """The guard installed on the body's connections (``guard.install.GuardSession``)."""

    def cover(self, conn: Any) -> None:
        """Guard ``conn``, a connection the runner switches the body to for a hatch's block."""

    def adopt(self, conn: Any) -> None:
        """``conn`` has just connected during the body."""


@dataclass(slots=True)
class Watch:
    """What the guard knows of one run and records on it (module docstring)."""

    job: str
    # The run's tenant schema (None: a system run, in public).
    schema: str | None
    # The envelope's write origin (origin.request_origin()): who caused the run.
    origin: Mapping[str, Any] | None
    # The grants the job's escape hatch declares, and the job's kind.
    declared_grants: frozenset[Grant]
    system: bool
    atomic: bool
    # Run inline in a caller's open transaction (``Delivery.in_callers_transaction``): the body
    # keeps the caller's connection (no tenant login). Fixed when the run starts.
    in_callers_transaction: bool = False
    # The tenant model instance (written by the gates step through ``RunState.tenant``).
    tenant: Any = None
    # Hatches open now, innermost last (``JobContext``'s escape-hatch methods).
    active_grants: list[Grant] = field(default_factory=list)
    # The other tenant's schema inside ``ctx.cross_tenant_reads(t)``.
    readable_schema: str | None = None
    # Inside ``ctx.system_db()``: the guard steps aside.
    system_db_open: bool = False
    # Denials (the guard's, PostgreSQL's): the run fails even if the job caught them.
    violations: list[str] = field(default_factory=list)
    # The db_guard step's installation while the body runs (it adopts connections opened
    # meanwhile); None outside the body and with DB_GUARD="off".
    guard: Installation | None = None
    # The body's database identity while it runs as its tenant's role
    # (``tenant_connections.Identity``); None otherwise.
    db_identity: Any = None
    # kumiko_jobs.testing's inline body under DB_ROLES: it runs as its tenant's role on the
    # caller's connection (SET ROLE), so PostgreSQL's refusals are the run's as on a login.
    inline_role: bool = False
    # The thread the run executes in, while it runs (``run.state.running``); True once the run
    # ended. A thread that carries the run's context (``contextvars.copy_context().run``) and
    # connects from outside the body, or after the run, is refused (``guard.install``).
    thread: int | None = None
    ended: bool = False
    # Between the tenancy step's entry and exit: the body's window, where the guard and the
    # tenant login decide about connections made in other threads.
    in_body: bool = False

    @contextlib.contextmanager
    def hatch(self, grant: Grant) -> Iterator[None]:
        """``grant`` is open for the block (the job declared it: ``JobContext`` checks)."""
        self.active_grants.append(grant)
        try:
            yield
        finally:
            self.active_grants.pop()

    @contextlib.contextmanager
    def reading(self, schema: str) -> Iterator[None]:
        """The block may read ``schema`` (``ctx.cross_tenant_reads``)."""
        self.readable_schema = schema
        try:
            yield
        finally:
            self.readable_schema = None

    @contextlib.contextmanager
    def stepped_aside(self) -> Iterator[None]:
        """The guard lets the block's statements through unjudged (``ctx.system_db``, kumiko's
        own history reads); nested blocks keep the outer one open."""
        previous = self.system_db_open
        self.system_db_open = True
        try:
            yield
        finally:
            self.system_db_open = previous


# The Watch of the run whose guard hooks are live in this context: set for their block by what
# installs them (the guard's ``GuardSession``, the tenant login's ``body_identity``), read
# where no run is at hand (the connection_created receivers, the tenant role's cursors).
_current: ContextVar[Watch | None] = ContextVar("kumiko_jobs_current_watch", default=None)


def current_watch() -> Watch | None:
    """The Watch of the run whose guard or tenant login is live in this context, or None."""
    return _current.get()


@contextlib.contextmanager
def watching(watch: Watch) -> Iterator[Watch]:
    """``watch`` is the current Watch for the block."""
    token = _current.set(watch)
    try:
        yield watch
    finally:
        _current.reset(token)
