"""Unit tests for the tenancy step (run/steps/tenancy.py): no database.

Entering a schema is django-tenants' bookkeeping on the connection object (no statement until a
query runs), so the tests use the real ``tenant_context`` and read ``connection.schema_name``.
The clean-up of the sessions (``core.session.clean_up``) and the DB_ROLES login swap
(``guard.roles.connections.body_identity``) are replaced by recording fakes. Pinned: a system
run stays in public, a tenant run's body runs in the tenant's schema and the connection is back
in public afterwards, whatever the body did (switched schema, raised); a transaction the body
left open fails the run (``Unrecoverable``), unless the body's own exception is already on its
way up; a caller's transaction (busy aliases) is left alone; under DB_ROLES the body's
connections are cleaned without the caller's busy set, and the project's again when
``ctx.system_db()`` used them.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from django.db import connection, connections

from kumiko_jobs.core import project_settings, session
from kumiko_jobs.core.exceptions import Unrecoverable
from kumiko_jobs.guard.roles import connections as tenant_connections
from kumiko_jobs.guard.watch import Watch
from kumiko_jobs.run.state import RunState
from kumiko_jobs.run.steps.tenancy import tenancy
from tests.unit.states import make_state

TENANT = SimpleNamespace(schema_name="t1", pk=1)


@dataclass
class Sessions:
    """``session.busy_aliases`` and ``session.clean_up``: ``left_open`` is what each clean-up
    (in turn) reports left in a transaction; ``cleanups`` what each was asked."""

    busy: frozenset[str] = frozenset()
    left_open: list[list[str]] = field(default_factory=list)
    cleanups: list[tuple[frozenset[str], str]] = field(default_factory=list)

    def busy_aliases(self) -> frozenset[str]:
        return self.busy

    def clean_up(self, busy: frozenset[str]) -> list[str]:
        self.cleanups.append((busy, connection.schema_name))
        return self.left_open.pop(0) if self.left_open else []


@pytest.fixture
def sessions(monkeypatch: pytest.MonkeyPatch) -> Iterator[Sessions]:
    """The fake sessions, with the project's own login for the body (no DB_ROLES swap: the
    tests below that want one install it)."""
    # A connection some other test file opened while this session collected (when the unit
    # tests run with the integration tests) would be checked by reset_connections: these tests
    # are about the schema bookkeeping and must touch no database, so they start without one.
    for conn in connections.all(initialized_only=True):
        if conn.connection is not None and not conn.in_atomic_block:
            conn.close()
    fake = Sessions()
    monkeypatch.setattr(session, "busy_aliases", fake.busy_aliases)
    monkeypatch.setattr(session, "clean_up", fake.clean_up)
    _roles(monkeypatch, None)
    yield fake
    connection.set_schema_to_public()  # whatever a failing test left


def public() -> str:
    return project_settings.public_schema_name()


class Rest:
    """The rest of the pipeline: notes the schema it ran in, then does ``then``."""

    def __init__(self, then: Any = None) -> None:
        self.schemas: list[str] = []
        self.then = then

    def __call__(self, state: RunState) -> None:
        self.schemas.append(connection.schema_name)
        if self.then is not None:
            self.then(state)


def test_a_system_run_stays_in_public(sessions: Sessions) -> None:
    state, rest = make_state(None, kwargs={}, system=True), Rest()
    tenancy(state, rest)
    assert rest.schemas == [public()]
    assert len(sessions.cleanups) == 1


def test_a_tenant_run_enters_its_schema_and_leaves_it(sessions: Sessions) -> None:
    state, rest = make_state("t1", tenant=TENANT), Rest()
    tenancy(state, rest)
    assert rest.schemas == ["t1"]
    assert connection.schema_name == public()
    [(busy, _)] = sessions.cleanups
    assert busy == frozenset()


def test_a_body_that_switched_schema_is_put_back_in_public(sessions: Sessions) -> None:
    state = make_state("t1", tenant=TENANT)
    tenancy(state, Rest(lambda s: connection.set_schema("t2")))
    assert connection.schema_name == public()


@pytest.mark.parametrize("schema", ["t1", None], ids=["tenant-run", "system-run"])
def test_every_run_leaves_the_connection_in_public_wherever_it_started(
    sessions: Sessions, schema: str | None
) -> None:
    connection.set_schema("t2")  # e.g. a caller running the pipeline inside a tenant
    options: dict[str, Any] = {"tenant": TENANT} if schema else {"system": True, "kwargs": {}}
    tenancy(make_state(schema, **options), Rest())
    assert connection.schema_name == public()


def test_a_body_that_raises_is_cleaned_up_and_its_error_passes_up(sessions: Sessions) -> None:
    sessions.left_open = [["default"]]

    def raising(state: RunState) -> None:
        raise ValueError("the body's")

    with pytest.raises(ValueError, match="the body's"):
        tenancy(make_state("t1", tenant=TENANT), Rest(raising))
    assert len(sessions.cleanups) == 1
    assert connection.schema_name == public()


def test_a_transaction_left_open_fails_the_run(sessions: Sessions) -> None:
    sessions.left_open = [["default", "other"]]
    with pytest.raises(Unrecoverable, match="left a transaction open on database alias") as err:
        tenancy(make_state("t1", tenant=TENANT), Rest())
    assert "'default', 'other'" in str(err.value)
    assert "was rolled back" in str(err.value)
    assert connection.schema_name == public()


def test_a_callers_transaction_is_not_the_runs_to_end(sessions: Sessions) -> None:
    sessions.busy = frozenset({"default"})
    state = make_state("t1", tenant=TENANT)
    tenancy(state, Rest())
    [(busy, _)] = sessions.cleanups
    assert busy == frozenset({"default"})


def test_the_body_window_is_marked_on_the_watch(sessions: Sessions) -> None:
    """Other threads' connections are refused outside it (guard.install)."""
    state = make_state("t1", tenant=TENANT)
    inside: list[bool] = []
    tenancy(state, Rest(lambda s: inside.append(s.watch.in_body)))
    assert inside == [True]
    assert state.watch.in_body is False


@dataclass
class Identity:
    """What ``body_identity`` yields under DB_ROLES: the swapped aliases, and whether the body
    used the project's own connections (``ctx.system_db()``)."""

    project_used: bool
    aliases: tuple[str, ...] = ("default",)


def _roles(monkeypatch: pytest.MonkeyPatch, identity: Identity | None) -> list[Watch]:
    """``body_identity`` yields ``identity`` (None: the project's login, as with DB_ROLES off)."""
    entered: list[Watch] = []

    @contextmanager
    def body_identity(watch: Watch) -> Iterator[Identity | None]:
        entered.append(watch)
        yield identity

    monkeypatch.setattr(tenant_connections, "body_identity", body_identity)
    return entered


def test_under_db_roles_the_bodys_connections_are_cleaned_without_the_callers_busy_set(
    monkeypatch: pytest.MonkeyPatch, sessions: Sessions
) -> None:
    entered = _roles(monkeypatch, Identity(project_used=False))
    sessions.busy = frozenset({"default"})
    state = make_state("t1", tenant=TENANT)
    tenancy(state, Rest())
    assert entered == [state.watch]
    [(busy, _)] = sessions.cleanups
    assert busy == frozenset()  # the tenant login's pooled connections: never a caller's


def test_under_db_roles_the_projects_connections_used_by_the_body_are_reset_too(
    monkeypatch: pytest.MonkeyPatch, sessions: Sessions
) -> None:
    _roles(monkeypatch, Identity(project_used=True))
    sessions.busy = frozenset({"other"})
    sessions.left_open = [[], ["default"]]
    state = make_state("t1", tenant=TENANT)
    with pytest.raises(Unrecoverable, match="'default'"):
        tenancy(state, Rest())
    (body_busy, _), (project_busy, _) = sessions.cleanups
    assert body_busy == frozenset()
    assert project_busy == frozenset({"other"})
