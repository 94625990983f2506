"""Unit tests for enqueueing's submit path (enqueueing/submit.py): no database, no Redis.

The run's row and its on-commit callback go through ``outbox.save``; ``Outbox`` below keeps
them in memory and runs the callbacks only when a test says the transaction committed. The
push itself is captured by ``testing.captured_pushes``. Pinned: every mistake in a call raises
``InvalidJob`` at enqueue, before anything is written; an admitted run writes its queued row and
pushes its message only once the caller's transaction commits (never before, never after a
rollback); a delay (``enqueue_in``, ``enqueue_at``, a debounce) reaches the row and the message;
a run refused by the concurrency options (``skip``, ``max_per_tenant``) is a finished row with
its reason, no message, and ``job_dropped`` on commit; inside a run an enqueue is a follow-up.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings
from django.utils import timezone

from kumiko_jobs import signals, testing
from kumiko_jobs.core.envelope import Envelope, new_run_id
from kumiko_jobs.core.exceptions import InvalidJob
from kumiko_jobs.definition.job import JobDefinition
from kumiko_jobs.definition.options import build_definition
from kumiko_jobs.enqueueing import followups, outbox, submit
from kumiko_jobs.models import JobRun, RunStatus

TENANT = SimpleNamespace(schema_name="t1", pk=1)


def _body(ctx: Any, *, invoice_id: int, note: Any = None) -> None:
    """The job's body (never run here)."""


def declare(**options: Any) -> JobDefinition:
    return build_definition(_body, {"name": "unit.submit_body"} | options)


class Outbox:
    """``outbox.save``: the rows written, and their callbacks, run by ``commit()``."""

    def __init__(self) -> None:
        self.rows: list[JobRun] = []
        self.pending: list[Callable[[], None]] = []

    def save(self, row: JobRun, on_commit: Callable[[], None]) -> None:
        self.rows.append(row)
        self.pending.append(on_commit)

    def commit(self) -> None:
        pending, self.pending = self.pending, []
        for callback in pending:
            callback()

    def roll_back(self) -> None:
        self.rows, self.pending = [], []


@pytest.fixture
def box(monkeypatch: pytest.MonkeyPatch) -> Outbox:
    fake = Outbox()
    monkeypatch.setattr(outbox, "save", fake.save)
    # No pause left by an earlier failed push in this process (outbox.push_committed).
    monkeypatch.setattr(outbox, "_push_failed_at", None)
    return fake


@pytest.fixture
def pushes() -> Iterator[testing.Pushes]:
    with testing.captured_pushes() as captured:
        yield captured


@pytest.fixture
def dropped() -> Iterator[list[dict[str, Any]]]:
    sent: list[dict[str, Any]] = []

    def receiver(**kwargs: Any) -> None:
        sent.append(kwargs)

    signals.job_dropped.connect(receiver, weak=False)
    yield sent
    signals.job_dropped.disconnect(receiver)


# --- an admitted run -----------------------------------------------------------------------------


def test_the_row_is_written_now_and_the_message_pushed_on_commit(
    box: Outbox, pushes: testing.Pushes
) -> None:
    definition = declare(tenant_visible_run=["invoice_id"])
    handle = submit.enqueue(definition, tenant=TENANT, invoice_id=4)
    [row] = box.rows
    assert row.status == RunStatus.QUEUED
    assert (row.job_name, row.schema_name, row.subject) == (
        "unit.submit_body",
        "t1",
        "invoice_id=4",
    )
    assert row.payload == {"invoice_id": 4}
    assert row.scheduled_for is None
    assert row.run_id.hex == handle.run_id
    assert pushes.messages == []  # nothing reaches Redis before the caller's commit
    box.commit()
    [message] = pushes.messages
    assert message.job_id == row.rq_job_id
    assert message.queue == definition.queue_name == row.queue
    assert message.delay == 0.0
    assert (handle.job_name, handle.schema_name) == ("unit.submit_body", "t1")


def test_a_rolled_back_enqueue_pushes_nothing(box: Outbox, pushes: testing.Pushes) -> None:
    submit.enqueue(declare(), tenant=TENANT, invoice_id=4)
    box.roll_back()
    box.commit()
    assert pushes.messages == []


def test_a_failed_push_leaves_the_committed_run_to_the_relay(
    box: Outbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The on-commit push never fails the request: its transaction has committed."""

    def down(message: Any) -> None:
        raise ConnectionError("redis is down")

    monkeypatch.setattr(submit.outbox.transport, "push", down)
    submit.enqueue(declare(), tenant=TENANT, invoice_id=4)
    box.commit()  # no exception
    assert len(box.rows) == 1


def test_a_delay_reaches_the_row_and_the_message(box: Outbox, pushes: testing.Pushes) -> None:
    before = timezone.now()
    submit.enqueue_in(declare(), timedelta(minutes=2), tenant=TENANT, invoice_id=4)
    box.commit()
    [row], [message] = box.rows, pushes.messages
    assert message.delay == 120.0
    assert row.scheduled_for is not None
    assert before + timedelta(seconds=120) <= row.scheduled_for
    assert row.scheduled_for <= timezone.now() + timedelta(seconds=120)


def test_enqueue_at_a_past_time_runs_at_once(box: Outbox, pushes: testing.Pushes) -> None:
    submit.enqueue_at(declare(), timezone.now() - timedelta(hours=1), tenant=TENANT, invoice_id=4)
    box.commit()
    assert pushes.messages[0].delay == 0.0


def test_a_debounced_job_waits_at_least_its_debounce(
    box: Outbox, pushes: testing.Pushes, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(submit, "admission", admitting)  # debounce replaces under a DB lock
    definition = declare(concurrency="debounce", debounce=30)
    submit.enqueue_in(definition, 5, tenant=TENANT, invoice_id=4)
    submit.enqueue_in(definition, 90, tenant=TENANT, invoice_id=4)
    box.commit()
    assert [m.delay for m in pushes.messages] == [30.0, 90.0]


def test_a_deterministic_run_id_is_kept(box: Outbox) -> None:
    run_id = new_run_id()
    handle = submit.submit(declare(), TENANT, {"invoice_id": 4}, delay=0.0, run_id=run_id)
    assert handle.run_id == run_id
    assert box.rows[0].run_id.hex == run_id


def test_a_system_job_runs_for_no_tenant(box: Outbox, pushes: testing.Pushes) -> None:
    submit.enqueue(declare(system=True), invoice_id=4)
    assert box.rows[0].schema_name == ""


# --- mistakes raise at enqueue, before anything is written -------------------------------------


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (
            lambda d: submit.enqueue(d, tenant=TENANT, invoice_id=4, typo=1),
            "unexpected keyword argument 'typo'",
        ),
        (
            lambda d: submit.enqueue(d, tenant=TENANT),
            "missing a required keyword-only argument: 'invoice_id'",
        ),
        (lambda d: submit.enqueue(d, tenant=TENANT, invoice_id=4, note={1, 2}), "note"),
        (lambda d: submit.enqueue(d, tenant=TENANT, invoice_id=4, note=object()), "note"),
        (lambda d: submit.enqueue(d, invoice_id=4), "from the public schema without tenant="),
        (lambda d: submit.enqueue(d, tenant="public", invoice_id=4), "cannot run for the public"),
        (lambda d: submit.enqueue(d, tenant=42, invoice_id=4), "tenant= must be a tenant"),
        (lambda d: submit.enqueue_in(d, -1, tenant=TENANT, invoice_id=4), "delay >= 0"),
        (lambda d: submit.enqueue_in(d, True, tenant=TENANT, invoice_id=4), "delay >= 0"),
        (
            lambda d: submit.enqueue_at(d, datetime(2030, 1, 1), tenant=TENANT, invoice_id=4),
            "timezone-aware",
        ),
        (lambda d: submit.enqueue(42, invoice_id=4), "takes a job or a job name"),
    ],
    ids=[
        "unknown-argument",
        "missing-argument",
        "set-not-json",
        "object-not-json",
        "no-tenant-in-public",
        "public-tenant",
        "not-a-tenant",
        "negative-delay",
        "bool-delay",
        "naive-datetime",
        "not-a-job",
    ],
)
def test_a_wrong_call_raises_and_writes_nothing(
    box: Outbox, pushes: testing.Pushes, call: Callable[[JobDefinition], Any], match: str
) -> None:
    with pytest.raises(InvalidJob, match=match):
        call(declare())
    assert box.rows == []
    assert pushes.messages == []


def test_a_system_job_takes_no_tenant(box: Outbox) -> None:
    with pytest.raises(InvalidJob, match="is a system job; it takes no tenant="):
        submit.enqueue(declare(system=True), tenant=TENANT, invoice_id=4)
    assert box.rows == []


def test_a_message_too_big_for_redis_is_refused(box: Outbox) -> None:
    with (
        override_settings(KUMIKO_JOBS={**settings.KUMIKO_JOBS, "MAX_ENVELOPE_BYTES": 2048}),
        pytest.raises(InvalidJob, match="MAX_ENVELOPE_BYTES"),
    ):
        submit.enqueue(declare(), tenant=TENANT, invoice_id=4, note="x" * 4000)
    assert box.rows == []


# --- refused by the concurrency options ----------------------------------------------------------


@contextmanager
def admitting(
    definition: JobDefinition, schema: str | None, flow: str | None = None
) -> Iterator[RunStatus | None]:
    yield None


def refusing(status: RunStatus, seen: list[tuple[str, str | None]]) -> Any:
    @contextmanager
    def admission(
        definition: JobDefinition, schema: str | None, flow: str | None = None
    ) -> Iterator[RunStatus | None]:
        seen.append((definition.name, schema))
        yield status

    return admission


@pytest.mark.parametrize(
    ("status", "reason"),
    [
        (RunStatus.SKIPPED, 'concurrency="skip": a run of this job is already waiting or running'),
        (RunStatus.CAPPED, "max_per_tenant: the job's waiting and running runs reached the cap"),
    ],
    ids=["skipped", "capped"],
)
def test_a_refused_enqueue_is_a_finished_row_and_no_message(
    box: Outbox,
    pushes: testing.Pushes,
    dropped: list[dict[str, Any]],
    monkeypatch: pytest.MonkeyPatch,
    status: RunStatus,
    reason: str,
) -> None:
    seen: list[tuple[str, str | None]] = []
    monkeypatch.setattr(submit, "admission", refusing(status, seen))
    handle = submit.enqueue(declare(concurrency="skip"), tenant=TENANT, invoice_id=4)
    assert seen == [("unit.submit_body", "t1")]
    [row] = box.rows
    assert row.status == status
    assert row.finished_at == row.queued_at
    assert row.rq_job_id == ""
    assert row.error_message == reason
    assert handle.status == status
    assert dropped == []  # the signal waits for the commit too
    box.commit()
    assert pushes.messages == []
    [event] = dropped
    assert event["run_id"] == handle.run_id
    assert (event["outcome"], event["reason"], event["attempt"]) == (str(status), reason, 0)


def test_an_admitted_enqueue_is_asked_for_its_tenant(
    box: Outbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[tuple[str, str | None]] = []

    @contextmanager
    def admission(
        definition: JobDefinition, schema: str | None, flow: str | None = None
    ) -> Iterator[None]:
        assert flow is None  # an enqueue's run is no tenant-started system run
        seen.append((definition.name, schema))
        yield None

    monkeypatch.setattr(submit, "admission", admission)
    submit.enqueue(declare(), tenant=TENANT, invoice_id=4)
    assert seen == [("unit.submit_body", "t1")]
    assert box.rows[0].status == RunStatus.QUEUED


# --- inside a run --------------------------------------------------------------------------------


def test_inside_a_run_an_enqueue_is_a_follow_up(box: Outbox, pushes: testing.Pushes) -> None:
    parent = Envelope(job="unit.parent", schema="t1", kwargs={}, run_id=new_run_id())
    batch = followups.FollowupBatch(parent=parent)
    with followups.collecting(batch):
        submit.enqueue(declare(), invoice_id=4)
    assert box.rows == []  # written by the records step with the parent's success
    [(message, row)] = batch.entries
    assert message.job_id == row.rq_job_id
    assert row.schema_name == "t1"
    assert row.parent_run_id is not None and row.parent_run_id.hex == parent.run_id
    assert pushes.messages == []
