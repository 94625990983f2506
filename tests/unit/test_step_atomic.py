"""Unit tests for the atomic step (run/steps/atomic.py): no database.

The step reaches its transaction only through ``history.atomic_sql`` (``atomic_transaction``,
``atomic_roll_back``) and records the success through ``history.transitions``
(``atomic_success``); ``Transaction`` below stands in for both and notes what happened.
Pinned: only an ``atomic=True`` tenant run gets the transaction; a success is recorded in it
(with the transaction's id and the result) and commits with the body; anything else (a
failure, a deferral, a swallowed guard denial, an exception) rolls it back and records nothing;
a body that ended the transaction itself makes the success unrecordable, which fails the run for
good (``Unrecoverable``) and rolls back.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import pytest
from django.db import DatabaseError

from kumiko_jobs.core.exceptions import Unrecoverable
from kumiko_jobs.core.outcome import DeferralKind
from kumiko_jobs.history import atomic_sql, transitions
from kumiko_jobs.run.state import RunState
from kumiko_jobs.run.steps.atomic import atomic
from tests.unit.states import make_state

TENANT = SimpleNamespace(schema_name="t1", pk=1)


class Transaction:
    """The atomic run's transaction, in memory: ``events`` in order, ending in ``commit`` or
    ``rollback``. ``refuse``: the success function refuses (the body ended the transaction)."""

    def __init__(self, refuse: bool = False) -> None:
        self.refuse = refuse
        self.events: list[str] = []
        self.successes: list[dict[str, Any]] = []
        self._rollback = False

    @contextmanager
    def atomic_transaction(self) -> Iterator[str]:
        self.events.append("begin")
        try:
            yield "xid-42"
        except BaseException:
            self.events.append("rollback")
            raise
        self.events.append("rollback" if self._rollback else "commit")

    def atomic_roll_back(self) -> None:
        self._rollback = True

    def atomic_success(self, **params: Any) -> bool:
        if self.refuse:
            # As Django raises it: psycopg's error (the function's SQLSTATE) as its cause.
            error = DatabaseError("the run's transaction ended (xid-42 is not current)")
            error.__cause__ = _Refusal()
            raise error
        self.events.append("success")
        self.successes.append(params)
        return bool(params.get("commit"))


class _Refusal(Exception):
    """The success function's refusal as psycopg raises it (migration 0017)."""

    sqlstate = "KJ001"


@pytest.fixture
def tx(monkeypatch: pytest.MonkeyPatch) -> Transaction:
    return install(monkeypatch, Transaction())


def install(monkeypatch: pytest.MonkeyPatch, tx: Transaction) -> Transaction:
    monkeypatch.setattr(atomic_sql, "atomic_transaction", tx.atomic_transaction)
    monkeypatch.setattr(atomic_sql, "atomic_roll_back", tx.atomic_roll_back)
    monkeypatch.setattr(transitions, "atomic_success", tx.atomic_success)
    return tx


def body(tx: Transaction, ending: Callable[[RunState], None]) -> Callable[[RunState], None]:
    """The rest of the pipeline: runs inside the transaction (noted as ``body``)."""

    def rest(state: RunState) -> None:
        tx.events.append("body")
        ending(state)

    return rest


def atomic_run(**options: Any) -> RunState:
    return make_state("t1", tenant=TENANT, atomic=True, **options)


def test_a_success_is_recorded_in_the_bodys_transaction(tx: Transaction) -> None:
    state = atomic_run(attempt=2)
    atomic(state, body(tx, lambda s: s.ending.succeed({"n": 1})))
    assert tx.events == ["begin", "body", "success", "commit"]
    [success] = tx.successes
    assert success["run_id"] == state.envelope.run_id
    assert (success["attempt"], success["xid"], success["result"]) == (2, "xid-42", {"n": 1})
    # With this delivery's secret, whose hash the records step wrote with the start.
    assert success["key"] == state.delivery.atomic_secret
    assert len(success["key"]) == 64
    assert success["commit"] is True  # the outermost transaction: its COMMIT rides along
    assert state.atomicity.committed


def test_every_delivery_has_a_secret_of_its_own() -> None:
    """Two deliveries of the same message (a redelivery, a retry) hold different secrets: the
    hash the first one's start wrote does not let the second record a success, and back."""
    run_id = "01a2425dd9bc7000b9d8013469eed276"
    first, second = atomic_run(attempt=1, run_id=run_id), atomic_run(attempt=1, run_id=run_id)
    assert first.envelope == second.envelope
    assert first.delivery.atomic_secret != second.delivery.atomic_secret
    assert "atomic_secret" not in repr(first.delivery)


@pytest.mark.parametrize(
    "options",
    [{}, {"atomic": False}],
    ids=["default", "atomic-false"],
)
def test_a_plain_job_gets_no_transaction(tx: Transaction, options: dict[str, Any]) -> None:
    state = make_state("t1", tenant=TENANT, **options)
    atomic(state, body(tx, lambda s: s.ending.succeed(1)))
    assert tx.events == ["body"]
    assert not state.atomicity.committed


def test_a_run_without_a_tenant_gets_no_transaction(tx: Transaction) -> None:
    """The step opens the transaction on the tenant's connection only once a tenant is entered
    (no tenant: the gates step refused the run, or a pipeline without it)."""
    state = make_state("t1", tenant=None, atomic=True)
    atomic(state, body(tx, lambda s: s.ending.succeed(1)))
    assert tx.events == ["body"]
    assert not state.atomicity.committed


@pytest.mark.parametrize(
    "ending",
    [
        lambda s: s.ending.fail(ValueError("no")),
        lambda s: s.ending.retry(ValueError("again"), "", s.envelope.next_attempt(), 5),
        lambda s: s.ending.defer(30, DeferralKind.JOB),
        lambda s: s.ending.drop("why"),
        lambda s: None,
    ],
    ids=["failed", "retrying", "deferred", "dropped", "undecided"],
)
def test_anything_but_a_success_rolls_the_body_back(
    tx: Transaction, ending: Callable[[RunState], None]
) -> None:
    state = atomic_run()
    atomic(state, body(tx, ending))
    assert tx.events == ["begin", "body", "rollback"]
    assert tx.successes == []
    assert not state.atomicity.committed


def test_a_success_with_a_swallowed_denial_rolls_back(tx: Transaction) -> None:
    def swallowed(state: RunState) -> None:
        state.watch.violations.append("UPDATE on public.shared_plan")
        state.ending.succeed(1)

    state = atomic_run()
    atomic(state, body(tx, swallowed))
    assert tx.events == ["begin", "body", "rollback"]
    assert not state.atomicity.committed


def test_an_exception_rolls_back_and_passes_up(tx: Transaction) -> None:
    def raising(state: RunState) -> None:
        raise KeyboardInterrupt

    state = atomic_run()
    with pytest.raises(KeyboardInterrupt):
        atomic(state, body(tx, raising))
    assert tx.events == ["begin", "body", "rollback"]
    assert not state.atomicity.committed


def test_a_body_that_committed_on_its_own_fails_for_good(monkeypatch: pytest.MonkeyPatch) -> None:
    tx = install(monkeypatch, Transaction(refuse=True))
    state = atomic_run(retries=5)
    with pytest.raises(Unrecoverable, match="could not be recorded in its transaction") as caught:
        atomic(state, body(tx, lambda s: s.ending.succeed(1)))
    assert isinstance(caught.value.__cause__, DatabaseError)
    assert "xid-42 is not current" in str(caught.value)
    assert tx.events == ["begin", "body", "rollback"]
    assert not state.atomicity.committed


def test_a_commit_that_failed_with_the_success_is_raised_as_it_came(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With the COMMIT in the success's statement, an error that is not the function's refusal
    (a deferred constraint checked at COMMIT) is the COMMIT's: raised as it came, for the
    retry policy, not turned into a failure for good."""
    from django.db import IntegrityError

    tx = install(monkeypatch, Transaction())

    def commit_fails(**params: Any) -> bool:
        raise IntegrityError("deferred constraint violated at COMMIT")

    monkeypatch.setattr(transitions, "atomic_success", commit_fails)
    state = atomic_run(retries=5)
    with pytest.raises(IntegrityError):
        atomic(state, body(tx, lambda s: s.ending.succeed(1)))
    assert tx.events == ["begin", "body", "rollback"]
    assert not state.atomicity.committed
