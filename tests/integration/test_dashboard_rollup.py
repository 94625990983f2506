"""The dashboard's rollup (history/rollup.py): the charts read from it show what the raw history
shows, it is rolled up only by the maintenance round, in bounded and repeatable rounds, and it
keeps no bucket past its window.

Known runs are planted in the real PostgreSQL history (several queues, jobs, tenants, outcomes,
waits and durations, over the last week); the chart data is computed once from the raw history
alone and once through the rollup, and compared point by point.
"""

from __future__ import annotations

import math
import uuid
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from kumiko_jobs.history import failure_groups, rollup, stats
from kumiko_jobs.models import JobRun, RunStatus
from kumiko_jobs.worker import maintenance
from tests.integration.test_dashboard import (  # noqa: F401 (the cache-clearing fixture)
    DATA,
    _fresh_cache,
    client_for,
    make_user,
    payload,
    total,
)

pytestmark = pytest.mark.usefixtures("live_db")

# (minutes ago, queue, job, tenant, status, attempts, wait s, duration ms)
PLANTED = [
    (2, "default", "app.send", "t1", RunStatus.SUCCEEDED, 1, 0.2, 12.0),
    (2, "default", "app.send", "t2", RunStatus.FAILED, 1, 1.5, 800.0),
    (3, "default", "app.send", "t1", RunStatus.SUCCEEDED, 2, 0.1, 40.0),
    (7, "low", "app.report", "t1", RunStatus.SUCCEEDED, 1, 30.0, 5000.0),
    (7, "low", "app.report", "", RunStatus.CANCELLED, 1, 2.0, None),
    (7, "low", "app.report", "t2", RunStatus.DEFERRED, 1, 2.0, None),
    (44, "default", "app.bill", "t2", RunStatus.FAILED, 3, 0.5, 3.0),
    (44, "default", "app.bill", "t2", RunStatus.RUNNING, 1, 0.5, None),
    (300, "default", "app.send", "t1", RunStatus.SUCCEEDED, 1, 0.05, 0.4),
    (301, "low", "app.bill", "t1", RunStatus.FAILED, 1, 9.0, 70.0),
    (4000, "default", "app.send", "t2", RunStatus.SUCCEEDED, 1, 120.0, 250.0),
    (9000, "low", "app.report", "t1", RunStatus.FAILED, 1, 3.0, 90_000.0),
    # The same job and error as at 44 minutes, on another queue, finishing later.
    (44, "low", "app.bill", "t1", RunStatus.FAILED, 2, 0.5, 900.0),
]


def plant(now: datetime, rows: list[tuple[Any, ...]] = PLANTED) -> None:
    JobRun.objects.bulk_create(
        JobRun(
            run_id=uuid.uuid4(),
            job_name=job,
            schema_name=tenant,
            status=status,
            queue=queue,
            attempts=attempts,
            queued_at=now - timedelta(minutes=ago, seconds=wait),
            started_at=now - timedelta(minutes=ago),
            finished_at=(
                now - timedelta(minutes=ago) + timedelta(milliseconds=duration or 0)
                if status in (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED)
                else None
            ),
            duration_ms=duration,
            error_type=("TimeoutError" if attempts > 1 else "ValueError")
            if status == RunStatus.FAILED
            else "",
        )
        for ago, queue, job, tenant, status, attempts, wait, duration in rows
    )


def chart(window: str, scope: stats.Scope, now: datetime, *, use_rollup: bool) -> dict[str, Any]:
    w = stats.WINDOWS[window]
    since = stats.bucket_start(w, now)
    return stats.points(w, scope, since, since + w.span, use_rollup=use_rollup)


def groups_of(
    window: str, scope: stats.Scope, now: datetime, *, use_rollup: bool
) -> list[dict[str, Any]]:
    w = stats.WINDOWS[window]
    since = stats.bucket_start(w, now)
    return failure_groups.failure_groups(w, scope, since, since + w.span, use_rollup=use_rollup)


def rollup_rows() -> int:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {rollup.ROLLUP_TABLE}")
        return int(cursor.fetchone()[0])


SCOPES = [stats.Scope(), stats.Scope(queue="low"), stats.Scope(job="app.send")]


def test_windows_and_grains_agree() -> None:
    assert {int(w.step.total_seconds()): w.span for w in stats.WINDOWS.values()} == rollup.GRAINS


@pytest.mark.parametrize("window", ["hour", "day", "week"])
def test_the_rollup_shows_what_the_raw_history_shows(window: str) -> None:
    now = timezone.now()
    plant(now)
    raw = {scope: chart(window, scope, now, use_rollup=False) for scope in SCOPES}
    assert rollup.catch_up(now) > 0 and rollup_rows() > 0
    raw_groups = {scope: groups_of(window, scope, now, use_rollup=False) for scope in SCOPES}
    for scope in SCOPES:
        assert chart(window, scope, now, use_rollup=True) == raw[scope], scope
        assert groups_of(window, scope, now, use_rollup=True) == raw_groups[scope], scope
    # Totals against the history itself, over the window's span.
    since = stats.bucket_start(stats.WINDOWS[window], now)
    points = list(raw[stats.Scope()].values())
    runs = JobRun.objects.filter(started_at__gte=since)
    assert sum(p["started"] for p in points) == runs.count()
    assert sum(p["retried"] for p in points) == runs.filter(attempts__gt=1).count()
    done = JobRun.objects.filter(finished_at__gte=since)
    for field in ("succeeded", "failed", "cancelled"):
        assert sum(p[field] for p in points) == done.filter(status=field).count(), field
    groups = {(g["job"], g["error_type"]): [g["count"], g["last"]] for g in raw_groups[SCOPES[0]]}
    expected = {
        (run.job_name, run.error_type): [
            done.filter(
                status=RunStatus.FAILED, job_name=run.job_name, error_type=run.error_type
            ).count(),
            run.finished_at.isoformat(),
        ]
        for run in done.filter(status=RunStatus.FAILED).order_by("finished_at")
    }
    assert groups == expected


def test_the_chart_reads_the_rollup_for_rolled_up_buckets() -> None:
    """Deleting the raw rows after the rollup leaves the rolled-up points as they were (they
    come from the rollup), while the raw computation and the tenant's (raw) chart lose them."""
    now = timezone.now()
    plant(now)
    before = chart("week", stats.Scope(), now, use_rollup=False)
    groups = groups_of("week", stats.Scope(), now, use_rollup=False)
    rollup.catch_up(now)
    JobRun.objects.filter(started_at__lt=now - timedelta(hours=2)).delete()
    assert chart("week", stats.Scope(), now, use_rollup=True) == before
    assert chart("week", stats.Scope(), now, use_rollup=False) != before
    assert groups_of("week", stats.Scope(), now, use_rollup=True) == groups
    assert groups_of("week", stats.Scope(), now, use_rollup=False) != groups
    tenant = chart("week", stats.Scope(tenant="t2"), now, use_rollup=True)
    assert sum(p["succeeded"] for p in tenant.values()) == 0  # t2's success was 4000 min ago


def test_unrolled_buckets_come_from_the_raw_history() -> None:
    """Runs planted after the rollup, in buckets not rolled up yet, are counted."""
    now = timezone.now()
    plant(now, PLANTED[6:])
    rollup.catch_up(now - timedelta(minutes=10))
    plant(now, PLANTED[:6])
    rolled = chart("hour", stats.Scope(), now, use_rollup=True)
    assert rolled == chart("hour", stats.Scope(), now, use_rollup=False)
    assert sum(p["started"] for p in rolled.values()) == 9


def test_rounds_are_bounded_repeatable_and_keep_only_the_span(monkeypatch: Any) -> None:
    now = timezone.now()
    plant(now)
    monkeypatch.setattr(rollup, "ROUND_SPAN", timedelta(hours=1))
    first = rollup.roll_up(now)
    # A round reads at most an hour per grain: 60 minutes, 4 quarters, 1 hour; and a day of
    # the worker time's (its step) and of the tenants' days (history/tenant_rollup.py).
    assert first == 60 + 4 + 1 + 1 + 1
    marks = {grain: rollup.rolled_until(grain) for grain in rollup.GRAINS}
    assert marks[3600] == rollup.floor_to(now, 3600) - timedelta(days=7) + timedelta(hours=1)
    rollup.catch_up(now)
    assert rollup.roll_up(now) == 0
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT * FROM {rollup.ROLLUP_TABLE} ORDER BY 1, 2, 3, 4")
        rows = cursor.fetchall()
        # Recomputing every bucket gives the same rows.
        cursor.execute(f"DELETE FROM {rollup.MARK_TABLE}")
        rollup.catch_up(now)
        cursor.execute(f"SELECT * FROM {rollup.ROLLUP_TABLE} ORDER BY 1, 2, 3, 4")
        assert cursor.fetchall() == rows
        # A day later, the minute and quarter buckets of today have left their windows.
        rollup.roll_up(now + timedelta(days=2))
        cursor.execute(
            f"SELECT grain, min(bucket) FROM {rollup.ROLLUP_TABLE} GROUP BY grain ORDER BY 1"
        )
        later = now + timedelta(days=2)
        for grain, oldest in cursor.fetchall():
            assert oldest >= rollup.floor_to(later, grain) - rollup.GRAINS[grain], grain


def test_the_maintenance_round_rolls_up() -> None:
    operator = client_for(
        "localhost", "public", make_user("public", "ops", ("view_all_tenants", "view_jobrun"))
    )
    now = timezone.now()
    plant(now)
    assert all(rollup.rolled_until(grain) is None for grain in rollup.GRAINS)
    maintenance.run_maintenance()
    assert all(rollup.rolled_until(grain) is not None for grain in rollup.GRAINS)
    rollup.catch_up()
    week = payload(operator.get(DATA, {"window": "week"}))["series"]["points"]
    assert total(week, "succeeded") == JobRun.objects.filter(status=RunStatus.SUCCEEDED).count()
    # The round's sweep and relay failed the planted running and deferred runs (no worker,
    # unknown jobs): they finished now, in a bucket the rollup has not reached.
    assert total(week, "failed") == JobRun.objects.filter(status=RunStatus.FAILED).count() == 7


def test_histogram_percentiles_are_within_a_bucket() -> None:
    """What the rollup's percentiles cost in precision: within 9% of the value at the rank."""
    values = [0.5 * 1.07**n for n in range(300)]
    histogram: dict[str, int] = {}
    for v in values:
        index = str(int(rollup.PER_DOUBLING * math.log2(max(v, 1.0))))
        histogram[index] = histogram.get(index, 0) + 1
    read = stats.histogram_percentiles(histogram)
    assert read is not None
    for q, got in zip(stats.PERCENTILES, read, strict=True):
        exact = max(sorted(values)[int(q * (len(values) - 1))], 1.0)
        assert abs(got - exact) <= 0.095 * exact, (q, got, exact)
    assert stats.histogram_percentiles(None) is None and stats.histogram_percentiles({}) is None
