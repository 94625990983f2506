"""``run_on_boot`` stays once per Redis dataset after retention (issue 23), through real workers.

A worker's start alone enqueues the boot job (nothing else enqueues it here), and it runs, in
every tenant for a per-tenant one. Retention (``delete_expired``, the real code) then deletes
its expired runs; a worker started again enqueues nothing: the boot marker (migration 0018),
which retention never deletes, says it was enqueued for this dataset. A new Redis dataset (the
token gone) runs it once more, as docs/reliability.md promises.

Calibrated: with ``worker/boot.py``'s marker check removed (the run row as the only marker, as
before), ``test_a_boot_job_does_not_run_again_once_retention_deleted_its_runs`` failed: the
restarted worker enqueued the boot job again and it ran in every tenant a second time.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from kumiko_jobs import transport
from kumiko_jobs.history.retention import delete_expired
from kumiko_jobs.models import BootMarker, JobRun, RunStatus
from kumiko_jobs.transport.keys import BOOT_DATASET_KEY as DATASET_KEY
from kumiko_jobs.worker import Worker
from kumiko_jobs.worker.boot import boot_run_id

pytestmark = pytest.mark.usefixtures("live_db")

JOB_PREFIX = "bootonce"
calls: list[str] = []


def start_worker() -> None:
    """A real kumiko worker starting (its boot), then draining the queue, then stopping."""
    q = transport.get_queue("default")
    Worker([q], connection=q.connection).work(burst=True)


def _on_boot(ctx: Any) -> None:
    calls.append(ctx.schema_name or "public")


@pytest.fixture
def boot_job(declare: Any) -> Any:
    calls.clear()
    yield declare(_on_boot, per_tenant=True, run_on_boot=True)
    calls.clear()


def _expire(job_name: str) -> None:
    """Age the job's finished runs past RETENTION_DAYS (30), as a month of waiting would."""
    old = timezone.now() - timedelta(days=31)
    JobRun.objects.filter(job_name=job_name).update(finished_at=old, queued_at=old)


def test_a_workers_start_alone_enqueues_and_runs_the_boot_job(tenants, boot_job, redis_conn):
    start_worker()
    assert sorted(calls) == ["t1", "t2", "t3"]
    token = redis_conn.get(DATASET_KEY).decode()
    parent = JobRun.objects.get(job_name=boot_job.name, schema_name="")
    assert parent.run_id.hex == boot_run_id(boot_job.name, token)
    assert parent.trigger == "boot" and parent.status == RunStatus.SUCCEEDED
    assert BootMarker.objects.get(pk=parent.run_id).dataset == token


def test_a_boot_job_does_not_run_again_once_retention_deleted_its_runs(tenants, boot_job):
    start_worker()
    assert sorted(calls) == ["t1", "t2", "t3"]
    _expire(boot_job.name)
    deleted = delete_expired()
    assert deleted.runs == 4  # the fan-out parent and its three children
    assert not JobRun.objects.filter(job_name=boot_job.name).exists()
    calls.clear()
    start_worker()  # restarted: same Redis dataset
    start_worker()
    assert calls == []
    assert not JobRun.objects.filter(job_name=boot_job.name).exists()
    assert BootMarker.objects.filter(job_name=boot_job.name).count() == 1


def test_a_new_redis_dataset_runs_the_boot_job_once_more(tenants, boot_job, redis_conn):
    start_worker()
    _expire(boot_job.name)
    delete_expired()
    redis_conn.delete(DATASET_KEY)  # a flushed or new Redis: a new token
    calls.clear()
    start_worker()
    start_worker()
    assert sorted(calls) == ["t1", "t2", "t3"]
    assert BootMarker.objects.filter(job_name=boot_job.name).count() == 2


def test_a_boot_run_of_a_release_without_markers_gets_its_marker(tenants, boot_job, redis_conn):
    """Upgrading: the boot job was enqueued before migration 0018 (its run row, no marker). The
    first worker start writes the marker without enqueuing it again, so retention cannot make
    it run again either."""
    start_worker()
    BootMarker.objects.all().delete()  # as a release before the markers left it
    calls.clear()
    start_worker()
    assert calls == []
    assert BootMarker.objects.filter(job_name=boot_job.name).count() == 1
    _expire(boot_job.name)
    delete_expired()
    start_worker()
    assert calls == []
