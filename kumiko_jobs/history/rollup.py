"""The dashboard's rollup: the run history summed per chart point, so a cold week is a read of
a few thousand rows instead of every run of the week (docs/observability.md, "The rollup").

One row per (grain, bucket, queue, job): the runs started, retried, deferred, succeeded,
failed and cancelled in that bucket, counted as history/stats.py counts them, plus sparse
log-scale histograms (``{bucket index: runs}``, four buckets per doubling, so a percentile read
from them is within about 9% of the exact one) of wait and duration, and the failures by error
type (``[job, error type, runs, last finished in µs since the epoch]``), and per bucket and
queue one row more with ``job_name`` ``''`` for all of its jobs, which is what a chart without
a job filter reads. The grains are the dashboard's steps (a minute for the hour, 15 minutes
for the day, an hour for the week), each kept only over its window's span. No tenant key: at
the history's density a per-tenant row per minute would be one row per run; a tenant-filtered
chart reads the raw history (the tenant's index bounds it). The failures are merged and ranked
over a whole window by the database (history/failure_groups.py), not per point.

A tenant's console has its own, per UTC day of enqueue, tenant and job
(history/tenant_rollup.py, migration 0026), rolled up in the same rounds. The tenants' share
of worker time has its own table (``WORKER_TIME_TABLE``, migration 0025): per UTC day, queue
and tenant (and ``flow_schema``, migration 0031), the summed duration and the runs; a window
reads the whole days from it and its edges raw (history/shares.py ``worker_time``): at most a
row per tenant and queue a day, where a row per tenant and minute would be about a row per run.

Never written on a run's path: the workers' maintenance round (worker/maintenance.py, under
its lock) calls ``roll_up``, which recomputes whole buckets that have ended since the last one
it rolled up (delete and insert in one transaction: idempotent, and a key that vanished from
a bucket vanishes from the rollup), reading at most ``ROUND_SPAN`` of history per grain per
round (one day for the worker time's days). A bucket is rolled up once: a run that changes
after that (a retry moves its start to its last attempt; a deferred run starts later; a retry
of a finished run moves its finish) is counted where it was at the time, in the rollup, and
where it is now, in the raw history, until the bucket leaves the window.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from ..core import conf

# Named in core/db.py, where the guard reads them too; kept as this module's names.
from ..core.db import ROLLUP_MARK_TABLE as MARK_TABLE
from ..core.db import ROLLUP_TABLE as ROLLUP_TABLE
from ..core.db import WORKER_TIME_TABLE as WORKER_TIME_TABLE
from ..models import JobRun, RunStatus
from . import tenant_rollup
from .rollup_sql import (
    DAY,
    FIRST_START,
    FLOW_TENANT,
    LAST_US,
    ORIGIN,
    PER_DOUBLING,
    RAN,
    SYSTEM_ROW,
    WAIT_MS,
    floor_to,
    log_index,
    mark,
    rolled_until,
    table,
)

__all__ = [
    "DAY",
    "FIRST_START",
    "FLOW_TENANT",
    "LAST_US",
    "MARK_TABLE",
    "PER_DOUBLING",
    "RAN",
    "SYSTEM_ROW",
    "WAIT_MS",
    "floor_to",
    "rolled_until",
    "table",
]

# grain (seconds) -> how far back it is kept: history/stats.py WINDOWS' steps and spans.
GRAINS = {60: timedelta(hours=1), 900: timedelta(days=1), 3600: timedelta(days=7)}
# History read per grain per round: a week's backfill at the hour grain takes 14 rounds.
ROUND_SPAN = timedelta(hours=12)
COLUMNS = (
    "bucket, queue, job_name, started, retried, deferred, succeeded, failed, cancelled, "
    "wait_hist, duration_hist, failures"
)
# Worker time (history/shares.py ``worker_time``): per UTC day, queue and tenant, the summed
# ``duration_ms`` of the runs that finished then (stored as numeric, so the days add up
# without rounding). Its end is the mark table's row of grain ``DAY``; kept ``DAY_SPAN``, a
# day more than the week window, whose first whole day starts less than 7 days back.
DAY_SPAN = timedelta(days=8)


def aggregate(
    grain: int,
    since: datetime,
    until: datetime,
    where: str,
    params: list[Any],
    *,
    failures: bool = True,
) -> tuple[str, list[Any]]:
    """A SELECT of rollup rows (``COLUMNS``) computed from the raw history for the buckets of
    ``grain`` seconds in [since, until), narrowed by ``where`` (history/stats.py ``Scope``):
    what ``roll_up`` stores, and what the dashboard reads for the buckets not rolled up yet
    (``failures`` False: their ``failures`` NULL, not computed)."""
    runs = table(JobRun._meta.db_table)
    step = f"{grain} seconds"
    sql = (
        f"WITH s AS MATERIALIZED (SELECT date_bin(%s::interval, started_at, {ORIGIN}) AS b, "
        f"queue, job_name, status, attempts, "
        f"CASE WHEN {FIRST_START} THEN {log_index(WAIT_MS)} END AS w FROM {runs} "
        f"WHERE status = ANY(%s) AND started_at >= %s AND started_at < %s{where}), "
        f"f AS MATERIALIZED (SELECT date_bin(%s::interval, finished_at, {ORIGIN}) AS b, "
        f"queue, job_name, status, error_type, finished_at, "
        f"CASE WHEN {RAN} AND duration_ms IS NOT NULL THEN {log_index('duration_ms')} END AS d "
        f"FROM {runs} WHERE finished_at >= %s AND finished_at < %s{where}), "
        f"parts AS ({_parts(failures)}) "
        f"SELECT b, queue, job_name, sum(started)::int, sum(retried)::int, sum(deferred)::int, "
        f"sum(succeeded)::int, sum(failed)::int, sum(cancelled)::int, "
        f"(array_agg(wh) FILTER (WHERE wh IS NOT NULL))[1], "
        f"(array_agg(dh) FILTER (WHERE dh IS NOT NULL))[1], "
        f"(array_agg(fl) FILTER (WHERE fl IS NOT NULL))[1] FROM parts GROUP BY 1, 2, 3"
    )
    statuses = [s.value for s in RunStatus]
    return sql, [step, statuses, since, until, *params, step, since, until, *params]


def _parts(failures: bool) -> str:
    """``aggregate``'s parts per (bucket, queue, job), each filling its own columns: the starts
    (CTE ``s``), the finishes (``f``), the two histograms, the failures (when ``failures``)."""
    zeros = "0, 0, 0"
    fails = (
        f" UNION ALL SELECT b, queue, job_name, {zeros}, {zeros}, NULL, NULL, "
        f"jsonb_agg(jsonb_build_array(job_name, error_type, n, last)) "
        f"FROM (SELECT b, queue, job_name, error_type, count(*) AS n, {LAST_US} AS last FROM f "
        f"WHERE status = '{RunStatus.FAILED.value}' GROUP BY 1, 2, 3, 4) AS x GROUP BY 1, 2, 3"
        if failures
        else ""
    )
    return (
        f"SELECT b, queue, job_name, count(*) AS started, "
        f"count(*) FILTER (WHERE attempts > 1) AS retried, "
        f"count(*) FILTER (WHERE status = '{RunStatus.DEFERRED.value}') AS deferred, "
        f"0 AS succeeded, 0 AS failed, 0 AS cancelled, "
        f"NULL::jsonb AS wh, NULL::jsonb AS dh, NULL::jsonb AS fl FROM s GROUP BY 1, 2, 3"
        f" UNION ALL SELECT b, queue, job_name, {zeros}, "
        f"count(*) FILTER (WHERE status = '{RunStatus.SUCCEEDED.value}'), "
        f"count(*) FILTER (WHERE status = '{RunStatus.FAILED.value}'), "
        f"count(*) FILTER (WHERE status = '{RunStatus.CANCELLED.value}'), NULL, NULL, NULL "
        f"FROM f GROUP BY 1, 2, 3"
        f" UNION ALL SELECT b, queue, job_name, {zeros}, {zeros}, jsonb_object_agg(w, n), "
        f"NULL, NULL FROM (SELECT b, queue, job_name, w, count(*) AS n FROM s "
        f"WHERE w IS NOT NULL GROUP BY 1, 2, 3, 4) AS x GROUP BY 1, 2, 3"
        f" UNION ALL SELECT b, queue, job_name, {zeros}, {zeros}, NULL, jsonb_object_agg(d, n), "
        f"NULL FROM (SELECT b, queue, job_name, d, count(*) AS n FROM f "
        f"WHERE d IS NOT NULL GROUP BY 1, 2, 3, 4) AS x GROUP BY 1, 2, 3"
        f"{fails}"
    )


def merged(keys: str, *, failures: bool = True) -> str:
    """The rollup rows of a CTE ``parts`` (``COLUMNS``) summed by ``keys``: counts added,
    histograms added bucket by bucket, failures added by job and error type (``failures``
    False: not read, ``fl`` NULL). Selects ``keys``, the six counts, ``wh``, ``dh``, ``fl``."""
    counts = ", ".join(
        f"sum({c}) AS {c}"
        for c in ("started", "retried", "deferred", "succeeded", "failed", "cancelled")
    )

    def histogram(column: str) -> str:
        return (
            f"SELECT {keys}, jsonb_object_agg(k, n) AS h FROM (SELECT {keys}, e.key AS k, "
            f"sum(e.value::bigint) AS n FROM parts, jsonb_each_text({column}) AS e "
            f"GROUP BY {keys}, e.key) AS x GROUP BY {keys}"
        )

    head = (
        f"c AS (SELECT {keys}, {counts} FROM parts GROUP BY {keys}), "
        f"w AS ({histogram('wait_hist')}), d AS ({histogram('duration_hist')})"
    )
    joins = f"FROM c LEFT JOIN w USING ({keys}) LEFT JOIN d USING ({keys})"
    if not failures:
        return f"{head} SELECT c.*, w.h AS wh, d.h AS dh, NULL::jsonb AS fl {joins}"
    return (
        f"{head}, fl AS (SELECT {keys}, jsonb_agg(jsonb_build_array(j, err, n, last)) AS f "
        f"FROM (SELECT {keys}, e->>0 AS j, e->>1 AS err, sum((e->>2)::bigint) AS n, "
        f"max((e->>3)::bigint) AS last FROM parts, jsonb_array_elements(failures) AS e "
        f"GROUP BY {keys}, j, err) AS x GROUP BY {keys}) "
        f"SELECT c.*, w.h AS wh, d.h AS dh, fl.f AS fl {joins} LEFT JOIN fl USING ({keys})"
    )


def roll_up(now: datetime | None = None) -> int:
    """Roll up the buckets that ended since the last round, at most ``ROUND_SPAN`` of history
    per grain (a day for the worker time's and the tenants' days), and drop the buckets past
    their span or the runs' retention. Returns the buckets rolled up (0 once caught up)."""
    now = now or timezone.now()
    retention = now - timedelta(days=conf.get().RETENTION_DAYS)
    done = 0
    for grain, span in (*GRAINS.items(), (DAY, DAY_SPAN)):
        step = timedelta(seconds=grain)
        ended = floor_to(now, grain)
        start = max(filter(None, (rolled_until(grain), ended - span)))
        end = min(ended, start + max(ROUND_SPAN, step))
        with transaction.atomic(), connection.cursor() as cursor:
            keep_from = max(ended - span, retention)
            if grain == DAY:
                _store_worker_time(cursor, start, end, keep_from)
            else:
                _store_points(cursor, grain, start, end, keep_from)
            if start >= end:
                continue
            mark(cursor, grain, end)
        done += int((end - start) / step)
    # The tenants' consoles: per day of enqueue, tenant and job (history/tenant_rollup.py).
    with transaction.atomic():
        done += tenant_rollup.roll_up(now)
    return done


def _store_points(
    cursor: Any, grain: int, start: datetime, end: datetime, keep_from: datetime
) -> None:
    """The chart rows of ``grain`` for [start, end) recomputed, those before ``keep_from``
    dropped."""
    cursor.execute(
        f"DELETE FROM {table(ROLLUP_TABLE)} WHERE grain = %s AND (bucket < %s "
        f"OR bucket >= %s AND bucket < %s)",
        [grain, keep_from, start, end],
    )
    if start >= end:
        return
    select, params = aggregate(grain, start, end, "", [])
    cursor.execute(
        f"INSERT INTO {table(ROLLUP_TABLE)} (grain, {COLUMNS}) "
        f"SELECT %s, * FROM ({select}) AS computed",
        [grain, *params],
    )
    # Every job of a queue in one row (job_name ''): what an unfiltered chart reads.
    cursor.execute(
        f"INSERT INTO {table(ROLLUP_TABLE)} (grain, {COLUMNS}) SELECT %s, bucket, queue, "
        f"'', started, retried, deferred, succeeded, failed, cancelled, wh, dh, fl FROM "
        f"(WITH parts AS (SELECT {COLUMNS} FROM {table(ROLLUP_TABLE)} WHERE grain = %s "
        f"AND bucket >= %s AND bucket < %s), {merged('bucket, queue')}) AS summed",
        [grain, grain, start, end],
    )


def _store_worker_time(cursor: Any, start: datetime, end: datetime, keep_from: datetime) -> None:
    """The worker time's days in [start, end) recomputed, those before ``keep_from`` dropped."""
    cursor.execute(
        f"DELETE FROM {table(WORKER_TIME_TABLE)} WHERE bucket < %s OR bucket >= %s AND bucket < %s",
        [keep_from, start, end],
    )
    if start >= end:
        return
    select, params = worker_time_rows(start, end)
    cursor.execute(
        f"INSERT INTO {table(WORKER_TIME_TABLE)} "
        f"(bucket, queue, schema_name, flow_schema, worker_ms, runs) "
        f"{select}",
        params,
    )


def worker_time_rows(since: datetime, until: datetime) -> tuple[str, list[Any]]:
    """A SELECT of worker-time rows (day, queue, schema_name, flow_schema, worker_ms, runs)
    computed from the raw history for the runs finished in [since, until) (``kj_run_finished``'s
    range): what ``roll_up`` stores. ``flow_schema`` (migration 0031) keeps the system runs a
    tenant's run started apart, so a read counts them for that tenant (``FLOW_TENANT``)."""
    sql = (
        f"SELECT date_bin(%s::interval, finished_at, {ORIGIN}), queue, schema_name, "
        f"flow_schema, sum(duration_ms)::numeric, count(*) FROM {table(JobRun._meta.db_table)} "
        f"WHERE finished_at >= %s AND finished_at < %s AND duration_ms IS NOT NULL "
        f"GROUP BY 1, 2, 3, 4"
    )
    return sql, [f"{DAY} seconds", since, until]


def catch_up(now: datetime | None = None) -> int:
    """Roll up until nothing is left (tests, benches, a first deployment by hand)."""
    total = 0
    while rolled := roll_up(now):
        total += rolled
    return total
