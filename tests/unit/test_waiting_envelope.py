"""The message a waiting run waits for, rebuilt from its row alone (no database, no Redis).

A deferred row that records its kind (``waiting_for``, migration 0012) decides the counters
by itself; the tenant's state is read only for rows a previous release deferred (``""``),
which tests/integration/test_waiting_for.py covers with a real tenant table.
"""

from __future__ import annotations

import uuid

import pytest
from django.utils import timezone

from kumiko_jobs.enqueueing.messages import deferred_by_gate, waiting_envelope
from kumiko_jobs.models import DeferralKind, JobRun, RunStatus


def row(status: str, waiting_for: str = "", **fields: object) -> JobRun:
    values: dict[str, object] = {
        "run_id": uuid.uuid4(),
        "job_name": "app.job",
        "schema_name": "t1",
        "status": status,
        "attempts": 2,
        "defer_count": 3,
        "gate_defer_count": 1,
        "queued_at": timezone.now(),
        "waiting_for": waiting_for,
    }
    values.update(fields)
    return JobRun(**values)


@pytest.mark.parametrize(
    ("waiting_for", "counters"),
    [(DeferralKind.JOB, (2, 4, 1)), (DeferralKind.GATE, (2, 3, 2))],
)
def test_a_deferred_row_resumes_with_one_more_deferral_of_its_recorded_kind(
    waiting_for: DeferralKind, counters: tuple[int, int, int]
) -> None:
    env = waiting_envelope(row(RunStatus.DEFERRED, waiting_for))
    assert (env.attempt, env.defers, env.gate_defers) == counters
    assert deferred_by_gate(row(RunStatus.DEFERRED, waiting_for)) is (
        waiting_for is DeferralKind.GATE
    )


def test_a_queued_row_waits_for_its_next_attempt_whatever_its_kind_says() -> None:
    env = waiting_envelope(row(RunStatus.QUEUED, DeferralKind.GATE))
    assert (env.attempt, env.defers, env.gate_defers) == (3, 3, 1)


def test_the_column_holds_every_kind() -> None:
    field = JobRun._meta.get_field("waiting_for")
    assert field.max_length is not None
    assert all(len(kind.value) <= field.max_length for kind in DeferralKind)
    assert field.blank and field.default == "" and field.db_default == ""
