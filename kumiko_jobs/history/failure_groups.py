"""The failures of a dashboard's window grouped by job and error type, the most frequent first.

Merged and ranked by PostgreSQL over the whole window (the rollup's groups for the buckets it
holds, history/rollup.py, and the raw history's after them), so only the page's groups leave
the database: a week holds thousands of (job, error, hour) groups, the page shows 20.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from ..models import RunStatus
from . import rollup, stats

# The failure groups a dashboard shows (admin/dashboard/data.py).
FAILURE_GROUPS = 20


def failure_groups(
    window: stats.Window,
    scope: stats.Scope,
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
    ``points``; with one, the raw history, and each group says whether its runs are system
    runs (``system``: for a tenant, those its runs started; False without a tenant filter)."""
    grain = int(window.step.total_seconds())
    where, params = scope.where()
    split = since
    if scope.tenant is None and grain in rollup.GRAINS:
        split = stats.rolled_split(grain, since, until, use_rollup)
    rolled, rolled_params = "", []
    # With a tenant filter the raw history alone, whose rows say which are system runs (a
    # tenant's own, or those its runs started): a group of each kind, marked.
    system = rollup.SYSTEM_ROW if scope.tenant is not None else "false"
    if split > since:
        rolled = (
            f"SELECT e->>0 AS j, e->>1 AS err, false AS sys, (e->>2)::bigint AS n, "
            f"(e->>3)::bigint AS last "
            f"FROM {rollup.table(rollup.ROLLUP_TABLE)}, jsonb_array_elements(failures) AS e "
            f"WHERE grain = %s AND bucket >= %s AND bucket < %s AND failures IS NOT NULL"
            f"{where}{stats.job_rows(scope)} UNION ALL "
        )
        rolled_params = [grain, since, split, *params]
    c = 'COLLATE "C"'
    rows = stats.fetch(
        f"SELECT j, err, sys, sum(n), max(last) FROM ({rolled}"
        f"SELECT job_name AS j, error_type AS err, {system} AS sys, count(*) AS n, "
        f"{rollup.LAST_US} AS last FROM {stats.run_table()} WHERE finished_at >= %s "
        f"AND finished_at < %s AND status = %s{where} "
        f"GROUP BY 1, 2, 3) AS parts GROUP BY j, err, sys "
        f"ORDER BY 4 DESC, j {c}, err {c}, sys LIMIT %s",
        [*rolled_params, split, until, RunStatus.FAILED.value, *params, limit],
    )
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    return [
        {
            "job": job,
            "error_type": error,
            "count": int(n),
            "last": (epoch + timedelta(microseconds=int(last))).isoformat(),
            "system": system_runs,
        }
        for job, error, system_runs, n, last in rows
    ]
