"""A tenant's console (admin/dashboard/data.py): its runs per day, their wait and duration
percentiles, and the failure rate of each of its jobs, over its last days, for one schema only.

The days come from the tenant days' rollup (history/tenant_rollup.py) where it can be trusted:
rolled up, after retention's reach, and with every run of the (tenant, day) finished when it
was computed. The other days (today, the hour before its rollup, a day with a run still
waiting or running) are computed from the raw history by the same SQL (``tenant_rollup.rows``,
the tenant's index ``kj_run_tenant_recent``, one range per span of such days), so a day reads
the same before and after its rollup, and every count is the history's. The percentiles are
read from the days' log-scale histograms (``stats.histogram_percentiles``, within about 9%),
as the operators' charts read them. Two statements: which days to trust, then the days and
the jobs.

A day is a UTC day of ``queued_at`` (the day a run was asked for); the jobs' failure rates are
over the same days (from the first day's midnight), so they add up with the chart.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from . import rollup_sql, stats, tenant_rollup

_DAY = timedelta(days=1)


def console(
    schema: str, days: int, job: str, now: datetime, *, use_rollup: bool = True
) -> dict[str, Any]:
    """``schema``'s last ``days`` days (today the last), for ``job`` or all of its jobs
    (``''``): ``days``, a point per day; ``jobs``, each job's finished and failed runs over
    them, the highest rate first. ``use_rollup=False``: every day from the raw history."""
    since = rollup_sql.floor_to(now, rollup_sql.DAY) - (days - 1) * _DAY
    until = since + days * _DAY
    trusted = _trusted_days(schema, since, until, now) if use_rollup else set()
    raw = _spans([since + n * _DAY for n in range(days)], trusted)
    computed, params = tenant_rollup.rows(
        f"FROM unnest(%s::timestamptz[], %s::timestamptz[]) AS p(a, b) "
        f"JOIN {tenant_rollup.runs()} ON schema_name = %s AND queued_at >= p.a "
        f"AND queued_at < p.b",
        [[a for a, _ in raw], [b for _, b in raw], schema],
    )
    rows = stats.fetch(
        f"WITH raw AS MATERIALIZED ({computed}), parts AS ("
        f"SELECT day, job_name, runs, succeeded, failed, wait_hist, duration_hist "
        f"FROM {rollup_sql.table(tenant_rollup.TABLE)} "
        f"WHERE schema_name = %s AND day = ANY(%s::timestamptz[]) UNION ALL "
        f"SELECT day, job_name, runs, succeeded, failed, wait_hist, duration_hist FROM raw) "
        f"SELECT day, '', runs, succeeded, failed, wait_hist, duration_hist FROM parts "
        f"WHERE job_name = %s UNION ALL SELECT NULL, job_name, 0, sum(succeeded)::int, "
        f"sum(failed)::int, NULL, NULL FROM parts WHERE job_name <> '' GROUP BY job_name",
        [*params, schema, sorted(trusted), job],
    )
    return {
        "days": _days(since, days, [r for r in rows if r[0] is not None]),
        "jobs": _rates([r for r in rows if r[0] is None]),
    }


def _trusted_days(schema: str, since: datetime, until: datetime, now: datetime) -> set[datetime]:
    """The days in [since, until) the rollup holds for good: rolled up, after retention's
    reach, all their runs finished (a day without a row there had no run)."""
    (end, unfinished), *_ = stats.fetch(
        f"SELECT (SELECT rolled_until FROM {rollup_sql.table(rollup_sql.MARK_TABLE)} "
        f"WHERE grain = %s), ARRAY(SELECT day FROM {rollup_sql.table(tenant_rollup.TABLE)} "
        f"WHERE schema_name = %s AND job_name = '' AND day >= %s AND day < %s "
        f"AND unfinished > 0)",
        [tenant_rollup.MARK, schema, since, until],
    )
    if end is None:
        return set()
    first = max(since, tenant_rollup.trusted_from(now))
    count = max(0, int((min(end, until) - first) / _DAY))
    return {first + n * _DAY for n in range(count)} - set(unfinished)


def _spans(days: list[datetime], trusted: set[datetime]) -> list[tuple[datetime, datetime]]:
    """The untrusted days of ``days`` (consecutive, ascending) as [start, end) spans."""
    spans: list[tuple[datetime, datetime]] = []
    for day in days:
        if day in trusted:
            continue
        if spans and spans[-1][1] == day:
            spans[-1] = (spans[-1][0], day + _DAY)
        else:
            spans.append((day, day + _DAY))
    return spans


def _days(since: datetime, days: int, rows: list[tuple[Any, ...]]) -> list[dict[str, Any]]:
    found = {row[0]: row for row in rows}
    out = []
    for n in range(days):
        day = since + n * _DAY
        _, _, runs, succeeded, failed, waits, durations = found.get(day) or (
            None,
            None,
            0,
            0,
            0,
            None,
            None,
        )
        out.append(
            {
                "t": day.date().isoformat(),
                "runs": runs,
                "succeeded": succeeded,
                "failed": failed,
                "wait_ms": stats.histogram_percentiles(stats.decoded(waits)),
                "duration_ms": stats.histogram_percentiles(stats.decoded(durations)),
            }
        )
    return out


def _rates(rows: list[tuple[Any, ...]]) -> list[dict[str, Any]]:
    rates = []
    for _, job, _, succeeded, failed, _, _ in rows:
        done = succeeded + failed
        rates.append(
            {
                "job": job,
                "finished": done,
                "failed": failed,
                "rate": round(failed / done, 4) if done else 0.0,
            }
        )
    return sorted(rates, key=lambda r: (-r["rate"], r["job"]))
