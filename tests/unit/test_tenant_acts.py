"""admin/tenant_acts.py's reading of who cancelled a run, and the label a member's act writes:
no database (unsaved ``JobRun`` rows), no Redis."""

from __future__ import annotations

import pytest

from kumiko_jobs.admin.tenant_acts import (
    NOT_THEIR_CANCEL,
    RETRY,
    cancelled_by_member,
    member_label,
    refusal,
)
from kumiko_jobs.definition.job import JobDefinition
from kumiko_jobs.definition.registry import registry
from kumiko_jobs.models import JobRun, RunStatus


def _body(ctx: object, *, tag: str) -> None:
    pass


def cancelled(by: str) -> JobRun:
    return JobRun(
        job_name="unit.acts", schema_name="t1", status=RunStatus.CANCELLED, cancel_requested_by=by
    )


def test_the_label_keeps_the_schema_whole_and_fits_the_column() -> None:
    assert member_label("alice", "t1", 150) == "alice (tenant t1)"
    long = member_label("a" * 200, "t1", 150)
    assert len(long) == 150 and long.endswith(" (tenant t1)")
    assert cancelled_by_member(cancelled(long), "t1")


@pytest.mark.parametrize(
    ("by", "schema", "expected"),
    [
        ("alice (tenant t1)", "t1", True),
        ("alice (tenant t1)", "t11", False),  # another tenant whose schema ends the same
        ("alice (tenant t11)", "t1", False),
        ("alice (tenant t2)", "t1", False),
        ("ops", "t1", False),  # an operator
        ("manage.py (root)", "t1", False),  # the CLI
        ("workflow", "t1", False),
        ("", "t1", False),  # a newer enqueue replaced it
        (" (tenant )", "", False),  # no schema: never a member
    ],
)
def test_who_cancelled(by: str, schema: str, expected: bool) -> None:
    assert cancelled_by_member(cancelled(by), schema) is expected


def test_only_the_retry_of_a_cancelled_run_asks_who_cancelled() -> None:
    definition = JobDefinition(name="unit.acts", func=_body)
    with registry.override(definition):
        assert refusal(cancelled("ops"), RETRY, "t1") is NOT_THEIR_CANCEL
        assert refusal(cancelled("alice (tenant t1)"), RETRY, "t1") is None
        assert refusal(cancelled("ops"), "cancel", "t1") is None  # finished: operations says so
        failed = JobRun(job_name="unit.acts", schema_name="t1", status=RunStatus.FAILED)
        assert refusal(failed, RETRY, "t1") is None
