"""Run rows planted straight into the history, as the runner leaves them, for the tests of what
the admin does with runs (retry, cancel, bulk operations) without running them first."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import timedelta

from django.utils import timezone

from kumiko_jobs.models import FINISHED_STATUSES, JobRun, RunStatus
from tests.testapp import jobs


def plant(
    schema: str, statuses: Iterable[str], *, minutes_ago: float = 5, error: str = "RuntimeError"
) -> list[JobRun]:
    """Runs of ``probe`` in ``schema``, one per status, with arguments a retry can enqueue
    again (a tag of the schema, the status and its place in ``statuses``). Each is queued 2 s
    before ``minutes_ago``, the n-th n ms earlier still (the list's order is theirs); a queued
    run has not started, every other one started ``minutes_ago`` on its first attempt, and a
    finished one finished then; a failed one failed with ``error``."""
    when = timezone.now() - timedelta(minutes=minutes_ago)
    return JobRun.objects.bulk_create(
        JobRun(
            run_id=uuid.uuid4(),
            job_name=jobs.probe.name,
            schema_name=schema,
            status=status,
            queue="default",
            attempts=0 if status == RunStatus.QUEUED else 1,
            payload={"tag": f"{schema}-{status}-{n}"},
            queued_at=when - timedelta(seconds=2, milliseconds=n),
            started_at=None if status == RunStatus.QUEUED else when,
            finished_at=when if status in FINISHED_STATUSES else None,
            error_type=error if status == RunStatus.FAILED else "",
        )
        for n, status in enumerate(statuses)
    )
