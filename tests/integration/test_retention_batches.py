"""Retention at scale (issue 15): bounded batches, each committed on its own, no rows loaded.

Real PostgreSQL; a second connection of its own (psycopg) watches the table between batches,
as a worker writing runs would see it."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from django.db import connection
from django.db.models.signals import post_init
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from kumiko_jobs.history import retention
from kumiko_jobs.models import JobAttempt, JobFailure, JobRun, RunStatus

pytestmark = pytest.mark.usefixtures("live_db")

OLD = 45  # days; RETENTION_DAYS is 30 in the test settings


def _runs(count: int, *, days_ago: float, status: str = RunStatus.SUCCEEDED) -> list[JobRun]:
    when = timezone.now() - timedelta(days=days_ago)
    finished = when if status in (RunStatus.SUCCEEDED, RunStatus.FAILED) else None
    runs = JobRun.objects.bulk_create(
        JobRun(
            run_id=uuid.uuid4(),
            job_name="billing.sync_invoice",
            schema_name="t1",
            subject=f"invoice_id={i}",
            status=status,
            queue="default",
            queued_at=when,
            finished_at=finished,
        )
        for i in range(count)
    )
    JobAttempt.objects.bulk_create(
        JobAttempt(
            run=run,
            number=n,
            started_at=when,
            finished_at=when,
            duration_ms=1,
            outcome="succeeded" if n == 2 else "retrying",
        )
        for run in runs
        for n in (1, 2)
    )
    return runs


class Instances:
    """Counts the model instances Django builds (post_init fires for every row it loads)."""

    def __init__(self) -> None:
        self.count = 0

    def __enter__(self) -> Instances:
        post_init.connect(self._seen, sender=JobRun)
        post_init.connect(self._seen, sender=JobAttempt)
        return self

    def __exit__(self, *exc: object) -> None:
        post_init.disconnect(self._seen, sender=JobRun)
        post_init.disconnect(self._seen, sender=JobAttempt)

    def _seen(self, **kwargs: Any) -> None:
        self.count += 1


def _watcher() -> psycopg.Connection[Any]:
    """A connection of its own, outside Django's, on the public schema."""
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    params.pop("prepare_threshold", None)
    watcher = psycopg.connect(**params, autocommit=True)
    watcher.execute("SET search_path = public")
    return watcher


def test_expired_runs_go_in_bounded_batches_with_their_attempts_and_nothing_else():
    expired = _runs(23, days_ago=OLD)
    recent = _runs(3, days_ago=1)
    running = _runs(2, days_ago=OLD, status=RunStatus.RUNNING)  # old, but not finished
    seen_by_others: list[int] = []
    watcher = _watcher()

    def after_batch(deleted: int) -> None:
        # Another session sees each batch gone at once: it committed, its locks are released.
        (left,) = watcher.execute(
            "SELECT count(*) FROM kumiko_jobs_jobrun WHERE run_id = ANY(%s)",
            [[r.run_id for r in expired]],
        ).fetchone() or (None,)
        seen_by_others.append(int(left))

    try:
        with Instances() as instances, CaptureQueriesContext(connection) as captured:
            deleted = retention.delete_in_batches(
                JobRun.objects.filter(
                    status__in=retention.FINISHED_STATUSES,
                    finished_at__lt=timezone.now() - timedelta(days=30),
                ),
                batch_size=5,
                after_batch=after_batch,
            )
    finally:
        watcher.close()

    assert deleted == 23
    assert seen_by_others == [18, 13, 8, 3, 0]  # five batches of at most 5, each committed
    assert instances.count == 0  # no row was loaded into Python
    deletes = [q["sql"] for q in captured.captured_queries if "DELETE FROM" in q["sql"]]
    assert len(deletes) == 5
    assert all("LIMIT 5 FOR UPDATE SKIP LOCKED" in sql for sql in deletes)
    left = set(JobRun.objects.values_list("run_id", flat=True))
    assert left == {r.run_id for r in recent + running}
    # The attempts of the deleted runs went with them; the others' stayed.
    assert set(JobAttempt.objects.values_list("run_id", flat=True)) == left
    assert JobAttempt.objects.count() == 2 * len(left)


def test_calibration_django_delete_loads_every_run_into_python():
    """What the batches avoid: QuerySet.delete() builds an instance per run to cascade."""
    _runs(7, days_ago=OLD)
    with Instances() as instances:
        JobRun.objects.filter(finished_at__lt=timezone.now() - timedelta(days=30)).delete()
    assert instances.count >= 7


def test_delete_expired_uses_the_batches_for_runs_and_failures():
    _runs(12, days_ago=OLD)
    keep = _runs(1, days_ago=1)
    failed = _runs(1, days_ago=OLD, status=RunStatus.FAILED)[0]
    resolved = JobFailure.objects.create(
        schema_name="t1",
        job_name=failed.job_name,
        subject="invoice_id=0",
        message_key="billing.sync_failed",
        failed_at=timezone.now() - timedelta(days=OLD + 1),
        run_id=failed.run_id,
    )
    with Instances() as instances:
        result = retention.delete_expired(batch_size=4)
    # 12 + the failed one; the failure was resolved by a later success of invoice_id=0.
    assert (result.runs, result.failures) == (13, 1)
    assert instances.count == 0
    assert list(JobRun.objects.values_list("run_id", flat=True)) == [keep[0].run_id]
    assert not JobFailure.objects.filter(pk=resolved.pk).exists()


def test_a_row_locked_by_another_session_is_left_for_the_next_sweep():
    runs = _runs(4, days_ago=OLD)
    locked = runs[0].run_id
    watcher = _watcher()
    try:
        with watcher.transaction():
            watcher.execute(
                "SELECT 1 FROM kumiko_jobs_jobrun WHERE run_id = %s FOR UPDATE", [locked]
            )
            # Without SKIP LOCKED this call would wait for the other session, which waits for
            # it: the lock timeout turns that hang into an error.
            with connection.cursor() as cursor:
                cursor.execute("SET lock_timeout = '10s'")
            try:
                assert retention.delete_in_batches(JobRun.objects.all(), batch_size=10) == 3
            finally:
                with connection.cursor() as cursor:
                    cursor.execute("RESET lock_timeout")
        assert list(JobRun.objects.values_list("run_id", flat=True)) == [locked]
        assert retention.delete_in_batches(JobRun.objects.all(), batch_size=10) == 1
    finally:
        watcher.close()
