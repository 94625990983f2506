"""The dashboard's charts: the run history's counts and percentiles per point of a time window.

The window's failure groups are history/failure_groups.py's, the tenants' shares of worker time
and backlog history/shares.py's, a tenant's console history/console.py's; they share this
module's ``Window``, ``Scope`` and helpers. Every query reads only its window, through an
index whose leading key bounds it, so a page costs what the window holds, not what the table
holds (docs/observability.md, "The dashboard"):

* finished runs by ``finished_at`` (``kj_run_finished``): succeeded, failed, cancelled, and
  duration percentiles;
* started runs by ``started_at`` (``kj_run_status_started``, asked for every status at once so
  that the leading ``status`` key is an index condition): starts, retries, deferrals, and the
  wait percentiles;
* or the rollup's rows of the window's step (history/rollup.py) for the points it holds.

The history keeps one row per run, at its latest state, so the series count runs, not
attempts: a run retried twice is one start, at its last attempt, counted as a retry (its
``attempts`` is above 1); "deferred" is a run whose latest attempt deferred and that still
waits. Wait is ``started_at - queued_at`` of runs started on their first attempt without a
deferral (a retry's or a deferral's start says nothing about the queue); a run enqueued with a
delay (``enqueue_in``) counts that delay as wait, because the start clears ``scheduled_for``.

``Scope`` carries the filters; with a ``tenant``, every query compares it with the tenant a run
counts for (its ``schema_name``, or a tenant-started system run's ``flow_schema``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
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
    None matches every tenant, a schema its runs and the system runs its runs started (the
    tenant they count for, ``rollup.FLOW_TENANT``), ``""`` only the system's own runs (empty
    ``schema_name`` and ``flow_schema``)."""

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
        if self.tenant:
            # A tenant's runs and the system runs its runs started (rollup.FLOW_TENANT), each
            # arm an index's: kj_run_tenant_* and the partial kj_run_flow_recent, whose
            # predicate the second arm states so that the planner can use it.
            sql += " AND (schema_name = %s OR schema_name = '' AND flow_schema = %s"
            sql += " AND flow_schema <> '')"
            params += [self.tenant, self.tenant]
        elif self.tenant is not None:
            sql += " AND schema_name = '' AND flow_schema = ''"
        return sql, params


def run_table() -> str:
    """The run table, qualified: the console runs on a tenant's domain, whose search path
    starts elsewhere."""
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


def fetch(sql: str, params: list[Any]) -> list[tuple[Any, ...]]:
    """The rows of one statement."""
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
    started = fetch(
        f"SELECT date_bin(%s::interval, started_at, %s) AS point, count(*), "
        f"count(*) FILTER (WHERE attempts > 1), "
        f"count(*) FILTER (WHERE status = '{RunStatus.DEFERRED.value}'), "
        f"{_percentiles(_WAIT_MS, _FIRST_START)} "
        f"FROM {run_table()} WHERE status = ANY(%s) AND started_at >= %s AND started_at < %s"
        f"{where} GROUP BY point",
        [step, since, [s.value for s in RunStatus], since, until, *params],
    )
    finished = fetch(
        f"SELECT date_bin(%s::interval, finished_at, %s) AS point, "
        f"count(*) FILTER (WHERE status = '{RunStatus.SUCCEEDED.value}'), "
        f"count(*) FILTER (WHERE status = '{RunStatus.FAILED.value}'), "
        f"count(*) FILTER (WHERE status = '{RunStatus.CANCELLED.value}'), "
        f"{_percentiles('duration_ms', _RAN + ' AND duration_ms IS NOT NULL')} "
        f"FROM {run_table()} WHERE finished_at >= %s AND finished_at < %s{where} GROUP BY point",
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
    split = rolled_split(grain, since, until, use_rollup)
    computed, computed_params = rollup.aggregate(grain, split, until, where, params, failures=False)
    rows = fetch(
        f"WITH parts AS MATERIALIZED (SELECT {rollup.COLUMNS} FROM "
        f"{rollup.table(rollup.ROLLUP_TABLE)} WHERE grain = %s AND bucket >= %s AND bucket < %s"
        f"{where}{job_rows(scope)} UNION ALL ({computed})), "
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
            wait_ms=histogram_percentiles(decoded(wait)),
            duration_ms=histogram_percentiles(decoded(took)),
        )
    return out


def job_rows(scope: Scope) -> str:
    """A condition on the rollup's rows: a job's own, or those of all jobs ('') when no job is
    chosen."""
    return "" if scope.job else " AND job_name = ''"


def rolled_split(grain: int, since: datetime, until: datetime, use_rollup: bool) -> datetime:
    """Where the rollup's rows of ``grain`` end within [since, until): raw history after it."""
    if use_rollup and (end := rollup.rolled_until(grain)) is not None:
        return min(max(end, since), until)
    return since


def decoded(value: Any) -> Any:
    """A jsonb value as Python: Django has psycopg hand jsonb over as text (its JSONField
    decodes it itself)."""
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
