"""An atomic run's finish rides in its own transaction (migration 0029).

The success function writes the attempt's row, the run's last columns (its duration, its last
progress) and clears the tenant's failure for the run's subject, in the body's transaction, with
the success: no finish statement follows on the project's connection, and one synchronous
commit instead of two. What proves it: every row the run wrote carries the same ``xmin`` (the
transaction that wrote it), the body's own row included. A finish written after the COMMIT (a
plain run's) carries another, which is the calibration.

Real PostgreSQL (DB_ROLES on, the suite's default), real Redis, a real RQ worker in process.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone
from django_tenants.utils import schema_context

from kumiko_jobs.models import JobAttempt, JobFailure, JobRun, RunStatus
from tests.conftest import work
from tests.testapp import jobs
from tests.testapp.models import Probe

pytestmark = pytest.mark.usefixtures("live_db")


def _xmin(sql: str, params: list[Any]) -> str:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    assert len(rows) == 1, rows
    return str(rows[0][0])


def _xmins(run: JobRun, tag: str) -> dict[str, str]:
    """The transaction that wrote each of the run's rows: the body's probe, the run, its attempt."""
    with schema_context("t1"):
        probe = _xmin(f"SELECT xmin FROM {Probe._meta.db_table} WHERE tag = %s", [tag])
    connection.set_schema_to_public()
    return {
        "probe": probe,
        "run": _xmin("SELECT xmin FROM public.kumiko_jobs_jobrun WHERE run_id = %s", [run.pk]),
        "attempt": _xmin(
            "SELECT xmin FROM public.kumiko_jobs_jobattempt WHERE run_id = %s", [run.pk]
        ),
    }


def _enqueue(job: Any, **kwargs: Any) -> str:
    return str(job.enqueue(tenant="t1", **kwargs).run_id)


def _finished(run_id: str) -> JobRun:
    work()
    connection.set_schema_to_public()
    return JobRun.objects.get(pk=run_id)


def test_an_atomic_success_writes_its_finish_in_the_body_transaction(tenants):
    run = _finished(_enqueue(jobs.atomic_reports, tag="rides"))
    assert run.status == RunStatus.SUCCEEDED and run.result == "rides", run.error_message
    xmins = _xmins(run, "rides")
    assert xmins["probe"] == xmins["run"] == xmins["attempt"], xmins
    # What the finish used to write is all there.
    (attempt,) = JobAttempt.objects.filter(run_id=run.pk)
    assert (attempt.number, attempt.outcome, attempt.error_type) == (1, "succeeded", "")
    assert attempt.worker and attempt.duration_ms > 0
    assert attempt.started_at <= attempt.finished_at == run.finished_at
    assert [line["msg"] for line in attempt.log] == ["writing"], attempt.log
    assert run.duration_ms == attempt.duration_ms
    assert (run.progress, run.progress_message) == (0.5, "half way")
    assert run.waiting_for == "" and run.atomic_key == ""


def test_calibration_a_plain_runs_finish_is_a_transaction_of_its_own(tenants):
    run = _finished(_enqueue(jobs.plain_write, tag="apart"))
    assert run.status == RunStatus.SUCCEEDED, run.error_message
    xmins = _xmins(run, "apart")
    assert xmins["probe"] != xmins["attempt"] == xmins["run"], xmins


def test_a_riding_success_clears_its_subjects_failure_only(tenants):
    run_id = _enqueue(jobs.atomic_reports, tag="cleared")
    queued = JobRun.objects.get(pk=run_id)
    assert queued.subject == "tag=cleared"
    for subject in (queued.subject, "tag=other"):
        JobFailure.objects.create(
            schema_name="t1",
            job_name=queued.job_name,
            subject=subject,
            message_key="testapp.generic",
            failed_at=timezone.now(),
            run_id=uuid.uuid4(),
        )
    # Another tenant's failure of the same subject is not this run's to clear.
    JobFailure.objects.create(
        schema_name="t2",
        job_name=queued.job_name,
        subject=queued.subject,
        message_key="testapp.generic",
        failed_at=timezone.now(),
        run_id=uuid.uuid4(),
    )
    run = _finished(run_id)
    assert run.status == RunStatus.SUCCEEDED, run.error_message
    xmins = _xmins(run, "cleared")
    assert xmins["probe"] == xmins["attempt"], xmins  # it rode
    left = set(
        JobFailure.objects.filter(job_name=queued.job_name).values_list("schema_name", "subject")
    )
    assert left == {("t1", "tag=other"), ("t2", "tag=cleared")}
