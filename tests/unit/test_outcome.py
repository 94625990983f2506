"""Unit tests for ``Outcome`` (core/outcome.py): the attempt's end and the run status it leaves.

Pinned: each outcome's ``RunStatus`` (a retry waits ``queued``, a dropped message leaves its run
``cancelled``), which outcomes are final, that every outcome has a status, and that the values
are the strings ``JobAttempt.outcome`` stores and the signals send. No database.
"""

from __future__ import annotations

import pytest

from kumiko_jobs.core.outcome import DeferralKind, Outcome
from kumiko_jobs.models import JobAttempt, RunStatus

EXPECTED_STATUS = {
    Outcome.SUCCEEDED: RunStatus.SUCCEEDED,
    Outcome.FAILED: RunStatus.FAILED,
    Outcome.RETRYING: RunStatus.QUEUED,
    Outcome.DEFERRED: RunStatus.DEFERRED,
    Outcome.DROPPED: RunStatus.CANCELLED,
    Outcome.CANCELLED: RunStatus.CANCELLED,
}


@pytest.mark.parametrize("outcome", list(Outcome), ids=str)
def test_each_outcome_leaves_its_run_status(outcome: Outcome) -> None:
    assert outcome.status is EXPECTED_STATUS[outcome]


def test_every_outcome_is_mapped() -> None:
    assert set(EXPECTED_STATUS) == set(Outcome)


@pytest.mark.parametrize("outcome", list(Outcome), ids=str)
def test_only_retrying_and_deferred_runs_go_on(outcome: Outcome) -> None:
    assert outcome.final is (outcome not in (Outcome.RETRYING, Outcome.DEFERRED))


def test_a_final_outcome_never_leaves_the_run_waiting() -> None:
    waiting = {RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.DEFERRED}
    for outcome in Outcome:
        assert (outcome.status in waiting) is not outcome.final, outcome


def test_the_values_are_the_stored_strings() -> None:
    assert [o.value for o in Outcome] == [
        "succeeded",
        "failed",
        "retrying",
        "deferred",
        "dropped",
        "cancelled",
    ]
    assert Outcome.FAILED == "failed"  # a StrEnum compares as its value
    assert f"{Outcome.DROPPED}" == "dropped"


def test_every_value_fits_the_attempts_outcome_column() -> None:
    field = JobAttempt._meta.get_field("outcome")
    assert field.max_length is not None
    assert all(len(o.value) <= field.max_length for o in Outcome)
    assert {value for value, _ in field.choices or ()} == {o.value for o in Outcome}


def test_deferral_kinds() -> None:
    assert [k.value for k in DeferralKind] == ["job", "gate"]
