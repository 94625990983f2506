"""The dashboard's aggregates of the run history: counts and percentiles over a time window.

Every query reads only its window, through an index whose leading key bounds it, so a page
costs what the window holds, not what the table holds (docs/observability.md, "The
dashboard"):

* finished runs by ``finished_at`` (``kj_run_finished``): succeeded, failed, cancelled, and
  duration percentiles;
* started runs by ``started_at`` (``kj_run_status_started``, asked for every status at once so
  that the leading ``status`` key is an index condition): starts, retries, deferrals, and the
  wait percentiles;
* a tenant's days by ``queued_at`` (``kj_run_tenant_recent``): the tenant's console.

The history keeps one row per run, at its latest state, so the series count runs, not
attempts: a run retried twice is one start, at its last attempt, counted as a retry (its
``attempts`` is above 1); "deferred" is a run whose latest attempt deferred and that still
waits. Wait is ``started_at - queued_at`` of runs started on their first attempt without a
deferral (a retry's or a deferral's start says nothing about the queue); a run enqueued with a
delay (``enqueue_in``) counts that delay as wait, because the start clears ``scheduled_for``.

``Scope`` carries the filters; a tenant's console always passes its own schema as ``tenant``,
which every query then compares with ``schema_name``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import connection

from ..core import project_settings
from ..models import JobRun, RunStatus
from . import rollup

PERCENTILES = (0.5, 0.95, 0.99)


@dataclass(frozen=True, slots=True)
class Window:
    """A span of time to chart and the width of each of its points."""

    name: str
    span: timedelta
    step: timedelta


WINDOWS = {
    "hour": Window("hour", timedelta(hours=1), timedelta(minutes=1)),
    "day": Window("day", timedelta(days=1), timedelta(minutes=15)),
    "week": Window("week", timedelta(days=7), timedelta(hours=1)),
}


@dataclass(frozen=True, slots=True)
class Scope:
    """Which runs a query counts: ``""`` matches everything for ``queue`` and ``job``; ``tenant``
    None matches every tenant, ``""`` only system runs (their ``schema_name`` is empty)."""

    queue: str = ""
    job: str = ""
    tenant: str | None = None

    def where(self) -> tuple[str, list[Any]]:
        """SQL conditions (each starting with `` AND``) and their parameters."""
        sql, params = "", []
        for column, value in (("queue", self.queue), ("job_name", self.job)):
            if value:
                sql += f" AND {column} = %s"
                params.append(value)
        if self.tenant is not None:
            sql += " AND schema_name = %s"
            params.append(self.tenant)
        return sql, params


def _table() -> str:
    # Qualified: the console runs on a tenant's domain, whose search path starts elsewhere.
    qn = connection.ops.quote_name
    return f"{qn(project_settings.public_schema_name())}.{qn(JobRun._meta.db_table)}"


def bucket_start(window: Window, now: datetime) -> datetime:
    """The first point's start: ``now`` rounded down to a step, minus the span, so the last
    point is the step ``now`` is in and every point has the same width."""
    step = window.step.total_seconds()
    epoch = now.timestamp()
    floor = epoch - epoch % step
    return datetime.fromtimestamp(floor, tz=now.tzinfo) + window.step - window.span


def _percentiles(expression: str, condition: str) -> str:
    return (
        f"percentile_cont(ARRAY{list(PERCENTILES)}) WITHIN GROUP (ORDER BY {expression}) "
        f"FILTER (WHERE {condition})"
    )


def _rows(sql: str, params: list[Any]) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return list(cursor.fetchall())


_WAIT_MS, _FIRST_START, _RAN = rollup.WAIT_MS, rollup.FIRST_START, rollup.RAN


def points(
    window: Window, scope: Scope, since: datetime, until: datetime, *, use_rollup: bool = True
) -> dict[str, Any]:
    """Every point of ``window``'s step from ``since`` to ``until`` (see ``raw_points``).

    Without a tenant filter, from the rollup (history/rollup.py) for the points it holds and
    the raw history, summed the same way, for the rest (``use_rollup=False``: all of them):
    the wait and duration percentiles are then read from log-scale histograms (within ~9%).
    A tenant's points are computed from the raw history, exact."""
    if scope.tenant is not None or int(window.step.total_seconds()) not in rollup.GRAINS:
        return raw_points(window, scope, since, until)
    return summed_points(window, scope, since, until, use_rollup=use_rollup)


def raw_points(window: Window, scope: Scope, since: datetime, until: datetime) -> dict[str, Any]:
    """Every point of ``window``'s step from ``since`` (a point's start, see ``bucket_start``)
    to ``until``, by its start (ISO): runs started, retried, deferred, succeeded, failed and
    cancelled; wait and duration p50/p95/p99 (ms, None without runs). Each point is complete
    in itself, so a point that has ended can be kept and summed with others
    (admin/dashboard/data.py). Two statements, each a range of one time index. The window's
    failures are not per point: ``failure_groups``."""
    where, params = scope.where()
    step = f"{int(window.step.total_seconds())} seconds"
    started = _rows(
        f"SELECT date_bin(%s::interval, started_at, %s) AS point, count(*), "
        f"count(*) FILTER (WHERE attempts > 1), "
        f"count(*) FILTER (WHERE status = '{RunStatus.DEFERRED.value}'), "
        f"{_percentiles(_WAIT_MS, _FIRST_START)} "
        f"FROM {_table()} WHERE status = ANY(%s) AND started_at >= %s AND started_at < %s"
        f"{where} GROUP BY point",
        [step, since, [s.value for s in RunStatus], since, until, *params],
    )
    finished = _rows(
        f"SELECT date_bin(%s::interval, finished_at, %s) AS point, "
        f"count(*) FILTER (WHERE status = '{RunStatus.SUCCEEDED.value}'), "
        f"count(*) FILTER (WHERE status = '{RunStatus.FAILED.value}'), "
        f"count(*) FILTER (WHERE status = '{RunStatus.CANCELLED.value}'), "
        f"{_percentiles('duration_ms', _RAN + ' AND duration_ms IS NOT NULL')} "
        f"FROM {_table()} WHERE finished_at >= %s AND finished_at < %s{where} GROUP BY point",
        [step, since, since, until, *params],
    )
    out = _empty_points(window, since, until)
    for point, n, retried, deferred, wait in started:
        out[point.isoformat()].update(
            started=n, retried=retried, deferred=deferred, wait_ms=_three(wait)
        )
    for point, succeeded, failed, cancelled, duration in finished:
        out[point.isoformat()].update(
            succeeded=succeeded, failed=failed, cancelled=cancelled, duration_ms=_three(duration)
        )
    return out


def summed_points(
    window: Window, scope: Scope, since: datetime, until: datetime, *, use_rollup: bool = True
) -> dict[str, Any]:
    """``points`` from rollup rows: the stored ones before the rollup's end, rows computed from
    the raw history (the same ``rollup.aggregate``) after it, summed by ``rollup.merged``; one
    statement."""
    grain = int(window.step.total_seconds())
    where, params = scope.where()
    split = _split(grain, since, until, use_rollup)
    computed, computed_params = rollup.aggregate(grain, split, until, where, params, failures=False)
    rows = _rows(
        f"WITH parts AS MATERIALIZED (SELECT {rollup.COLUMNS} FROM "
        f"{rollup.table(rollup.ROLLUP_TABLE)} WHERE grain = %s AND bucket >= %s AND bucket < %s"
        f"{where}{_which(scope)} UNION ALL ({computed})), "
        f"{rollup.merged('bucket', failures=False)}",
        [grain, since, split, *params, *computed_params],
    )
    out = _empty_points(window, since, until)
    for bucket, started, retried, deferred, ok, failed, cancelled, wait, took, _ in rows:
        point = out[bucket.isoformat()]
        point.update(
            started=int(started),
            retried=int(retried),
            deferred=int(deferred),
            succeeded=int(ok),
            failed=int(failed),
            cancelled=int(cancelled),
            wait_ms=histogram_percentiles(_json(wait)),
            duration_ms=histogram_percentiles(_json(took)),
        )
    return out


def _which(scope: Scope) -> str:
    # A job's own rollup rows, or the rows of all jobs ('') when no job is chosen.
    return "" if scope.job else " AND job_name = ''"


def _split(grain: int, since: datetime, until: datetime, use_rollup: bool) -> datetime:
    # Where the rollup's rows of ``grain`` end within [since, until): raw history after it.
    if use_rollup and (end := rollup.rolled_until(grain)) is not None:
        return min(max(end, since), until)
    return since


# The failure groups a dashboard shows (admin/dashboard/data.py).
FAILURE_GROUPS = 20


def failure_groups(
    window: Window,
    scope: Scope,
    since: datetime,
    until: datetime,
    *,
    limit: int = FAILURE_GROUPS,
    use_rollup: bool = True,
) -> list[dict[str, Any]]:
    """The failures of the runs finished in [since, until) by job and error type, the ``limit``
    most frequent (ties by job, then error type, in code-point order), each with its count and
    last failure (ISO); merged and ranked in one statement, so only these groups leave the
    database. Without a tenant filter the rollup's failures (history/rollup.py) for the buckets
    it holds and the raw history's for the rest (``use_rollup=False``: all of it), as
    ``points``; with one, the raw history."""
    grain = int(window.step.total_seconds())
    where, params = scope.where()
    split = since
    if scope.tenant is None and grain in rollup.GRAINS:
        split = _split(grain, since, until, use_rollup)
    rolled, rolled_params = "", []
    if split > since:
        rolled = (
            f"SELECT e->>0 AS j, e->>1 AS err, (e->>2)::bigint AS n, (e->>3)::bigint AS last "
            f"FROM {rollup.table(rollup.ROLLUP_TABLE)}, jsonb_array_elements(failures) AS e "
            f"WHERE grain = %s AND bucket >= %s AND bucket < %s AND failures IS NOT NULL"
            f"{where}{_which(scope)} UNION ALL "
        )
        rolled_params = [grain, since, split, *params]
    c = 'COLLATE "C"'
    rows = _rows(
        f"SELECT j, err, sum(n), max(last) FROM ({rolled}"
        f"SELECT job_name AS j, error_type AS err, count(*) AS n, {rollup.LAST_US} AS last "
        f"FROM {_table()} WHERE finished_at >= %s AND finished_at < %s AND status = %s{where} "
        f"GROUP BY 1, 2) AS parts GROUP BY j, err ORDER BY 3 DESC, j {c}, err {c} LIMIT %s",
        [*rolled_params, split, until, RunStatus.FAILED.value, *params, limit],
    )
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    return [
        {
            "job": job,
            "error_type": error,
            "count": int(n),
            "last": (epoch + timedelta(microseconds=int(last))).isoformat(),
        }
        for job, error, n, last in rows
    ]


def _json(value: Any) -> Any:
    # Django has psycopg hand jsonb over as text (its JSONField decodes it itself).
    return json.loads(value) if isinstance(value, str) else value


def histogram_percentiles(histogram: dict[str, int] | None) -> list[float] | None:
    """p50/p95/p99 (ms) of a rollup histogram: for each, the bucket holding the run at
    ``percentile_cont``'s rank, read as its geometric middle."""
    if not histogram:
        return None
    counts = sorted((int(index), int(n)) for index, n in histogram.items())
    total = sum(n for _, n in counts)
    out = []
    for q in PERCENTILES:
        rank, seen = q * (total - 1), 0
        for index, n in counts:
            seen += n
            if seen > rank:
                out.append(round(2 ** ((index + 0.5) / rollup.PER_DOUBLING), 1))
                break
    return out


def _empty_points(window: Window, since: datetime, until: datetime) -> dict[str, Any]:
    out: dict[str, Any] = {}
    at = since
    while at < until:
        out[at.isoformat()] = _empty_point()
        at += window.step
    return out


def _empty_point() -> dict[str, Any]:
    return {
        "started": 0,
        "retried": 0,
        "deferred": 0,
        "succeeded": 0,
        "failed": 0,
        "cancelled": 0,
        "wait_ms": None,
        "duration_ms": None,
    }


def _three(values: list[float] | None) -> list[float] | None:
    return None if values is None else [round(float(v), 1) for v in values]


def worker_time(
    window: Window, scope: Scope, now: datetime, limit: int = 10, *, use_rollup: bool = True
) -> list[dict[str, Any]]:
    """The tenants whose runs finished in the window took the most worker time, with their share
    of it. Not per point: a tenant per point would keep as many entries as there are runs.

    The window's whole UTC days that the rollup holds (history/rollup.py, ``DAY``: per day,
    queue and tenant) are read from it, its edges (from the window's start to the first whole
    day, from the rollup's end on) from the raw history (``kj_run_finished``'s range), and the
    parts added as numeric. Without such a day (the hour and the day windows, a week before
    the rollup reached it), with a job filter, or ``use_rollup=False``: one raw sum, as
    before. Both give the same result to the 0.1 ms shown (float sums added in another order
    may differ in their last bits)."""
    since = bucket_start(window, now)
    where, params = scope.where()
    first_day = rollup.floor_to(since, rollup.DAY)
    if first_day < since:
        first_day += timedelta(seconds=rollup.DAY)
    last_day = rollup.rolled_until(rollup.DAY) if use_rollup and not scope.job else None
    if last_day is None or last_day <= first_day:
        rows = _rows(
            f"SELECT schema_name, sum(duration_ms), sum(sum(duration_ms)) OVER () FROM "
            f"{_table()} WHERE finished_at >= %s AND duration_ms IS NOT NULL{where} "
            f"GROUP BY schema_name ORDER BY 2 DESC, 1 LIMIT %s",
            [since, *params, limit],
        )
    else:
        raw = (
            f"SELECT schema_name, sum(duration_ms)::numeric AS ms FROM {_table()} "
            f"WHERE finished_at >= %s{{}} AND duration_ms IS NOT NULL{where} GROUP BY 1"
        )
        rows = _rows(
            f"SELECT schema_name, sum(ms)::float8, (sum(sum(ms)) OVER ())::float8 FROM ("
            f"{raw.format(' AND finished_at < %s')} UNION ALL SELECT schema_name, "
            f"sum(worker_ms) FROM {rollup.table(rollup.WORKER_TIME_TABLE)} "
            f"WHERE bucket >= %s AND bucket < %s{where} GROUP BY 1 UNION ALL {raw.format('')}"
            f") AS parts GROUP BY schema_name ORDER BY sum(ms) DESC, 1 LIMIT %s",
            [
                *(since, first_day, *params),
                *(first_day, last_day, *params),
                *(last_day, *params),
                limit,
            ],
        )
    return [
        {"tenant": tenant, "ms": round(ms, 1), "share": round(ms / total, 4) if total else 0.0}
        for tenant, ms, total in rows
    ]


# Reading more waiting runs than this to rank tenants' backlogs would cost the page seconds
# when a backlog is in the millions; beyond it the ranking is of the oldest this many.
BACKLOG_READ = 50_000


def tenant_backlog(scope: Scope, limit: int = 10) -> dict[str, Any]:
    """The tenants with the most runs waiting (queued or deferred), reading at most
    ``BACKLOG_READ`` of them (``kj_run_status_recent``, one range per status)."""
    where, params = scope.where()
    rows = _rows(
        f"SELECT schema_name, count(*), min(queued_at), sum(count(*)) OVER () FROM "
        f"(SELECT schema_name, queued_at FROM {_table()} WHERE status = ANY(%s){where} "
        f"LIMIT %s) AS waiting "
        f"GROUP BY schema_name ORDER BY 2 DESC, 1 LIMIT %s",
        [[RunStatus.QUEUED.value, RunStatus.DEFERRED.value], *params, BACKLOG_READ, limit],
    )
    total = int(rows[0][3]) if rows else 0
    return {
        "read": total,
        "capped": total >= BACKLOG_READ,
        "tenants": [
            {"tenant": tenant, "waiting": n, "oldest": oldest.isoformat()}
            for tenant, n, oldest, _ in rows
        ],
    }


def running_runs() -> int:
    """Runs the history says are running now (``kj_run_status_started``)."""
    rows = _rows(f"SELECT count(*) FROM {_table()} WHERE status = %s", [RunStatus.RUNNING.value])
    return int(rows[0][0])


def tenant_days(schema: str, days: int, job: str, now: datetime) -> list[dict[str, Any]]:
    """A tenant's console: per day of the last ``days`` (by ``queued_at``, through
    ``kj_run_tenant_recent``, so only ``schema``'s rows are read), its runs by outcome and their
    wait and duration p50/p95/p99 (ms)."""
    since = (now - timedelta(days=days - 1)).replace(hour=0, minute=0, second=0, microsecond=0)
    where, params = Scope(job=job, tenant=schema).where()
    rows = _rows(
        f"SELECT date_trunc('day', queued_at AT TIME ZONE 'UTC') AS day, count(*), "
        f"count(*) FILTER (WHERE status = '{RunStatus.SUCCEEDED.value}'), "
        f"count(*) FILTER (WHERE status = '{RunStatus.FAILED.value}'), "
        f"{_percentiles(_WAIT_MS, _FIRST_START + ' AND started_at IS NOT NULL')}, "
        f"{_percentiles('duration_ms', _RAN + ' AND duration_ms IS NOT NULL')} "
        f"FROM {_table()} WHERE queued_at >= %s{where} GROUP BY day",
        [since, *params],
    )
    found = {row[0].date(): row for row in rows}
    out = []
    for offset in range(days):
        day = (since + timedelta(days=offset)).date()
        row = found.get(day)
        out.append(
            {
                "t": day.isoformat(),
                "runs": row[1] if row else 0,
                "succeeded": row[2] if row else 0,
                "failed": row[3] if row else 0,
                "wait_ms": _three(row[4] if row else None),
                "duration_ms": _three(row[5] if row else None),
            }
        )
    return out


def tenant_failure_rates(schema: str, days: int, now: datetime) -> list[dict[str, Any]]:
    """A tenant's jobs over the last ``days``: finished runs, failed ones and the rate, the
    highest rate first (``kj_run_tenant_recent`` again: ``schema``'s rows only)."""
    since = now - timedelta(days=days)
    rows = _rows(
        f"SELECT job_name, count(*) FILTER (WHERE status = ANY(%s)), "
        f"count(*) FILTER (WHERE status = %s) FROM {_table()} "
        f"WHERE schema_name = %s AND queued_at >= %s GROUP BY job_name",
        [
            [RunStatus.SUCCEEDED.value, RunStatus.FAILED.value],
            RunStatus.FAILED.value,
            schema,
            since,
        ],
    )
    rates = [
        {"job": job, "finished": done, "failed": bad, "rate": round(bad / done, 4) if done else 0.0}
        for job, done, bad in rows
    ]
    return sorted(rates, key=lambda r: (-r["rate"], r["job"]))
