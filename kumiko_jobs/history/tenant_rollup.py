"""The tenant console's rollup: the run history summed per UTC day of enqueue, tenant and job, so
a tenant's month is a read of a few thousand rows instead of every run of its month
(history/console.py reads it; docs/observability.md, "The rollup").

One row per (tenant, job, day) and one more per (tenant, day) with ``job_name`` ``''`` for all
of its jobs: the runs queued that day, how many succeeded and failed, how many were not
finished yet (``unfinished``) when the row was computed, and the same sparse log-scale
histograms of wait and duration as the charts' rollup (history/rollup.py: four buckets per
doubling). The day is the run's ``queued_at``, which never changes: a run stays in its day
whatever becomes of it, and a retry is a new run. So a row is exact as long as all of its runs
were finished when it was computed, which is what the console trusts; a (tenant, day) with an
unfinished run is read from the raw history instead, and recomputed by later rounds
(``reroll_unfinished``) until it is finished. Retention deletes finished runs whose finish is
before its cutoff, hence runs queued before it: the days before the cutoff's next midnight are
dropped here and never read from here (``trusted_from``).

Never written on a run's path: the workers' maintenance round calls ``roll_up`` (from
history/rollup.py's ``roll_up``), which computes the next day that ended ``SETTLE`` ago (a run
row committed later than that with an earlier ``queued_at`` would be missed: a transaction
open for an hour around an enqueue), one day per round, and recomputes at most
``REROLL_PER_ROUND`` unfinished (tenant, day)s, those computed longest ago first.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db import connection

from ..core import conf
from ..core.db import TENANT_DAY_TABLE
from ..models import FINISHED_STATUSES, JobRun, RunStatus
from . import rollup_sql as rollup

TABLE = TENANT_DAY_TABLE
# Its row in the mark table (keyed by grain): per day, as the worker time's (86400), kept apart.
MARK = -rollup.DAY
# The longest console (admin/dashboard/data.py), and the span kept: its first day and today.
CONSOLE_DAYS = 30
SPAN = timedelta(days=CONSOLE_DAYS + 1)
SETTLE = timedelta(hours=1)
REROLL_PER_ROUND = 200
COLUMNS = (
    "day, schema_name, job_name, runs, succeeded, failed, unfinished, wait_hist, duration_hist"
)
_DAY = f"date_bin('{rollup.DAY} seconds', queued_at, {rollup.ORIGIN})"


def rows(source: str, params: list[Any]) -> tuple[str, list[Any]]:
    """A SELECT of rollup rows (``COLUMNS``) computed from the runs of ``source`` (a ``FROM ...``
    of the run table, ``runs()``, with its conditions): per (day, tenant, job), and per (day,
    tenant) for all jobs (``''``), as ``roll_up`` stores them and the console reads the days it
    cannot read from here."""
    jobs = "CASE WHEN grouping(job_name) = 1 THEN '' ELSE job_name END"
    by = "day, schema_name, GROUPING SETS ((job_name), ())"

    def histogram(kind: str) -> str:
        return (
            f"SELECT day, schema_name, {jobs} AS job_name, '{kind}' AS kind, {kind} AS i, "
            f"count(*) AS n FROM r WHERE {kind} IS NOT NULL GROUP BY {kind}, {by}"
        )

    sql = (
        f"WITH r AS MATERIALIZED (SELECT {_DAY} AS day, schema_name, job_name, status, "
        f"CASE WHEN {rollup.FIRST_START} AND started_at IS NOT NULL "
        f"THEN {rollup.log_index(rollup.WAIT_MS)} END AS w, "
        f"CASE WHEN {rollup.RAN} AND duration_ms IS NOT NULL "
        f"THEN {rollup.log_index('duration_ms')} END AS d {source}), "
        f"c AS (SELECT day, schema_name, {jobs} AS job_name, count(*) AS runs, "
        f"count(*) FILTER (WHERE status = '{RunStatus.SUCCEEDED.value}') AS succeeded, "
        f"count(*) FILTER (WHERE status = '{RunStatus.FAILED.value}') AS failed, "
        f"count(*) FILTER (WHERE status <> ALL(%s)) AS unfinished FROM r GROUP BY {by}), "
        f"h AS (SELECT day, schema_name, job_name, kind, jsonb_object_agg(i, n) AS h FROM "
        f"({histogram('w')} UNION ALL {histogram('d')}) AS x GROUP BY 1, 2, 3, 4) "
        f"SELECT c.*, w.h AS wait_hist, d.h AS duration_hist FROM c "
        f"LEFT JOIN h AS w ON (w.day, w.schema_name, w.job_name, w.kind) "
        f"= (c.day, c.schema_name, c.job_name, 'w') "
        f"LEFT JOIN h AS d ON (d.day, d.schema_name, d.job_name, d.kind) "
        f"= (c.day, c.schema_name, c.job_name, 'd')"
    )
    return sql, [*params, [s.value for s in FINISHED_STATUSES]]


def runs() -> str:
    """The run table, qualified (the console's search path starts in the tenant's schema)."""
    return rollup.table(JobRun._meta.db_table)


def trusted_from(now: datetime) -> datetime:
    """The first day retention cannot have touched (see the module's docstring)."""
    cutoff = now - timedelta(days=conf.get().RETENTION_DAYS)
    first = rollup.floor_to(cutoff, rollup.DAY)
    return first if first == cutoff else first + timedelta(seconds=rollup.DAY)


def roll_up(now: datetime) -> int:
    """The next settled day rolled up (all tenants), the days past the span or the retention
    dropped, and some unfinished (tenant, day)s recomputed; returns the days rolled up (0, 1)."""
    day = timedelta(seconds=rollup.DAY)
    ended = rollup.floor_to(now - SETTLE, rollup.DAY)
    start = max(filter(None, (rollup.rolled_until(MARK), ended - SPAN)))
    end = min(ended, start + day)
    with connection.cursor() as cursor:
        cursor.execute(
            f"DELETE FROM {rollup.table(TABLE)} WHERE day < %s OR day >= %s AND day < %s",
            [max(ended - SPAN, trusted_from(now)), start, end],
        )
        if start < end:
            select, params = rows(
                f"FROM {runs()} WHERE queued_at >= %s AND queued_at < %s", [start, end]
            )
            cursor.execute(f"INSERT INTO {rollup.table(TABLE)} ({COLUMNS}) {select}", params)
            rollup.mark(cursor, MARK, end)
        reroll_unfinished(cursor)
    return int((end - start) / day)


def reroll_unfinished(cursor: Any, limit: int = REROLL_PER_ROUND) -> int:
    """Recompute the ``limit`` (tenant, day)s with unfinished runs computed longest ago (an
    index of their own); returns how many."""
    cursor.execute(
        f"SELECT schema_name, day FROM {rollup.table(TABLE)} WHERE unfinished > 0 "
        f"AND job_name = '' ORDER BY rolled_at LIMIT %s",
        [limit],
    )
    pairs = cursor.fetchall()
    if not pairs:
        return 0
    schemas, days = [p[0] for p in pairs], [p[1] for p in pairs]
    cursor.execute(
        f"DELETE FROM {rollup.table(TABLE)} WHERE (schema_name, day) IN "
        f"(SELECT * FROM unnest(%s::text[], %s::timestamptz[]))",
        [schemas, days],
    )
    select, params = rows(
        f"FROM unnest(%s::text[], %s::timestamptz[]) AS p(s, a) JOIN {runs()} "
        f"ON schema_name = p.s AND queued_at >= p.a AND queued_at < p.a + interval '1 day'",
        [schemas, days],
    )
    cursor.execute(f"INSERT INTO {rollup.table(TABLE)} ({COLUMNS}) {select}", params)
    return len(pairs)


def forget(schema: str) -> None:
    """A deleted tenant's rows (retention.forget_tenant, purge): a new tenant given the same
    schema name must not see them."""
    with connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {rollup.table(TABLE)} WHERE schema_name = %s", [schema])
