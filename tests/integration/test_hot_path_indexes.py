"""Migration 0026: two of the run table's indexes are partial, so a run's start and finish
write fewer index entries, and every query that read them still can.

* kj_run_job_tenant holds active runs only: admission (concurrency="skip", max_per_tenant),
  "replace" and a retry's pending check ask for active statuses;
* kj_run_finished holds finished runs only: every reader asks for a range of finished_at.

The plans are asked of a tiny table with only bitmap index scans allowed (a node the planner
was told not to use costs ``DISABLED``), as in test_admin_scale.py. Real PostgreSQL.
"""

from __future__ import annotations

import importlib
import io
import uuid
from datetime import timedelta

import pytest
from django.contrib.postgres.operations import AddIndexConcurrently, RemoveIndexConcurrently
from django.core.management import call_command
from django.db import connection
from django.db.migrations import RenameIndex
from django.db.models import QuerySet
from django.utils import timezone

from kumiko_jobs.models import FINISHED_STATUSES, WAITING_STATUSES, JobRun, RunStatus

pytestmark = pytest.mark.usefixtures("live_db")

ACTIVE = (RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.DEFERRED)
DISABLED = "cost=10000000000"


def runs(count: int, status: str, job: str = "hot.job") -> None:
    now = timezone.now()
    JobRun.objects.bulk_create(
        JobRun(
            run_id=uuid.uuid4(),
            job_name=job,
            schema_name="t1",
            status=status,
            queue="default",
            queued_at=now - timedelta(minutes=i),
            finished_at=now - timedelta(minutes=i) if status in FINISHED_STATUSES else None,
        )
        for i in range(count)
    )


def bitmap_only_plan(queryset: QuerySet[JobRun]) -> str:
    statement, params = queryset.query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute("SET enable_seqscan = off")
        cursor.execute("SET enable_indexscan = off")
        cursor.execute("SET enable_indexonlyscan = off")
        try:
            cursor.execute("EXPLAIN " + statement, params)
            return "\n".join(row[0] for row in cursor.fetchall())
        finally:
            cursor.execute("RESET enable_seqscan")
            cursor.execute("RESET enable_indexscan")
            cursor.execute("RESET enable_indexonlyscan")


def definition(name: str) -> str:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT i.indisvalid, pg_get_indexdef(i.indexrelid) FROM pg_index i"
            " WHERE i.indexrelid = %s::regclass",
            [name],
        )
        valid, text = cursor.fetchone()
    assert valid
    return str(text)


def test_the_two_indexes_are_partial():
    assert "WHERE (finished_at IS NOT NULL)" in definition("kj_run_finished")
    assert "(job_name, schema_name, status) WHERE" in definition("kj_run_job_tenant")
    for status in ACTIVE:
        assert f"'{status}'" in definition("kj_run_job_tenant")


def test_admission_replace_and_retry_read_the_active_runs_index():
    runs(3, RunStatus.SUCCEEDED)
    runs(2, RunStatus.QUEUED)
    mine = JobRun.objects.filter(job_name="hot.job", schema_name="t1")
    # Other jobs' runs of the same tenant, so that the job's index is the planner's best choice.
    runs(400, RunStatus.QUEUED, job="hot.other")
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE kumiko_jobs_jobrun")
    for queryset in (
        mine.filter(status__in=ACTIVE),  # enqueueing/admission.py
        mine.filter(status=RunStatus.QUEUED),  # replace
        mine.filter(status__in=(*WAITING_STATUSES, RunStatus.RUNNING)),  # operations.retry_run
    ):
        plan = bitmap_only_plan(queryset)
        assert "kj_run_job_tenant" in plan, plan
        assert DISABLED not in plan, plan
    # Calibration: finished runs are not in it, so a query for them cannot use it.
    plan = bitmap_only_plan(mine.filter(status=RunStatus.SUCCEEDED))
    assert "kj_run_job_tenant" not in plan, plan


def test_every_finished_at_range_reads_the_finished_runs_index():
    runs(3, RunStatus.SUCCEEDED)
    runs(400, RunStatus.QUEUED, job="hot.other")
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE kumiko_jobs_jobrun")
    since = timezone.now() - timedelta(days=1)
    for queryset in (
        JobRun.objects.filter(finished_at__gte=since),  # dashboard, rollup, unique_for
        JobRun.objects.filter(finished_at__gte=since, finished_at__lt=timezone.now()),
        JobRun.objects.filter(status__in=FINISHED_STATUSES, finished_at__lt=since),  # retention
    ):
        plan = bitmap_only_plan(queryset)
        assert "kj_run_finished" in plan, plan
        assert DISABLED not in plan, plan
    # Calibration: unfinished runs are not in it.
    plan = bitmap_only_plan(JobRun.objects.filter(finished_at__isnull=True))
    assert "kj_run_finished" not in plan, plan


def test_the_migration_builds_and_drops_concurrently_outside_a_transaction():
    migration = importlib.import_module("kumiko_jobs.migrations.0026_hot_path_indexes")
    assert migration.Migration.atomic is False
    kinds = {type(op) for op in migration.Migration.operations}
    assert kinds == {AddIndexConcurrently, RemoveIndexConcurrently, RenameIndex}
    out = io.StringIO()
    call_command("sqlmigrate", "kumiko_jobs", "0026", stdout=out)
    statements = [
        line.strip()
        for line in out.getvalue().splitlines()
        if line.strip().startswith(("CREATE", "DROP"))
    ]
    assert len(statements) == 4
    assert all(
        s.startswith(("CREATE INDEX CONCURRENTLY", "DROP INDEX CONCURRENTLY")) for s in statements
    )
