"""Cron expressions: checked when ``@job(cron=...)`` is declared, read when a tick is due.

Pure functions of a crontab string and a time zone (no registry, no Redis, no database), so the
option parser (``registry``) and the cron domain (``schedules``) can both use them.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from crontab import CronTab

from ..core.exceptions import InvalidJob

# The tick being rung is the latest one at or before the clock: kumiko's scheduler scores an
# alarm with its tick's exact second and rings it only once the clock has passed that, so a
# tick never starts early. CronTab.previous looks strictly before its argument: a microsecond
# past the clock makes a ring at the very tick take that tick.
_AT_OR_BEFORE = timedelta(microseconds=1)

# The shortest interval between two ticks of a cron job: a tick is identified by its
# second (a finer crontab could not be honoured, only skipped).
MIN_CRON_INTERVAL = 1.0
# A per-tenant cron tick fans out to every tenant; below this interval it would flood the
# queues with one run per tenant per tick.
MIN_PER_TENANT_CRON_INTERVAL = 60.0


def has_seconds(cron: str) -> bool:
    """A 7-field crontab: ``second minute hour day month weekday year``."""
    return len(cron.split()) == 7


def check_cron(where: str, cron: Any, *, per_tenant: bool = False) -> str:
    """``cron=`` checked at declaration (fields, syntax, the shortest interval allowed);
    returned unchanged, or ``InvalidJob`` naming the fix."""
    if not isinstance(cron, str):
        raise InvalidJob(f"@job on {where}: cron must be a string like '0 3 * * *'.")
    fields = len(cron.split())
    if fields == 6:
        # The crontab library reads six fields as minute..weekday plus a *year*: a seconds
        # field written first would silently shift every field by one.
        raise InvalidJob(
            f"@job on {where}: cron={cron!r} has 6 fields, which is ambiguous. Use 5 fields "
            "('minute hour day month weekday'), or 7 with seconds first and a year last "
            "('*/10 * * * * * *': every 10 seconds)."
        )
    try:
        CronTab(cron)
    except ValueError as exc:
        raise InvalidJob(f"@job on {where}: cron={cron!r} is not a crontab: {exc}.") from None
    if has_seconds(cron):
        interval = shortest_interval(cron)
        if per_tenant and interval < MIN_PER_TENANT_CRON_INTERVAL:
            raise InvalidJob(
                f"@job on {where}: cron={cron!r} ticks every {interval:g} s; a per_tenant "
                f"cron fans out to every tenant on each tick and must tick at most once a "
                f"minute. Use a system cron that does the sub-minute work itself."
            )
    return cron


def shortest_interval(cron: str) -> float:
    """The shortest gap between consecutive ticks (seconds), sampled over the next ticks
    from a fixed time (a crontab's gaps repeat every minute for the seconds field)."""
    tab = CronTab(cron)
    at = datetime(2001, 1, 1, tzinfo=UTC)
    first = tab.next(now=at, default_utc=True)
    if first is None:
        return math.inf
    at += timedelta(seconds=float(first))  # on a tick: from here on, steps are gaps
    shortest = math.inf
    for _ in range(120):
        step = tab.next(now=at, default_utc=True)
        if step is None:
            break
        shortest = min(shortest, float(step))
        at += timedelta(seconds=float(step))
    return shortest


def check_timezone(where: str, name: Any) -> str:
    """``timezone=`` checked at declaration: an IANA name this Python knows."""
    try:
        ZoneInfo(str(name))
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidJob(
            f"@job on {where}: timezone={name!r} is not an IANA zone (e.g. 'Europe/Berlin')."
        ) from None
    return str(name)


def seconds_until_next(cron: str, timezone: str, now: datetime | None = None) -> float:
    """Seconds until the next tick, with the crontab read in ``timezone`` (DST-aware)."""
    local_now = (now or datetime.now(ZoneInfo("UTC"))).astimezone(ZoneInfo(timezone))
    delay = CronTab(cron).next(now=local_now, default_utc=False)
    return max(float(delay or 0.0), 0.0)


def latest_tick(cron: str, timezone: str, now: datetime) -> datetime:
    """The latest time ``cron`` (read in ``timezone``) fired at or before ``now``, in UTC."""
    probe = (now + _AT_OR_BEFORE).astimezone(ZoneInfo(timezone))
    back = CronTab(cron).previous(now=probe, default_utc=False)  # negative seconds, strictly before
    tick = probe + timedelta(seconds=float(back or 0.0))
    return tick.astimezone(UTC).replace(microsecond=0)
