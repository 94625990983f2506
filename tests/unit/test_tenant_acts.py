"""admin/tenant_acts.py's reading of who cancelled a run, and the label a member's act writes:
no database (unsaved ``JobRun`` rows), no Redis."""

from __future__ import annotations

import pytest

from kumiko_jobs.admin.tenant_acts import (
    CANCEL,
    NOT_THEIR_CANCEL,
    OPERATOR_STARTED,
    RETRY,
    cancelled_by_member,
    member_label,
    refusal,
    started_by_operator,
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


RUN_ID = "01a24fca-e909-7000-9ebe-83ec7231822d"


@pytest.mark.parametrize(
    ("trigger", "schema", "expected"),
    [
        ("manual", "t1", True),  # the CLI, or the page with no user to name
        ("manual by ops", "t1", True),
        ("manual by alice (tenant t1)", "t1", True),  # only operators run jobs by hand
        (f"retry:{RUN_ID} by ops", "t1", True),
        (f"retry:{RUN_ID} by manage.py (root)", "t1", True),
        (f"retry:{RUN_ID} by alice (tenant t2)", "t1", True),  # another tenant's label
        (f"retry:{RUN_ID} by alice (tenant t1)", "t1", False),  # its own member's retry
        (f"retry:{RUN_ID}", "t1", False),  # project code, no author
        ("manually", "t1", False),
        ("cron", "t1", False),
        ("", "t1", False),
        (f"followup:{RUN_ID}", "t1", False),
    ],
)
def test_who_started(trigger: str, schema: str, expected: bool) -> None:
    run = JobRun(job_name="unit.acts", schema_name="t1", status=RunStatus.FAILED, trigger=trigger)
    assert started_by_operator(run, schema) is expected


def test_a_run_an_operator_started_is_the_operators_to_retry_and_cancel() -> None:
    definition = JobDefinition(name="unit.acts", func=_body)
    with registry.override(definition):
        for trigger in ("manual by ops", f"retry:{RUN_ID} by ops"):
            run = JobRun(
                job_name="unit.acts", schema_name="t1", status=RunStatus.FAILED, trigger=trigger
            )
            assert refusal(run, RETRY, "t1") is OPERATOR_STARTED
            assert refusal(run, CANCEL, "t1") is OPERATOR_STARTED
        own = JobRun(
            job_name="unit.acts",
            schema_name="t1",
            status=RunStatus.QUEUED,
            trigger=f"retry:{RUN_ID} by alice (tenant t1)",
        )
        assert refusal(own, CANCEL, "t1") is None
