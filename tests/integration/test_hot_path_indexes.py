"""Migration 0027: kj_run_finished holds finished runs only (a run's enqueue and start write
one index entry less each), and every query that read it still can, since each asks for a range
of finished_at; kj_run_job_tenant stays whole, since the tenants' job filter needs it.

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
from django.db import connection, transaction
from django.db.migrations import RenameIndex
from django.db.models import QuerySet
from django.utils import timezone

from kumiko_jobs.models import FINISHED_STATUSES, JobRun, RunStatus

pytestmark = pytest.mark.usefixtures("live_db")

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


def test_the_finished_index_is_partial_and_the_job_tenant_index_whole():
    assert "WHERE (finished_at IS NOT NULL)" in definition("kj_run_finished")
    assert "WHERE" not in definition("kj_run_job_tenant")


def test_the_tenants_job_filter_probes_the_job_tenant_index_in_every_status():
    """Why kj_run_job_tenant stays whole (migration 0027): the tenant's job filter asks, per job
    name, for one run of the tenant whatever its status."""
    from kumiko_jobs.admin.filters import run_job_names

    runs(3, RunStatus.SUCCEEDED)
    runs(400, RunStatus.SUCCEEDED, job="hot.other")
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE kumiko_jobs_jobrun")
    assert run_job_names("t1") == ["hot.job", "hot.other"]
    assert "kj_run_job_tenant" in job_filter_plan()
    # Calibration: an index of active runs only cannot answer the probe.
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("DROP INDEX kj_run_job_tenant")
            cursor.execute(
                "CREATE INDEX kj_run_job_tenant ON kumiko_jobs_jobrun (job_name, schema_name,"
                " status) WHERE status IN ('queued', 'running', 'deferred')"
            )
        assert "kj_run_job_tenant" not in job_filter_plan()
        transaction.set_rollback(True)
    assert "kj_run_job_tenant" in job_filter_plan()


def job_filter_plan() -> str:
    """The plan of the tenant's probe (run_job_names' EXISTS), bitmap index scans only."""
    with connection.cursor() as cursor:
        cursor.execute("SET enable_seqscan = off")
        cursor.execute("SET enable_indexscan = off")
        cursor.execute("SET enable_indexonlyscan = off")
        try:
            cursor.execute(
                "EXPLAIN SELECT 1 FROM kumiko_jobs_jobrun r"
                " WHERE r.job_name = %s AND r.schema_name = %s",
                ["hot.job", "t1"],
            )
            return "\n".join(row[0] for row in cursor.fetchall())
        finally:
            cursor.execute("RESET enable_seqscan")
            cursor.execute("RESET enable_indexscan")
            cursor.execute("RESET enable_indexonlyscan")


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
    migration = importlib.import_module("kumiko_jobs.migrations.0027_hot_path_indexes")
    assert migration.Migration.atomic is False
    kinds = {type(op) for op in migration.Migration.operations}
    assert kinds == {AddIndexConcurrently, RemoveIndexConcurrently, RenameIndex}
    out = io.StringIO()
    call_command("sqlmigrate", "kumiko_jobs", "0027", stdout=out)
    statements = [
        line.strip()
        for line in out.getvalue().splitlines()
        if line.strip().startswith(("CREATE", "DROP"))
    ]
    assert len(statements) == 2
    assert all(
        s.startswith(("CREATE INDEX CONCURRENTLY", "DROP INDEX CONCURRENTLY")) for s in statements
    )
