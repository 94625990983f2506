"""Unit tests for the records step (run/steps/records.py): no database.

The step reaches the run history only through ``history.transitions`` (and refused messages
through ``history.rejections``); ``History`` below stands in for both, in memory. Pinned here:

* the start: the message the run waits for starts it (its tenant loaded for the gates); a stale
  or repeated message, or one for a cancelled run, is dropped without running and without
  touching the run's row; a message whose row is gone is refused and recorded, never run; a
  run whose previous attempt's worker died is taken over by the next attempt's message;
* the finish: what ``run_update`` and the attempt row hold per outcome, the one-statement finish
  of the common case vs the transaction when there is more to write (a tenant-visible failure,
  escape-hatch uses, follow-ups), an interruption still written, a transaction left open;
* the signals each ending sends.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest

from kumiko_jobs import signals
from kumiko_jobs.core.exceptions import Unrecoverable
from kumiko_jobs.core.outcome import DeferralKind, Outcome
from kumiko_jobs.enqueueing import followups
from kumiko_jobs.enqueueing.followups import collecting
from kumiko_jobs.history import atomic_sql, rejections, run_sql, transitions
from kumiko_jobs.models import JobRun
from kumiko_jobs.run.state import Found, Missing, RunState
from kumiko_jobs.run.steps.records import records
from kumiko_jobs.transport import Message
from tests.unit.states import make_state

TENANT = SimpleNamespace(schema_name="t1", pk=1)


class History:
    """The history's rows as the records step reaches them (transitions, rejections), in memory.

    ``updated``: whether the start statement takes the message; ``row``: the run's (status,
    attempts) when it does not (None: the row is gone); ``stray``: the history's connection has
    a transaction left open; ``still_running``: whether the fenced finish finds the run still
    running its attempt. Every write is noted in ``writes``, in order.
    """

    def __init__(
        self,
        *,
        updated: bool = True,
        tenant: Any = TENANT,
        row: tuple[str, int] | None = None,
        stray: bool = False,
        still_running: bool = True,
    ) -> None:
        self.updated, self.tenant, self.row, self.stray = updated, tenant, row, stray
        self.still_running = still_running
        self.writes: list[str] = []
        self.start_params: dict[str, Any] = {}
        self.took_over: tuple[str, int, datetime] | None = None
        self.rejected: list[tuple[object, str, str, str]] = []
        self.rejected_schemas: list[str | None] = []
        self.attempt: dict[str, Any] = {}
        self.run_update: dict[str, Any] = {}
        self.also: Callable[[], None] | None = None

    def start(self, **params: Any) -> run_sql.Started:
        self.writes.append("start")
        self.start_params = params
        return run_sql.Started(updated=self.updated, tenant=self.tenant)

    def run_row(self, run_id: str) -> tuple[str, int] | None:
        return self.row

    def take_over(
        self, run_id: str, attempt: int, started_at: datetime, atomic_key: str = ""
    ) -> None:
        self.writes.append("take_over")
        self.took_over = (run_id, attempt, started_at)
        self.took_over_key = atomic_key

    def record_rejection(
        self, message: object, reason: str, rq_job_id: str, queue: str, *, schema: str | None = None
    ) -> None:
        self.writes.append("rejection")
        self.rejected.append((message, reason, rq_job_id, queue))
        self.rejected_schemas.append(schema)

    def end_stray_transaction(self) -> bool:
        return self.stray

    def finish(
        self,
        attempt: dict[str, Any],
        run_update: dict[str, Any],
        run_id: str,
        *,
        clear_failure: tuple[str, str, str] | None = None,
        expected: Any = None,
    ) -> bool:
        self.writes.append("finish")
        self.attempt, self.run_update = attempt, run_update
        self.cleared = clear_failure
        return self.still_running

    def finish_in_transaction(
        self,
        attempt: dict[str, Any],
        run_update: dict[str, Any],
        run_id: str,
        also: Callable[[], None],
        expected: Any = None,
    ) -> bool:
        # ``also`` (the failure, audit and follow-up rows) is ORM work: kept, not called.
        self.writes.append("finish_in_transaction")
        self.attempt, self.run_update, self.also = attempt, run_update, also
        return self.still_running


@pytest.fixture
def history(monkeypatch: pytest.MonkeyPatch) -> History:
    """The default history: the start takes the message and finds tenant t1."""
    return install(monkeypatch, History())


def install(monkeypatch: pytest.MonkeyPatch, history: History) -> History:
    for name in ("start", "run_row", "take_over", "end_stray_transaction", "finish"):
        monkeypatch.setattr(transitions, name, getattr(history, name))
    monkeypatch.setattr(transitions, "finish_in_transaction", history.finish_in_transaction)
    monkeypatch.setattr(rejections, "record_rejection", history.record_rejection)
    return history


class Sent:
    """Every kumiko signal sent during a test, as (signal name, kwargs)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def names(self) -> list[str]:
        return [name for name, _ in self.events]

    def last(self) -> dict[str, Any]:
        return self.events[-1][1]


_SIGNALS = ("job_started", "job_succeeded", "job_failed", "job_deferred", "job_dropped")


@pytest.fixture
def sent() -> Iterator[Sent]:
    captured = Sent()
    receivers = []
    for name in _SIGNALS:

        def receiver(name: str = name, **kwargs: Any) -> None:
            kwargs.pop("signal", None)
            kwargs.pop("sender", None)
            captured.events.append((name, kwargs))

        getattr(signals, name).connect(receiver, weak=False)
        receivers.append((name, receiver))
    yield captured
    for name, receiver in receivers:
        getattr(signals, name).disconnect(receiver)


class Rest:
    """The rest of the pipeline: ends the attempt with ``ending`` and notes that it ran."""

    def __init__(self, ending: Callable[[RunState], None] = lambda state: None) -> None:
        self.ending = ending
        self.calls = 0

    def __call__(self, state: RunState) -> None:
        self.calls += 1
        self.ending(state)


def succeeding(result: Any = "ok") -> Rest:
    return Rest(lambda state: state.ending.succeed(result))


def failing(error: BaseException) -> Rest:
    def end(state: RunState) -> None:
        state.ending.fail(error, traceback="Traceback: boom")

    return Rest(end)


# --- the start -----------------------------------------------------------------------------------


def test_the_awaited_message_starts_the_run_with_its_tenant(history: History, sent: Sent) -> None:
    state = make_state("t1", attempt=2, defers=1, gate_defers=3, rq_job_id="kj-abc")
    rest = succeeding()
    records(state, rest)
    assert rest.calls == 1
    params = history.start_params
    assert params["run_id"] == state.envelope.run_id
    assert (params["attempt"], params["defers"], params["gate_defers"]) == (2, 1, 3)
    assert (params["rq_job_id"], params["schema"]) == ("kj-abc", "t1")
    assert params["started_at"] == state.timing.started_at
    assert params["atomic_key"] == ""  # not an atomic job: the column is cleared
    assert state.tenancy.lookup == Found(TENANT)
    assert history.writes == ["start", "finish"]
    assert sent.names() == ["job_started", "job_succeeded"]
    assert sent.events[0][1]["attempt"] == 2


@pytest.mark.parametrize("ending", ["succeed", "fail"])
def test_a_finish_the_run_no_longer_waits_for_sends_no_outcome(
    monkeypatch: pytest.MonkeyPatch, sent: Sent, ending: str
) -> None:
    """The fenced finish found the run no longer running this attempt (the sweep handed it
    back, an operator cancelled it): no outcome signal, no report, as if it had been written."""
    history = install(monkeypatch, History(still_running=False))
    rest = succeeding() if ending == "succeed" else failing(ValueError("late"))
    records(make_state("t1"), rest)
    assert history.writes == ["start", "finish"]
    assert sent.names() == ["job_started"]


@pytest.mark.parametrize("recorded", [True, False])
def test_a_finish_whose_connection_was_lost_asks_its_own_attempt_row(
    monkeypatch: pytest.MonkeyPatch, sent: Sent, recorded: bool
) -> None:
    """The connection went under the finish, and on a new one the row no longer runs the
    attempt: its own attempt row (by its ``finished_at``) says whether that was this finish,
    committed after all (its outcome stands), or the sweep taking the run (nothing sent)."""
    from django.db import OperationalError

    history = install(monkeypatch, History())
    asked: list[tuple[str, int, datetime]] = []

    def lost(*args: Any, **kwargs: Any) -> bool:
        history.writes.append("finish")
        raise OperationalError("the connection was lost")

    def attempt_recorded(run_id: str, attempt: int, finished_at: datetime) -> bool:
        asked.append((run_id, attempt, finished_at))
        return recorded

    monkeypatch.setattr(transitions, "finish", lost)
    monkeypatch.setattr(transitions, "write_if_still_running", lambda *a: False)
    monkeypatch.setattr(transitions, "attempt_recorded", attempt_recorded)
    state = make_state("t1")
    records(state, succeeding())
    assert [(run_id, n) for run_id, n, _ in asked] == [(state.envelope.run_id, 1)]
    expected = ["job_started", "job_succeeded"] if recorded else ["job_started"]
    assert sent.names() == expected
    assert state.ending.superseded is not recorded


def test_an_atomic_runs_start_writes_the_hash_of_its_deliverys_secret(history: History) -> None:
    """The atomic step's key is written by the start itself (no statement of its own)."""
    state = make_state("t1", atomic=True)
    records(state, succeeding())
    key = history.start_params["atomic_key"]
    assert key == hashlib.sha256(state.delivery.atomic_secret.encode()).hexdigest()
    assert key != state.delivery.atomic_secret  # the row holds the hash, never the secret


def test_a_taken_over_atomic_run_gets_the_new_deliverys_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    history = install(monkeypatch, History(updated=False, row=("running", 1)))
    state = make_state(attempt=2, atomic=True)
    records(state, succeeding())
    assert history.took_over_key == atomic_sql.atomic_digest(state.delivery.atomic_secret)
    assert history.start_params["atomic_key"] == history.took_over_key


def test_a_missing_tenant_is_noted_for_the_gates(monkeypatch: pytest.MonkeyPatch) -> None:
    install(monkeypatch, History(tenant=None))
    state = make_state("t9")
    records(state, succeeding())
    assert state.tenancy.lookup == Missing()  # the gates step fails it; records only looks


@pytest.mark.parametrize(
    ("row", "attempt", "why"),
    [
        (("queued", 2), 1, "stale message (attempt 1, deferrals 0/0): the run is queued after "),
        (("deferred", 1), 1, "stale message (attempt 1, deferrals 0/0): the run is deferred"),
        (("succeeded", 1), 1, "duplicate delivery: the run is already succeeded"),
        (("failed", 3), 3, "duplicate delivery: the run is already failed"),
        (("running", 1), 1, "duplicate delivery: the run is already running"),
        (("running", 2), 1, "duplicate delivery: the run is already running"),
        (("cancelled", 0), 1, "cancelled before it started"),
    ],
    ids=[
        "stale-queued",
        "stale-deferred",
        "succeeded",
        "failed",
        "running-same-attempt",
        "running-later-attempt",
        "cancelled",
    ],
)
def test_a_message_the_run_does_not_wait_for_is_dropped_unrun(
    monkeypatch: pytest.MonkeyPatch, sent: Sent, row: tuple[str, int], attempt: int, why: str
) -> None:
    history = install(monkeypatch, History(updated=False, row=row))
    state, rest = make_state(attempt=attempt), succeeding()
    records(state, rest)
    assert rest.calls == 0
    assert state.ending.outcome is Outcome.DROPPED
    assert state.ending.drop_reason.startswith(why)
    assert history.writes == ["start"]  # the run's row is the waiting message's: untouched
    assert sent.names() == ["job_dropped"]
    assert sent.last()["reason"] == state.ending.drop_reason
    assert sent.last()["outcome"] is Outcome.DROPPED


def test_the_next_attempt_takes_over_a_run_whose_worker_died(
    monkeypatch: pytest.MonkeyPatch, sent: Sent
) -> None:
    history = install(monkeypatch, History(updated=False, row=("running", 1)))
    state, rest = make_state(attempt=2), succeeding()
    records(state, rest)
    assert rest.calls == 1
    assert history.took_over == (state.envelope.run_id, 2, state.timing.started_at)
    assert history.writes == ["start", "take_over", "finish"]
    assert sent.names() == ["job_started", "job_succeeded"]


def test_a_message_without_a_run_row_is_refused_and_recorded(
    monkeypatch: pytest.MonkeyPatch, sent: Sent
) -> None:
    history = install(monkeypatch, History(updated=False, row=None))
    state = make_state("t1", attempt=3, rq_job_id="kj-gone", queue="default")
    rest = succeeding()
    records(state, rest)
    assert rest.calls == 0  # never recreated from the message
    assert history.writes == ["start", "rejection"]
    [(excerpt, reason, rq_job_id, queue)] = history.rejected
    env = state.envelope
    assert excerpt == f"run_id={env.run_id} job=unit.body schema=t1 attempt=3"
    assert reason.startswith(f"no run {env.run_id} of unit.body: its history row is gone")
    assert (rq_job_id, queue) == ("kj-gone", "default")
    assert history.rejected_schemas == ["t1"]  # so the tenant's deletion finds the row
    assert state.ending.outcome is Outcome.DROPPED
    assert state.ending.drop_reason == reason
    assert sent.names() == ["job_dropped"]


# --- what the finish writes ----------------------------------------------------------------------


def test_a_success_writes_its_result_and_clears_the_error(history: History) -> None:
    state = make_state(worker_name="w1")
    state.log.lines.append("hello")
    records(state, succeeding({"n": 1}))
    update = history.run_update
    assert update["status"] == "succeeded"
    assert update["result"] == {"n": 1}
    assert (update["error_type"], update["error_message"]) == ("", "")
    assert isinstance(update["finished_at"], datetime)
    assert "scheduled_for" not in update
    attempt = history.attempt
    assert attempt["outcome"] == "succeeded"
    assert attempt["number"] == 1
    assert str(attempt["run"].hex) == state.envelope.run_id
    assert attempt["started_at"] == state.timing.started_at
    assert attempt["finished_at"] == update["finished_at"]
    assert (attempt["error_type"], attempt["error_message"], attempt["traceback"]) == ("", "", "")
    assert attempt["log"] == ["hello"]
    assert attempt["worker"] == "w1"


def test_a_final_failure_writes_its_error(history: History, sent: Sent) -> None:
    error = ValueError("bad invoice")
    records(make_state(), failing(error))
    update = history.run_update
    assert update["status"] == "failed"
    assert (update["error_type"], update["error_message"]) == ("ValueError", "bad invoice")
    assert "finished_at" in update
    assert "result" not in update
    assert history.attempt["outcome"] == "failed"
    assert history.attempt["traceback"] == "Traceback: boom"
    assert sent.names() == ["job_started", "job_failed"]
    assert sent.last()["error"] is error


def test_a_retry_is_scheduled_not_finished(history: History, sent: Sent) -> None:
    state = make_state()

    def retry(state: RunState) -> None:
        state.ending.retry(RuntimeError("down"), "tb", state.envelope.next_attempt(), 30.0)

    records(state, Rest(retry))
    update = history.run_update
    assert update["status"] == "queued"
    assert "finished_at" not in update
    attempt_finished = history.attempt["finished_at"]
    assert update["scheduled_for"] == attempt_finished + timedelta(seconds=30)
    assert update["error_type"] == "RuntimeError"
    assert history.attempt["outcome"] == "retrying"
    assert sent.names() == ["job_started", "job_failed"]


def test_a_deferral_is_scheduled_not_finished(history: History, sent: Sent) -> None:
    state = make_state()

    def defer(state: RunState) -> None:
        state.ending.defer(45, DeferralKind.JOB)
        state.ending.resume_in(state.envelope.deferred(by_gate=False))

    records(state, Rest(defer))
    update = history.run_update
    assert update["status"] == "deferred"
    assert "finished_at" not in update
    assert update["scheduled_for"] == history.attempt["finished_at"] + timedelta(seconds=45)
    assert "error_type" not in update  # a deferral neither sets nor clears the last error
    assert sent.names() == ["job_started", "job_deferred"]


@pytest.mark.parametrize("kind", list(DeferralKind))
def test_a_deferral_records_what_it_waits_for(history: History, kind: DeferralKind) -> None:
    def defer(state: RunState) -> None:
        state.ending.defer(5, kind)

    records(make_state(), Rest(defer))
    assert history.run_update["waiting_for"] == kind


@pytest.mark.parametrize(
    "ending",
    [
        lambda s: s.ending.succeed(1),
        lambda s: s.ending.fail(ValueError("x")),
        lambda s: s.ending.retry(ValueError(), "", s.envelope.next_attempt(), 1),
        lambda s: s.ending.drop("gone"),
    ],
    ids=["success", "failure", "retry", "drop"],
)
def test_every_other_outcome_clears_what_the_run_waited_for(
    history: History, ending: Callable[[RunState], None]
) -> None:
    records(make_state(), Rest(ending))
    assert history.run_update["waiting_for"] == ""


def test_the_follow_up_batch_closes_once_written_so_receivers_enqueue_normally(
    history: History,
) -> None:
    """A ``job_succeeded`` receiver runs after the history is written: its enqueue must not
    join the batch, whose rows are already written (its message would go out without a row)."""
    state = make_state()
    seen: list[object] = []

    def receiver(**kwargs: Any) -> None:
        seen.append(followups.current())

    signals.job_succeeded.connect(receiver)
    try:
        with collecting(state.followups):
            records(state, succeeding())
            assert followups.current() is None
    finally:
        signals.job_succeeded.disconnect(receiver)
    assert seen == [None]
    assert state.followups.closed


def test_a_drop_after_the_start_writes_its_reason(history: History, sent: Sent) -> None:
    records(make_state(), Rest(lambda state: state.ending.drop("tenant 't1' is inactive")))
    update = history.run_update
    assert update["status"] == "cancelled"
    assert update["error_message"] == "tenant 't1' is inactive"
    assert "finished_at" in update
    assert sent.names() == ["job_started", "job_dropped"]
    assert sent.last()["reason"] == "tenant 't1' is inactive"


def test_an_attempt_nothing_decided_is_written_failed(history: History, sent: Sent) -> None:
    records(make_state(), Rest())
    assert history.run_update["status"] == "failed"
    assert history.attempt["outcome"] == "failed"
    assert sent.names() == ["job_started", "job_failed"]


def test_an_interruption_is_written_failed_and_passes_up(history: History, sent: Sent) -> None:
    def interrupted(state: RunState) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        records(make_state(), Rest(interrupted))
    assert history.writes == ["start", "finish"]  # never left running
    assert history.run_update["status"] == "failed"
    assert history.run_update["error_type"] == "KeyboardInterrupt"
    assert sent.names() == ["job_started", "job_failed"]


def test_an_interruption_keeps_the_error_already_noted(history: History) -> None:
    def interrupted(state: RunState) -> None:
        state.ending.fail(ValueError("the body's"))
        raise SystemExit(1)

    with pytest.raises(SystemExit):
        records(make_state(), Rest(interrupted))
    assert history.run_update["error_type"] == "ValueError"


def test_a_transaction_left_open_fails_a_success(monkeypatch: pytest.MonkeyPatch) -> None:
    history = install(monkeypatch, History(stray=True))
    state = make_state()
    records(state, succeeding())
    assert state.ending.outcome is Outcome.FAILED
    assert isinstance(state.ending.error, Unrecoverable)
    assert "left a transaction open" in str(state.ending.error)
    assert history.run_update["status"] == "failed"
    assert "result" not in history.run_update


def test_a_transaction_left_open_keeps_a_failures_own_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    history = install(monkeypatch, History(stray=True))
    error = ValueError("first")
    state = make_state()
    records(state, failing(error))
    assert state.ending.error is error
    assert history.run_update["error_message"] == "first"


# --- one statement or a transaction --------------------------------------------------------------


def _message() -> Message:
    return Message(body="signed", queue="default", job_id="kj-child", timeout=60)


def _with_followup(state: RunState) -> None:
    state.followups.add(_message(), JobRun())


FAILURE = {"message_key": "billing.failed", "subject_fields": []}


@pytest.mark.parametrize(
    ("schema", "options", "ending", "in_transaction"),
    [
        # the common case
        ("t1", {}, lambda s: s.ending.succeed(1), False),
        ("t1", {}, lambda s: s.ending.fail(ValueError("x")), False),
        # a tenant-visible failure to write, or to clear after a success
        ("t1", {}, lambda s: (s.ending.fail(ValueError("x")), s.ending.show_tenant("k")), True),
        # a success clears its subject's failure in the one statement (issue 23), declared or not
        ("t1", {"tenant_visible_failure": FAILURE}, lambda s: s.ending.succeed(1), False),
        ("t1", {"tenant_visible_failure": FAILURE}, lambda s: s.ending.fail(ValueError()), False),
        # a system run has no tenant to show a failure to
        (None, {"system": True}, lambda s: (s.ending.fail(), s.ending.show_tenant("k")), False),
        # a retry's failure key is not shown yet
        (
            "t1",
            {},
            lambda s: (
                s.ending.retry(ValueError(), "", s.envelope.next_attempt(), 1),
                s.ending.show_tenant("k"),
            ),
            False,
        ),
        # follow-ups are written only with a success
        ("t1", {}, lambda s: (_with_followup(s), s.ending.succeed(1)), True),
        ("t1", {}, lambda s: (_with_followup(s), s.ending.fail(ValueError())), False),
        # escape-hatch uses the run reported
        (
            "t1",
            {},
            lambda s: (
                s.audit_uses.reported.append(("global_writes", "why", "a")),
                s.ending.succeed(1),
            ),
            True,
        ),
    ],
    ids=[
        "success",
        "failure",
        "failure-shown-to-tenant",
        "success-clears-tenant-failure",
        "failure-of-a-job-with-declared-failure",
        "system-failure-key",
        "retry-key-not-shown",
        "followups-of-a-success",
        "followups-of-a-failure",
        "escape-hatch-uses",
    ],
)
def test_the_finish_is_one_statement_unless_there_is_more_to_write(
    history: History,
    schema: str | None,
    options: dict[str, Any],
    ending: Callable[[RunState], Any],
    in_transaction: bool,
) -> None:
    state = make_state(schema, kwargs={}, **options)
    records(state, Rest(ending))
    expected = "finish_in_transaction" if in_transaction else "finish"
    assert history.writes == ["start", expected]
    if in_transaction:
        assert history.also is not None  # the rest is written in the same transaction
    assert history.run_update["status"] == (state.ending.outcome or Outcome.FAILED).status
    if not in_transaction:
        clears = schema is not None and state.ending.outcome is Outcome.SUCCEEDED
        assert history.cleared == ((schema, state.envelope.job, "") if clears else None)
