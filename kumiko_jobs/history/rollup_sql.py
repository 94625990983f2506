"""What the dashboard's rollups share (history/rollup.py for the charts and the worker time,
history/tenant_rollup.py for the tenants' consoles): the SQL of a run's wait, duration and
histogram bucket, where a rollup's table lives, and its mark (how far it is rolled up)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.db import connection

from ..core import project_settings
from ..core.db import ROLLUP_MARK_TABLE
from ..models import RunStatus

MARK_TABLE = ROLLUP_MARK_TABLE
# Buckets per doubling of the histograms; bucket i holds values in [2^(i/4), 2^((i+1)/4)) ms.
PER_DOUBLING = 4
ORIGIN = "TIMESTAMPTZ '1970-01-01 00:00:00+00'"
WAIT_MS = "EXTRACT(EPOCH FROM (started_at - queued_at)) * 1000"
# The runs whose wait is the queue's: started on their first attempt, never deferred.
FIRST_START = "attempts = 1 AND defer_count = 0 AND gate_defer_count = 0"
RAN = f"status IN ('{RunStatus.SUCCEEDED.value}', '{RunStatus.FAILED.value}')"
# A failure group's last failure, as the rollup keeps it: µs since the epoch.
LAST_US = "(EXTRACT(EPOCH FROM max(finished_at)) * 1000000)::bigint"
DAY = 86400
# The tenant a run counts for on the operators' dashboard, as the fair dequeue counts it: its
# own, or for a system run a tenant's run started (``flow_schema``: tenant_may_start), that
# tenant; '' for the system's own runs. Reads the run table and the worker-time rollup alike.
FLOW_TENANT = "CASE WHEN schema_name = '' THEN flow_schema ELSE schema_name END"
# A row of a system run (the system's own or a tenant's run started): what the dashboard shows
# as a tenant's "system" part.
SYSTEM_ROW = "schema_name = ''"


def table(name: str) -> str:
    """``name`` in the public schema: the console's search path starts elsewhere."""
    qn = connection.ops.quote_name
    return f"{qn(project_settings.public_schema_name())}.{qn(name)}"


def log_index(expression: str) -> str:
    """The histogram bucket of ``expression`` (ms; below 1 ms in bucket 0)."""
    return f"floor(ln(greatest(({expression})::float8, 1.0)) * {PER_DOUBLING} / ln(2.0))::int"


def floor_to(moment: datetime, grain: int) -> datetime:
    """``moment`` rounded down to a multiple of ``grain`` seconds since the epoch (UTC)."""
    epoch = moment.timestamp()
    return datetime.fromtimestamp(epoch - epoch % grain, tz=UTC)


def rolled_until(grain: int) -> datetime | None:
    """Where the rollup of ``grain`` (a mark's key) ends: every bucket before it is rolled up
    (within its span), none from it on."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT rolled_until FROM {table(MARK_TABLE)} WHERE grain = %s", [grain])
        row = cursor.fetchone()
    return None if row is None else row[0]


def mark(cursor: Any, grain: int, end: datetime) -> None:
    """Record that the rollup of ``grain`` now ends at ``end`` (in the caller's transaction)."""
    cursor.execute(
        f"INSERT INTO {table(MARK_TABLE)} (grain, rolled_until) VALUES (%s, %s) "
        f"ON CONFLICT (grain) DO UPDATE SET rolled_until = EXCLUDED.rolled_until",
        [grain, end],
    )
