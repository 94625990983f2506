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
    of it and the part of it system runs took (``system_ms``). Not per point: a tenant per point
    would keep as many entries as there are runs. A system run a tenant's run started is that
    tenant's here, as the fair dequeue counts it (``rollup.FLOW_TENANT``); ``''`` is the system's
    own runs.

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
    who, system = rollup.FLOW_TENANT, rollup.SYSTEM_ROW
    if last_day is None or last_day <= first_day:
        rows = stats.fetch(
            f"SELECT {who}, sum(duration_ms), coalesce(sum(duration_ms) FILTER (WHERE {system}), "
            f"0), sum(sum(duration_ms)) OVER () FROM {stats.run_table()} WHERE finished_at >= %s "
            f"AND duration_ms IS NOT NULL{where} GROUP BY 1 ORDER BY 2 DESC, 1 LIMIT %s",
            [since, *params, limit],
        )
    else:
        rows = _with_rollup(since, first_day, last_day, (where, params), limit)
    return [
        {
            "tenant": tenant,
            "ms": round(ms, 1),
            "share": round(ms / total, 4) if total else 0.0,
            "system_ms": round(sys, 1),
        }
        for tenant, ms, sys, total in rows
    ]


def _with_rollup(
    since: datetime,
    first_day: datetime,
    last_day: datetime,
    condition: tuple[str, list[Any]],
    limit: int,
) -> list[tuple[Any, ...]]:
    """``worker_time``'s rows from the rollup's days in [first_day, last_day) and the raw
    history's edges around them, added as numeric."""
    (where, params), who, system = condition, rollup.FLOW_TENANT, rollup.SYSTEM_ROW
    raw = (
        f"SELECT {who} AS tenant, sum(duration_ms)::numeric AS ms, (sum(duration_ms) "
        f"FILTER (WHERE {system}))::numeric AS sys FROM {stats.run_table()} "
        f"WHERE finished_at >= %s{{}} AND duration_ms IS NOT NULL{where} GROUP BY 1"
    )
    return stats.fetch(
        f"SELECT tenant, sum(ms)::float8, coalesce(sum(sys), 0)::float8, "
        f"(sum(sum(ms)) OVER ())::float8 FROM ("
        f"{raw.format(' AND finished_at < %s')} UNION ALL SELECT {who}, sum(worker_ms), "
        f"sum(worker_ms) FILTER (WHERE {system}) "
        f"FROM {rollup.table(rollup.WORKER_TIME_TABLE)} "
        f"WHERE bucket >= %s AND bucket < %s{where} GROUP BY 1 UNION ALL {raw.format('')}"
        f") AS parts GROUP BY tenant ORDER BY sum(ms) DESC, 1 LIMIT %s",
        [
            *(since, first_day, *params),
            *(first_day, last_day, *params),
            *(last_day, *params),
            limit,
        ],
    )


# Reading more waiting runs than this to rank tenants' backlogs would cost the page seconds
# when a backlog is in the millions; beyond it the ranking is of the oldest this many.
BACKLOG_READ = 50_000


def tenant_backlog(scope: stats.Scope, limit: int = 10) -> dict[str, Any]:
    """The tenants with the most runs waiting (queued or deferred), reading at most
    ``BACKLOG_READ`` of them (``kj_run_status_recent``, one range per status). A system run a
    tenant's run started waits in that tenant's bucket, so it is that tenant's backlog here
    (``rollup.FLOW_TENANT``), and counted in its ``system`` too."""
    where, params = scope.where()
    rows = stats.fetch(
        f"SELECT tenant, count(*), min(queued_at), count(*) FILTER (WHERE sys), "
        f"sum(count(*)) OVER () FROM (SELECT {rollup.FLOW_TENANT} AS tenant, "
        f"{rollup.SYSTEM_ROW} AS sys, queued_at FROM {stats.run_table()} "
        f"WHERE status = ANY(%s){where} LIMIT %s) AS waiting "
        f"GROUP BY tenant ORDER BY 2 DESC, 1 LIMIT %s",
        [[RunStatus.QUEUED.value, RunStatus.DEFERRED.value], *params, BACKLOG_READ, limit],
    )
    total = int(rows[0][4]) if rows else 0
    return {
        "read": total,
        "capped": total >= BACKLOG_READ,
        "tenants": [
            {"tenant": tenant, "waiting": n, "oldest": oldest.isoformat(), "system": sys}
            for tenant, n, oldest, sys, _ in rows
        ],
    }


def running_runs() -> int:
    """Runs the history says are running now (``kj_run_status_started``)."""
    rows = stats.fetch(
        f"SELECT count(*) FROM {stats.run_table()} WHERE status = %s", [RunStatus.RUNNING.value]
    )
    return int(rows[0][0])
