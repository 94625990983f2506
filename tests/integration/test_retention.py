"""Retention of failures and audit rows, and a deleted tenant's history (issue 14).

Real PostgreSQL; the sweep and the tenant model's own delete path, nothing mocked."""

from __future__ import annotations

import logging
import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.test import override_settings
from django.utils import timezone

from kumiko_jobs.models import EscapeHatchUse, JobAttempt, JobFailure, JobRun, RunStatus
from kumiko_jobs.worker.sweep import sweep

pytestmark = pytest.mark.usefixtures("live_db")
# A tenant's data in the history; not bare digits, which ids and times may hold by chance.
SECRET = "card-4242"
BASE = {"DB_GUARD": "enforce", "DEFAULT_RETRIES": 0, "PUSH_FAILURE_PAUSE": 0}


def _run(
    schema: str,
    status: str,
    *,
    finished_days_ago: float,
    subject: str = "invoice_id=7",
    job: str = "billing.sync_invoice",
    payload: dict[str, Any] | None = None,
) -> JobRun:
    finished = timezone.now() - timedelta(days=finished_days_ago)
    return JobRun.objects.create(
        run_id=uuid.uuid4(),
        job_name=job,
        schema_name=schema,
        subject=subject,
        status=status,
        queue="default",
        queued_at=finished,
        finished_at=finished,
        payload=payload or {"invoice_id": 7},
        error_message=f"boom: {SECRET} declined" if status == RunStatus.FAILED else "",
    )


def _failure(schema: str, run: JobRun, *, days_ago: float, subject: str = "invoice_id=7") -> Any:
    return JobFailure.objects.create(
        schema_name=schema,
        job_name=run.job_name,
        subject=subject,
        message_key="billing.sync_failed",
        failed_at=timezone.now() - timedelta(days=days_ago),
        run_id=run.run_id,
    )


def test_a_resolved_failure_goes_an_unresolved_one_stays_after_its_run_is_gone():
    failed = _run("t1", RunStatus.FAILED, finished_days_ago=40)
    unresolved = _failure("t1", failed, days_ago=40)
    other = _run("t2", RunStatus.FAILED, finished_days_ago=2, subject="invoice_id=8")
    resolved = _failure("t2", other, days_ago=2, subject="invoice_id=8")
    _run("t2", RunStatus.SUCCEEDED, finished_days_ago=1, subject="invoice_id=8")
    # A success *before* the failure resolves nothing.
    _run("t1", RunStatus.SUCCEEDED, finished_days_ago=41)
    result = sweep()
    assert result.deleted_failures == 1
    assert list(JobFailure.objects.values_list("pk", flat=True)) == [unresolved.pk]
    assert not JobFailure.objects.filter(pk=resolved.pk).exists()
    # Its run was deleted by RETENTION_DAYS (30); the tenant still sees the failure.
    assert not JobRun.objects.filter(pk=failed.pk).exists()


def test_failure_retention_drops_old_unresolved_failures_and_says_so(caplog):
    old = _failure("t1", _run("t1", RunStatus.FAILED, finished_days_ago=5), days_ago=20)
    recent = _failure(
        "t1",
        _run("t1", RunStatus.FAILED, finished_days_ago=1, subject="s"),
        days_ago=1,
        subject="s",
    )
    with (
        override_settings(KUMIKO_JOBS={**BASE, "FAILURE_RETENTION_DAYS": 10}),
        caplog.at_level(logging.WARNING, logger="kumiko_jobs.retention"),
    ):
        assert sweep().deleted_failures == 1
    assert not JobFailure.objects.filter(pk=old.pk).exists()
    assert JobFailure.objects.filter(pk=recent.pk).exists()
    assert "deleted 1 unresolved tenant-visible failure(s)" in caplog.text


def _audit(days_ago: float, actor: str) -> EscapeHatchUse:
    seen = timezone.now() - timedelta(days=days_ago)
    return EscapeHatchUse.objects.create(
        job_name="billing.rebuild",
        grant="global_writes",
        reason="why",
        schema_name="t1",
        actor=actor,
        first_seen=seen,
        last_seen=seen,
    )


def test_escape_hatch_audit_rows_have_their_own_retention():
    EscapeHatchUse.objects.all().delete()
    _audit(400, "old")
    _audit(10, "recent")
    assert sweep().deleted_audit == 1
    assert list(EscapeHatchUse.objects.values_list("actor", flat=True)) == ["recent"]
    with override_settings(KUMIKO_JOBS={**BASE, "ESCAPE_HATCH_RETENTION_DAYS": 0}):
        _audit(4000, "ancient")
        assert sweep().deleted_audit == 0  # 0 keeps them


def _tenant_with_history(schema: str) -> tuple[Any, JobRun]:
    from example_project.customers.models import Client

    # bulk_create: a tenant row without creating (or, on delete, dropping) a schema.
    Client.objects.bulk_create([Client(schema_name=schema, name="Leaving")])
    run = _run(schema, RunStatus.FAILED, finished_days_ago=1, payload={"card": SECRET})
    JobAttempt.objects.create(
        run=run,
        number=1,
        started_at=run.queued_at,
        finished_at=run.finished_at,
        duration_ms=1,
        outcome="failed",
        error_message=SECRET,
        traceback=f"tb {SECRET}",
        log=[{"msg": f"charging {SECRET}"}],
    )
    _failure(schema, run, days_ago=1)
    # Fields the tenant's data can reach besides the payload: a result, who asked to cancel.
    JobRun.objects.filter(pk=run.pk).update(
        result={"last4": SECRET}, cancel_requested_by=f"user {SECRET}"
    )
    return Client.objects.filter(schema_name=schema), run


def test_deleting_a_tenant_purges_its_history_and_leaves_others():
    keep = _run("t1", RunStatus.SUCCEEDED, finished_days_ago=1)
    tenant, run = _tenant_with_history("leaving1")
    tenant.delete()
    assert not JobRun.objects.filter(schema_name="leaving1").exists()
    assert not JobAttempt.objects.filter(run_id=run.pk).exists()
    assert not JobFailure.objects.filter(schema_name="leaving1").exists()
    assert JobRun.objects.filter(pk=keep.pk).exists()


def test_deleting_a_tenant_can_anonymise_its_history_instead():
    tenant, run = _tenant_with_history("leaving2")
    with override_settings(KUMIKO_JOBS={**BASE, "TENANT_DELETION": "anonymise"}):
        tenant.delete()
    row = JobRun.objects.get(pk=run.pk)
    assert (row.status, row.job_name) == (RunStatus.FAILED, "billing.sync_invoice")
    assert row.payload == {} and row.subject == "" and row.error_message == ""
    attempt = JobAttempt.objects.get(run=row)
    assert (attempt.error_message, attempt.traceback, attempt.log) == ("", "", [])
    assert not JobFailure.objects.filter(schema_name="leaving2").exists()
    # Nothing of the tenant's data is left in any history column.
    assert SECRET not in repr(list(JobRun.objects.filter(pk=run.pk).values()))
    assert SECRET not in repr(list(JobAttempt.objects.filter(run=row).values()))
