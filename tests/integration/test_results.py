"""What a job returns is kept on its run: written by the finish statement, read from the
handle, shown to operators only. A result that cannot be kept never fails a succeeded run."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings

from kumiko_jobs.history.results import NOT_KEPT
from kumiko_jobs.models import JobAttempt, JobRun, RunStatus
from tests.conftest import work
from tests.integration.test_admin import (  # noqa: F401 - fixtures
    change_url,
    clerk,
    client_for,
    make_user,
    operator,
    operator_user,
    text,
)
from tests.integration.test_run_sql import _kind, recording
from tests.testapp import async_jobs, jobs

pytestmark = pytest.mark.usefixtures("live_db")


def test_a_result_is_written_by_the_one_finish_statement(tenants: Any) -> None:
    handle = async_jobs.returns.enqueue(tenant="t1", kind="dict")
    assert handle.status == RunStatus.QUEUED and handle.result is None
    with recording() as statements:
        work()
    run = handle.refresh()
    seen = statements.of(run.rq_job_id)
    # Still one statement at the start and one at the end (the job itself sends none).
    assert [_kind(sql) for sql in seen] == ["start", "finish"]
    assert '"result" = %s' in seen[-1]
    assert handle.status == RunStatus.SUCCEEDED
    assert handle.result == {"total": 3, "items": ["a", "b"], "ok": True}
    assert run.result == handle.result


def test_a_string_and_no_result(tenants: Any) -> None:
    text_run = async_jobs.returns.enqueue(tenant="t1", kind="string")
    none_run = async_jobs.returns.enqueue(tenant="t1", kind="none")
    work()
    text_run.refresh()
    none_run.refresh()
    assert text_run.result == "plain text"
    assert none_run.status == RunStatus.SUCCEEDED and none_run.result is None


@pytest.mark.parametrize(
    ("kind", "why"),
    [
        ("set", "not JSON: Object of type set is not JSON serializable"),
        ("nan", "not JSON: Out of range float values are not JSON compliant"),
        ("nul", "contains a NUL character"),
        ("huge", "larger than MAX_RESULT_BYTES=65536"),
    ],
)
def test_a_result_that_cannot_be_kept_leaves_the_run_succeeded_with_a_marker(
    tenants: Any, caplog: pytest.LogCaptureFixture, kind: str, why: str
) -> None:
    handle = async_jobs.returns.enqueue(tenant="t2", kind=kind)
    with caplog.at_level(logging.WARNING, logger="kumiko_jobs.results"):
        work()
    run = handle.refresh()
    assert run.status == RunStatus.SUCCEEDED, run.error_message
    assert run.error_type == "" and run.attempts == 1
    assert list(JobAttempt.objects.filter(run=run).values_list("outcome", flat=True)) == [
        "succeeded"
    ]
    assert set(handle.result) == {NOT_KEPT} and why in handle.result[NOT_KEPT]
    assert any(
        handle.run_id in r.getMessage() and "result was not kept" in r.getMessage()
        for r in caplog.records
    )


def test_the_cap_is_a_setting(tenants: Any) -> None:
    with override_settings(KUMIKO_JOBS={**settings.KUMIKO_JOBS, "MAX_RESULT_BYTES": 10}):
        small = async_jobs.returns.enqueue(tenant="t1", kind="string")  # 12 bytes of JSON
        work()
    small.refresh()
    assert "larger than MAX_RESULT_BYTES=10" in small.result[NOT_KEPT]


def test_a_failed_run_keeps_no_result(tenants: Any) -> None:
    handle = jobs.flaky.enqueue(tenant="t1", tag="x", fail_times=99)
    work(scheduler_rounds=3)
    handle.refresh()
    assert handle.status == RunStatus.FAILED and handle.result is None


def test_operators_see_the_result_tenants_do_not(
    tenants: Any,
    operator: Any,  # noqa: F811 - the fixture imported above
    clerk: Any,  # noqa: F811
) -> None:
    handle = async_jobs.returns.enqueue(tenant="t1", kind="dict")
    work()
    html = text(operator.get(change_url(handle)))
    assert "Result" in html and "&quot;total&quot;: 3" in html
    tenant_html = text(clerk.get(change_url(handle)))
    assert JobRun.objects.get(pk=handle.run_id).status == RunStatus.SUCCEEDED
    assert "total" not in tenant_html and "Result" not in tenant_html
