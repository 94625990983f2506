"""Behaviour that was implemented but untested (issue 14), on real PostgreSQL, Redis and RQ."""

from __future__ import annotations

import pytest
from django.db import connections

from kumiko_jobs.models import JobAttempt, JobRun, RunStatus
from tests.conftest import probes, work
from tests.testapp import jobs

pytestmark = pytest.mark.usefixtures("live_db")


def _active_sleeps() -> int:
    """Backends still running the probe's sleep, seen from a second, separate connection."""
    from django.db import connection

    with connections["default"].temporary_connection() as cursor:  # type: ignore[attr-defined]
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' "
            "AND query LIKE %s AND pid <> pg_backend_pid()",
            ["%kumiko-timeout-probe%"],
        )
        count = int(cursor.fetchone()[0])
    assert connection.connection is None or not connection.connection.closed
    return count


def test_a_timeout_cancels_the_statement_on_the_server_and_leaves_a_clean_connection(tenants):
    timed_out = jobs.sleeps_in_postgres.enqueue(tenant="t1", tag="sleep")
    after = jobs.reports_backend.enqueue(tenant="t1", tag="next")
    work()
    run = JobRun.objects.get(pk=timed_out.run_id)
    assert run.status == RunStatus.FAILED and run.error_type == "JobTimeoutException"
    attempt = JobAttempt.objects.get(run=run)
    # PostgreSQL itself ended the statement ("canceling statement due to user request")...
    assert "QueryCanceled" in attempt.traceback
    assert "woke up" not in [p.note for p in probes("t1")]
    # ...so no backend still sleeps for a run that is over.
    assert _active_sleeps() == 0
    # The next run on the same worker used the same session, and it was clean.
    notes = [p.note for p in probes("t1")]
    assert JobRun.objects.get(pk=after.run_id).status == RunStatus.SUCCEEDED
    assert notes[0].startswith("pid ") and notes[-1] == notes[0]


def test_final_attempt_is_true_on_the_only_attempt_of_a_job_without_retries(tenants):
    jobs.final_attempt_probe.enqueue(tenant="t1", tag="once")
    work()
    assert [p.note for p in probes("t1")] == ["attempt 1 final True"]
