"""Cron schedules: validate at registration, register idempotently with rq-scheduler.

Each cron job has one scheduled RQ job, id ``kj-cron-<name>``: an alarm clock. Its message is a
signed *template* envelope (``trigger="cron"``, a zero run id, signed as of the epoch so that it
is both stable across syncs and long expired) that no worker ever runs. When the alarm rings,
kumiko's scheduler (``transport.Scheduler``) calls ``fire``, which

* identifies the tick by signed data only: the job (looked up by the alarm's id in the
  registry, never read from the message) and the latest time the job's crontab fired, computed
  from the registry's cron and time zone. Neither the alarm's score nor any RQ field is trusted:
  a copied or re-scored alarm can at most fire the current tick again;
* writes the tick's run row, whose id is derived from that identity
  (``core.envelope.tick_run_id``), before any message exists: a second firing of the same
  tick (two schedulers, a replayed alarm) finds the row and pushes nothing, and the row is the
  outbox the relay pushes from;
* pushes an ordinary signed message for that run, carrying the tick's scheduled time.

A per-tenant cron job's tick run fans out; each child's run id is derived from the tick's run id
and the tenant's schema, and its message carries the tick too, so (job, tick, tenant) is the
signed identity of every child.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.db import IntegrityError, close_old_connections, transaction

from .. import transport
from ..core import conf
from ..core.envelope import Envelope, encode
from ..definition.cron import latest_tick, seconds_until_next
from ..definition.job import JobDefinition
from ..definition.registry import registry
from ..definition.subject import build_subject
from .admission import admission
from .messages import message_for, row_for
from .submit import record_refusal

logger = logging.getLogger("kumiko_jobs.schedules")


def schedule_id(definition: JobDefinition) -> str:
    """The id of a cron job's alarm with rq-scheduler (``kj-cron-<name>``)."""
    return transport.cron_entry_id(definition.name)


@dataclass(frozen=True, slots=True)
class Firing:
    """An alarm rung: push ``missed``, then ``message`` (if any), ring again at ``next_at``."""

    message: transport.Message | None
    next_at: float | None  # epoch seconds; None: the alarm belongs to no registered cron job
    run_id: str = ""
    # Messages of the earlier ticks a late alarm passed (caught up: CRON_CATCH_UP), oldest first.
    missed: tuple[transport.Message, ...] = ()


def definition_for(alarm_id: str) -> JobDefinition | None:
    """The registered cron job an alarm rings for; None for an alarm of no such job."""
    for definition in registry:
        if definition.cron and schedule_id(definition) == alarm_id:
            return definition
    return None


def fire(alarm_id: str, now: datetime | None = None, due_at: float | None = None) -> Firing:
    """The tick an alarm rings for: its run row written, its message built (not pushed).

    ``due_at`` (epoch seconds) is when the alarm was set to ring. When it rings at most
    ``CRON_CATCH_UP`` seconds after that, the ticks it passed (a scheduler killed inside its
    round held the lock meanwhile) are fired too, each once (its run id is the tick's, so a
    second firing finds the row); when it rings later (no scheduler ran), only the latest tick
    is. The score is Redis's, not signed: a forged one fires at most ``CRON_CATCH_UP`` seconds'
    ticks, none of them twice.

    Raises ``django.db.DatabaseError`` when PostgreSQL is unreachable: the scheduler then leaves
    the alarm due and rings it again on its next round, for the same tick.
    """
    definition = definition_for(alarm_id)
    if definition is None or definition.cron is None:
        return Firing(None, None)
    # The scheduler is a long-lived process: a connection PostgreSQL dropped (restart, idle
    # timeout) is replaced here, as Django does at the start of every request.
    close_old_connections()
    now = now or datetime.now(UTC)
    tick = latest_tick(definition.cron, definition.timezone, now)
    after = seconds_until_next(definition.cron, definition.timezone, tick)
    next_at = float(math.ceil(tick.timestamp() + after))
    missed = tuple(
        message
        for earlier in _passed_ticks(definition, definition.cron, tick, due_at, now)
        if (message := _fire_tick(definition, earlier)[1]) is not None
    )
    run_id, message = _fire_tick(definition, tick)
    return Firing(message, next_at, run_id, missed)


def _passed_ticks(
    definition: JobDefinition, cron: str, latest: datetime, due_at: float | None, now: datetime
) -> list[datetime]:
    """The ticks from ``due_at`` up to (not including) ``latest``, oldest first; none when
    the alarm rang more than ``CRON_CATCH_UP`` seconds late or catching up is off."""
    window = conf.get().CRON_CATCH_UP
    if due_at is None or window <= 0 or now.timestamp() - due_at > window:
        return []
    zone = definition.timezone
    tick = latest_tick(cron, zone, datetime.fromtimestamp(due_at, UTC))
    passed = []
    while tick < latest:
        if tick.timestamp() > due_at - 1:  # (the tick before the alarm's own fired already)
            passed.append(tick)
        tick = tick + timedelta(seconds=max(seconds_until_next(cron, zone, tick), 1.0))
    return passed


def _fire_tick(definition: JobDefinition, tick: datetime) -> tuple[str, transport.Message | None]:
    """Write ``tick``'s run row (or its refusal) and build its message: (run id, message);
    no message when the tick fired already or was refused."""
    env = Envelope.cron_tick(definition.name, tick)
    subject = build_subject(definition, {})
    row = row_for(definition, env, subject, 0.0)
    try:
        with transaction.atomic(), admission(definition, None) as refused:
            # A system cron's tick is an enqueue like any other: its concurrency options apply
            # (the tenant of a system job is the system). A refused tick is still recorded
            # under the tick's run id, so a second scheduler ringing it finds the row.
            if refused is not None:
                record_refusal(
                    definition,
                    None,
                    {},
                    subject,
                    "cron",
                    refused,
                    run_id=env.run_id,
                    tick=env.tick,
                )
            else:
                row.save(force_insert=True)
    except IntegrityError:
        # Fired already (another scheduler, or a replayed alarm): that firing pushed it, or
        # the relay will; this one does nothing.
        logger.info("cron tick %s of %s already fired", env.tick, definition.name)
        return env.run_id, None
    if refused is not None:
        logger.info("cron tick %s of %s %s", env.tick, definition.name, refused)
        return env.run_id, None
    return env.run_id, message_for(definition, env, 0.0)


@dataclass(frozen=True, slots=True)
class SyncResult:
    """What ``sync_schedules`` did, by alarm id (the ``kumiko_jobs schedule`` command shows it)."""

    created: tuple[str, ...]
    updated: tuple[str, ...]
    removed: tuple[str, ...]
    unchanged: tuple[str, ...]


def cron_spec(definition: JobDefinition) -> transport.CronSpec:
    """The cron entry a cron job should have with rq-scheduler."""
    assert definition.cron
    return transport.CronSpec(
        schedule_id=schedule_id(definition),
        cron=definition.cron,
        timezone=definition.timezone,
        # Signed as of the epoch: the same bytes at every sync, and expired for any worker.
        body=encode(Envelope.cron_template(definition.name), now=0.0),
        queue=definition.queue_name,
        timeout=definition.timeout_seconds,
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


class _CronHooks:
    """``transport.Scheduler``'s way into the cron domain (``transport.CronHooks``), which the
    transport cannot import: it sits below the registry. ``KumikoJobsConfig.ready`` installs it."""

    def sync_schedules(self) -> SyncResult:
        return sync_schedules()

    def restore_missing_cron(self) -> tuple[str, ...]:
        return restore_missing_cron()

    def fire(self, alarm_id: str, due_at: float | None = None) -> Firing:
        return fire(alarm_id, due_at=due_at)


CRON_HOOKS = _CronHooks()
