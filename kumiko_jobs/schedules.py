"""Cron schedules: validate at registration, register idempotently with rq-scheduler.

Each cron job has one scheduled RQ job, id ``kj-cron-<name>``, whose message is a signed
*template* envelope (``trigger="cron"``, a zero run id). When rq-scheduler moves it to the queue
at a tick, the runner turns it into a run whose id is derived from the job name and the tick
minute: should two schedulers ever both enqueue a tick (rq-scheduler's lock prevents it), the
second message finds the run already there and is dropped.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from crontab import CronTab

from . import transport
from .envelope import Envelope, encode
from .exceptions import InvalidJob
from .registry import JobDefinition, registry

CRON_PREFIX = "kj-cron-"
TEMPLATE_RUN_ID = "0" * 32
_TICK_NAMESPACE = uuid.UUID("6f1c2b9e-3a57-4d0e-9a61-1c9f0b7f4e21")


def check_cron(where: str, cron: Any) -> str:
    if not isinstance(cron, str):
        raise InvalidJob(f"@job on {where}: cron must be a string like '0 3 * * *'.")
    try:
        CronTab(cron)
    except ValueError as exc:
        raise InvalidJob(f"@job on {where}: cron={cron!r} is not a crontab: {exc}.") from None
    return cron


def check_timezone(where: str, name: Any) -> str:
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


def schedule_id(definition: JobDefinition) -> str:
    return CRON_PREFIX + definition.name.replace(".", "_").replace(":", "_")


def template(definition: JobDefinition) -> Envelope:
    return Envelope(
        job=definition.name, schema=None, kwargs={}, run_id=TEMPLATE_RUN_ID, trigger="cron"
    )


def is_template(envelope: Envelope) -> bool:
    return envelope.trigger == "cron" and envelope.run_id == TEMPLATE_RUN_ID


def tick_run_id(job_name: str, tick: datetime) -> str:
    minute = tick.replace(second=0, microsecond=0).isoformat()
    return uuid.uuid5(_TICK_NAMESPACE, f"{job_name}@{minute}").hex


@dataclass(frozen=True, slots=True)
class SyncResult:
    created: tuple[str, ...]
    updated: tuple[str, ...]
    removed: tuple[str, ...]
    unchanged: tuple[str, ...]


def cron_spec(definition: JobDefinition) -> transport.CronSpec:
    """The cron entry a cron job should have with rq-scheduler."""
    from .enqueueing import queue_of, timeout_of

    assert definition.cron
    return transport.CronSpec(
        schedule_id=schedule_id(definition),
        cron=definition.cron,
        timezone=definition.timezone,
        body=encode(template(definition)),
        queue=queue_of(definition),
        timeout=timeout_of(definition),
    )


def sync_schedules() -> SyncResult:
    """Make rq-scheduler's cron entries match the registry (idempotent)."""
    existing = transport.cron_entries()
    created, updated, unchanged = [], [], []
    wanted = set()
    for definition in registry:
        if not definition.cron:
            continue
        spec = cron_spec(definition)
        sid = spec.schedule_id
        wanted.add(sid)
        current = existing.get(sid)
        if current == spec:
            unchanged.append(sid)
            continue
        if current is not None:
            transport.cancel_scheduled(sid)
            updated.append(sid)
        else:
            created.append(sid)
        transport.register_cron(spec, seconds_until_next(spec.cron, spec.timezone))
    removed = sorted(sid for sid in existing if sid not in wanted)
    for sid in removed:
        transport.cancel_scheduled(sid)
    return SyncResult(tuple(created), tuple(updated), tuple(removed), tuple(unchanged))


def restore_missing_cron() -> tuple[str, ...]:
    """Re-register the cron entries that are gone from rq-scheduler; the others stay untouched.

    Anyone with the queue pages (or a Redis client) can delete a cron entry, housekeeping's
    included, and rq-scheduler would never tick it again: ``sync_schedules`` runs only when the
    scheduler starts. ``transport.Scheduler`` calls this on every round, under rq-scheduler's
    lock, at the cost of one Redis round trip. A restored entry resumes at its next tick; ticks
    that fell while it was gone are not replayed.
    """
    wanted = {schedule_id(d): d for d in registry if d.cron}
    missing = transport.missing_cron_entries(sorted(wanted))
    for sid in missing:
        spec = cron_spec(wanted[sid])
        # Remove what is left (a hash without its slot, or a slot without its hash).
        transport.cancel_scheduled(sid)
        transport.register_cron(spec, seconds_until_next(spec.cron, spec.timezone))
    return tuple(missing)
