"""What a cold week no longer reads run by run (issue 26): the failure groups, merged and ranked
by the database and cut to what the page shows, and the tenants' share of worker time, read
from the worker-time rollup (history/rollup.py, per UTC day, queue and tenant) with the
window's edges read raw. Both are compared with the raw history: known runs planted in the real
PostgreSQL history, the expected numbers computed from them in Python.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from kumiko_jobs.history import failure_groups, rollup, shares, stats
from kumiko_jobs.models import JobRun, RunStatus
from tests.integration.test_dashboard import (  # noqa: F401 (the cache-clearing fixture)
    DATA,
    _fresh_cache,
    client_for,
    make_user,
    payload,
)

pytestmark = pytest.mark.usefixtures("live_db")

WEEK = stats.WINDOWS["week"]
DAY = timedelta(seconds=rollup.DAY)


def a_fixed_now() -> datetime:
    """13:20 UTC today: the week window then starts at 14:00 seven days back, so it has a
    leading edge (14:00 to midnight) and a trailing one (midnight to now) around six whole
    days, whatever time the test runs at."""
    return rollup.floor_to(timezone.now(), rollup.DAY) + timedelta(hours=13, minutes=20)


def finished(
    at: datetime,
    *,
    job: str = "app.work",
    tenant: str = "t1",
    flow: str = "",
    queue: str = "default",
    status: str = RunStatus.SUCCEEDED,
    duration: float | None = 10.0,
    error: str = "",
) -> JobRun:
    return JobRun(
        run_id=uuid.uuid4(),
        job_name=job,
        schema_name=tenant,
        flow_schema=flow,
        status=status,
        queue=queue,
        attempts=1,
        queued_at=at - timedelta(seconds=1),
        started_at=at - timedelta(milliseconds=duration or 0),
        finished_at=at,
        duration_ms=duration,
        error_type=error or ("ValueError" if status == RunStatus.FAILED else ""),
    )


# ---------------------------------------------------------------- failure groups


def expected_groups(since: datetime, until: datetime, limit: int, **filters: Any) -> list[Any]:
    """The raw history's groups as the page ranked them before: by count, then (job, error)
    in Python's (code-point) order, the first ``limit``."""
    groups: dict[tuple[str, str], list[Any]] = {}
    failed = JobRun.objects.filter(
        status=RunStatus.FAILED, finished_at__gte=since, finished_at__lt=until, **filters
    )
    for run in failed:
        group = groups.setdefault((run.job_name, run.error_type), [0, run.finished_at])
        group[0] += 1
        group[1] = max(group[1], run.finished_at)
    ranked = sorted(groups.items(), key=lambda g: (-g[1][0], g[0]))[:limit]
    return [
        {"job": job, "error_type": error, "count": n, "last": last.isoformat(), "system": False}
        for (job, error), (n, last) in ranked
    ]


def plant_failures(now: datetime) -> None:
    """30 (job, error) groups with counts 1 to 5 (many ties), each split over two queues and
    over hours the rollup holds and the current hour it does not; among those of count 5,
    names whose code-point order (Python's, and the query's COLLATE "C" on any server locale)
    differs from a language's: "app.B" < "app.a" < "app.job.." < "app.É"; some successes and
    cancellations."""
    runs = []
    for i in range(30):
        job = ("app.B", "app.a", "app.\u00c9", f"app.job{i:02d}")[min(i, 3)]
        error = "KeyError" if i % 2 else "ValueError"
        for k in range(5 if i < 3 else i % 5 + 1):
            at = now - timedelta(hours=k * 13 % 150, minutes=k * 7) if k else now
            queue = "low" if k % 2 else "default"
            tenant = "t2" if i % 3 == 0 else "t1"
            runs.append(
                finished(
                    at, job=job, tenant=tenant, queue=queue, status=RunStatus.FAILED, error=error
                )
            )
        runs.append(finished(now - timedelta(hours=i), job=job))
    runs.append(finished(now - timedelta(hours=3), job="app.a", status=RunStatus.CANCELLED))
    JobRun.objects.bulk_create(runs)


@pytest.mark.parametrize("limit", [5, 20, 100])
def test_failure_groups_are_the_raw_historys_top_groups(limit: int) -> None:
    now = timezone.now()
    plant_failures(now)
    since = stats.bucket_start(WEEK, now)
    until = since + WEEK.span
    expected = expected_groups(since, until, limit)
    assert len(expected) == min(limit, 30)

    def groups(scope: stats.Scope, *, use_rollup: bool) -> list[dict[str, Any]]:
        return failure_groups.failure_groups(
            WEEK, scope, since, until, limit=limit, use_rollup=use_rollup
        )

    assert groups(stats.Scope(), use_rollup=False) == expected
    assert rollup.catch_up(now) > 0
    # The rollup holds the hours before the current one; the current hour is read raw.
    assert rollup.rolled_until(3600) == rollup.floor_to(now, 3600)
    assert groups(stats.Scope(), use_rollup=True) == expected
    for scope, filters in (
        (stats.Scope(queue="low"), {"queue": "low"}),
        (stats.Scope(job="app.a"), {"job_name": "app.a"}),
        (stats.Scope(tenant="t2"), {"schema_name": "t2"}),
    ):
        want = expected_groups(since, until, limit, **filters)
        assert want, scope
        assert groups(scope, use_rollup=True) == want, scope
        assert groups(scope, use_rollup=False) == want, scope


def test_the_page_sends_the_top_20_groups_with_their_links() -> None:
    operator = client_for(
        "localhost", "public", make_user("public", "ops", ("view_all_tenants", "view_jobrun"))
    )
    now = timezone.now()
    plant_failures(now)
    rollup.catch_up(now)
    sent = payload(operator.get(DATA, {"window": "week"}))
    since = stats.bucket_start(WEEK, timezone.now())
    expected = expected_groups(since, since + WEEK.span, failure_groups.FAILURE_GROUPS)
    keys = ("job", "error_type", "count", "last", "system")
    assert [{k: g[k] for k in keys} for g in sent["failures"]] == expected
    assert all("error_type__exact=" in g["link"] for g in sent["failures"])
    assert all("failures" not in point for point in sent["series"]["points"])


# ---------------------------------------------------------------- worker time


def plant_worker_time(now: datetime) -> None:
    """Finished runs in each part of the week window: before it (not counted), its leading
    edge, whole days, today before and after the rollup's end, in two queues, for t1, t2,
    the system's own runs (tenant '') and system runs t2's runs started (flow_schema t2: t2's
    time); runs without a duration (not counted)."""
    since = stats.bucket_start(WEEK, now)
    first_day = rollup.floor_to(since, rollup.DAY) + DAY
    moments = [
        since - timedelta(minutes=1),  # outside the window
        since,  # its first instant
        since + timedelta(hours=3, minutes=30),  # the leading edge
        first_day - timedelta(microseconds=1),  # the leading edge's last instant
        first_day,  # the first whole day's first instant
        first_day + timedelta(days=2, hours=5),
        first_day + timedelta(days=5, hours=23, minutes=59),
        rollup.floor_to(now, rollup.DAY),  # today's first instant: the trailing edge
        now - timedelta(minutes=2),
    ]
    runs = []
    for n, at in enumerate(moments):
        for tenant, flow, queue, duration in (
            ("t1", "", "default", 100.25 + n),
            ("t2", "", "low", 40.5 * (n + 1)),
            ("", "", "default", 7.75),
            ("t1", "", "low", 0.1 * n),
            ("", "t2", "default", 3.5 + n),
        ):
            runs.append(finished(at, tenant=tenant, flow=flow, queue=queue, duration=duration))
        runs.append(finished(at, tenant="t2", status=RunStatus.CANCELLED, duration=None))
    JobRun.objects.bulk_create(runs)


def expected_shares(since: datetime, *, limit: int = 10, **filters: Any) -> list[dict[str, Any]]:
    """Per tenant a run counts for (a system run t2's run started: t2's), its worker time, share
    and the part system runs took."""
    per: dict[str, float] = {}
    system: dict[str, float] = {}
    tenant = filters.pop("tenant", None)
    runs = JobRun.objects.filter(finished_at__gte=since, duration_ms__isnull=False, **filters)
    for run in runs:
        who = run.schema_name or run.flow_schema
        if tenant is not None and who != tenant:
            continue
        per[who] = per.get(who, 0.0) + (run.duration_ms or 0.0)
        if not run.schema_name:
            system[who] = system.get(who, 0.0) + (run.duration_ms or 0.0)
    total = sum(per.values())
    ranked = sorted(per.items(), key=lambda t: (-t[1], t[0]))[:limit]
    return [
        {
            "tenant": who,
            "ms": round(ms, 1),
            "share": round(ms / total, 4),
            "system_ms": round(system.get(who, 0.0), 1),
        }
        for who, ms in ranked
    ]


SHARE_SCOPES: list[tuple[stats.Scope, dict[str, Any]]] = [
    (stats.Scope(), {}),
    (stats.Scope(queue="low"), {"queue": "low"}),
    (stats.Scope(tenant="t2"), {"tenant": "t2"}),
    (stats.Scope(tenant=""), {"tenant": ""}),
    (stats.Scope(job="app.work"), {"job_name": "app.work"}),  # raw either way
]


def worker_rows() -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT * FROM {rollup.WORKER_TIME_TABLE} ORDER BY 1, 2, 3, 6")
        return list(cursor.fetchall())


def test_worker_time_from_the_rollup_is_the_raw_historys() -> None:
    now = a_fixed_now()
    plant_worker_time(now)
    since = stats.bucket_start(WEEK, now)
    raw = {}
    for scope, filters in SHARE_SCOPES:
        raw[scope] = shares.worker_time(WEEK, scope, now, use_rollup=False)
        assert raw[scope] == expected_shares(since, **filters), scope
    assert rollup.catch_up(now) > 0
    assert rollup.rolled_until(rollup.DAY) == rollup.floor_to(now, rollup.DAY)
    # Whole days only: today (the trailing edge) is not rolled up yet.
    days = {row[0] for row in worker_rows()}
    assert max(days) < rollup.floor_to(now, rollup.DAY) and len(days) == 4
    for scope, _ in SHARE_SCOPES:
        assert shares.worker_time(WEEK, scope, now) == raw[scope], scope
    # Read from the rollup indeed: with the whole days' raw rows gone, the rollup's answer
    # stands and the raw one changes.
    first_day = rollup.floor_to(since, rollup.DAY) + DAY
    JobRun.objects.filter(
        finished_at__gte=first_day, finished_at__lt=rollup.floor_to(now, rollup.DAY)
    ).delete()
    assert shares.worker_time(WEEK, stats.Scope(), now) == raw[stats.Scope()]
    assert shares.worker_time(WEEK, stats.Scope(), now, use_rollup=False) != raw[stats.Scope()]
    # The limit ranks as before.
    assert shares.worker_time(WEEK, stats.Scope(), now, limit=1) == raw[stats.Scope()][:1]


def test_worker_time_rollup_rounds_are_repeatable_and_keep_their_span() -> None:
    now = a_fixed_now()
    plant_worker_time(now)
    rollup.catch_up(now)
    rows = worker_rows()
    assert rows and all(isinstance(row[4], int) and row[4] > 0 for row in rows)
    with connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {rollup.MARK_TABLE} WHERE grain = %s", [rollup.DAY])
    rollup.catch_up(now)
    assert worker_rows() == rows
    # Nine days later every planted day is past the span: dropped, and today never rolled up.
    rollup.catch_up(now + timedelta(days=9))
    assert worker_rows() == []


def test_the_week_window_with_no_worker_time_rollup_reads_raw() -> None:
    """Before the first round (no mark), and when the mark lags behind the window's first
    whole day, the whole window comes from the raw history."""
    now = a_fixed_now()
    plant_worker_time(now)
    since = stats.bucket_start(WEEK, now)
    assert shares.worker_time(WEEK, stats.Scope(), now) == expected_shares(since)
    rollup.catch_up(now - timedelta(days=6, hours=20))
    assert shares.worker_time(WEEK, stats.Scope(), now) == expected_shares(since)
