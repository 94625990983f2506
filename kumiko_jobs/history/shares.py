"""Who holds the system in a dashboard's window: the tenants' shares of worker time, the
tenants with the largest backlog, and the runs running now. Not per point: a tenant per point
would keep as many entries as there are runs.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from ..models import RunStatus
from . import rollup, stats


def worker_time(
    window: stats.Window,
    scope: stats.Scope,
    now: datetime,
    limit: int = 10,
    *,
    use_rollup: bool = True,
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
    since = stats.bucket_start(window, now)
    where, params = scope.where()
    first_day = rollup.floor_to(since, rollup.DAY)
    if first_day < since:
        first_day += timedelta(seconds=rollup.DAY)
    last_day = rollup.rolled_until(rollup.DAY) if use_rollup and not scope.job else None
    if last_day is None or last_day <= first_day:
        rows = stats.fetch(
            f"SELECT schema_name, sum(duration_ms), sum(sum(duration_ms)) OVER () FROM "
            f"{stats.run_table()} WHERE finished_at >= %s AND duration_ms IS NOT NULL{where} "
            f"GROUP BY schema_name ORDER BY 2 DESC, 1 LIMIT %s",
            [since, *params, limit],
        )
    else:
        raw = (
            f"SELECT schema_name, sum(duration_ms)::numeric AS ms FROM {stats.run_table()} "
            f"WHERE finished_at >= %s{{}} AND duration_ms IS NOT NULL{where} GROUP BY 1"
        )
        rows = stats.fetch(
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


def tenant_backlog(scope: stats.Scope, limit: int = 10) -> dict[str, Any]:
    """The tenants with the most runs waiting (queued or deferred), reading at most
    ``BACKLOG_READ`` of them (``kj_run_status_recent``, one range per status)."""
    where, params = scope.where()
    rows = stats.fetch(
        f"SELECT schema_name, count(*), min(queued_at), sum(count(*)) OVER () FROM "
        f"(SELECT schema_name, queued_at FROM {stats.run_table()} WHERE status = ANY(%s){where} "
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
    rows = stats.fetch(
        f"SELECT count(*) FROM {stats.run_table()} WHERE status = %s", [RunStatus.RUNNING.value]
    )
    return int(rows[0][0])
