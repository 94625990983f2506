"""The outbox relay: push the message of every committed run that Redis does not hold.

The ``JobRun`` row written in the enqueuing transaction *is* the outbox row: it holds everything
the message holds (job, tenant, arguments, run id, attempt and deferral counters, origin,
correlation), and it commits or rolls back with the caller's data. The push to Redis happens
on commit; when it fails (Redis down, the process killed between commit and push, a Redis
restart that lost its data), the row stays ``queued`` and this relay pushes its message later.

What a waiting run waits for is derived from the row, never stored separately:

* ``queued`` with ``attempts == n``: attempt ``n + 1`` (a fresh run has ``n == 0``; a retry
  and a run handed back by the sweep keep the number of the attempt that failed);
* ``deferred``: the same attempt with ``defers + 1`` (``ctx.defer()``) or ``gate_defers + 1``
  (an inactive tenant under ``INACTIVE_TENANT="defer"``).

Together with the run id these give the deterministic RQ job id
(``kj-<run>-a<attempt>-d<defers>-g<gate defers>``). A run is relayed only when none of its
candidate RQ jobs exists in Redis, or the one that exists can never run again (failed,
stopped, finished without touching the run, started by a worker that is gone, taken off the
queue by a worker that died before starting it, or marked started by a live worker that has
moved on without starting the run: a start whose reply a network cut lost).

Relaying is safe against the original push and against other relays:

* only runs that are *due* (``scheduled_for``, else ``queued_at``) for longer than
  ``RELAY_GRACE`` are looked at, so a push that is merely in flight is not doubled;
* rows are re-read ``FOR UPDATE`` before the push and skipped if anything changed: a message
  that ran meanwhile has moved the row on (a start always changes status or counters);
* and if a message is pushed twice anyway (an enqueuing transaction that stayed open for longer
  than the grace), both pushes carry the same RQ job id and the records step drops the second
  delivery, because the run is no longer waiting when it arrives.

Duplicates are therefore possible only as at-least-once deliveries, never as lost runs.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import F
from django.db.models.functions import Coalesce
from django.utils import timezone

from .. import transport
from ..core import conf, project_settings
from ..core.envelope import rq_job_id_of, run_id_of
from ..core.exceptions import JobNotRegistered
from ..definition.registry import registry
from ..enqueueing.messages import pending_counters, pushable, waiting_envelope
from ..history import transitions
from ..models import FINISHED_STATUSES, WAITING_STATUSES, JobRun
from . import pauses

logger = logging.getLogger("kumiko_jobs.relay")

# RQ job states from which a message never runs again unless pushed anew. "finished" counts
# too (RQ keeps finished jobs for RESULT_TTL): a finished message whose run is still waiting,
# unchanged since before we looked, ended without touching the run (rejected, e.g. signed with
# a key this project no longer accepts). A message that did run has moved its run on, which the
# re-read under lock in _push_missing sees.
_DEAD_STATES = frozenset({"failed", "stopped", "canceled", "finished"})

# (status, attempts, defers, gate defers): what must be unchanged for a push to be right.
Snapshot = tuple[str, int, int, int]


@dataclass(frozen=True, slots=True)
class RelayResult:
    """What one relay pass did: waiting runs checked, messages pushed again, and runs failed because
    their job is no longer registered.
    """

    checked: int = 0
    pushed: int = 0
    failed: int = 0  # runs of jobs no longer registered, failed closed
    # The last run checked when the pass stopped at its ``limit``, where the next slice goes on;
    # None when it reached the end of the waiting runs.
    stopped_after: uuid.UUID | None = None


def pending_rq_job_ids(run: JobRun) -> list[str]:
    """The RQ job ids a waiting run's message may have (one, or two for a deferred run)."""
    run_hex = uuid.UUID(str(run.run_id)).hex
    return [
        rq_job_id_of(run_hex, *c)
        for c in pending_counters(run.status, run.attempts, run.defer_count, run.gate_defer_count)
    ]


def relay_pending(
    *,
    grace: float | None = None,
    batch_size: int = 500,
    limit: int | None = None,
    after: uuid.UUID | None = None,
) -> RelayResult:
    """Push the messages of due waiting runs that Redis lost or never got: all of them, or (the
    maintenance round's slice) at most ``limit`` runs in id order from the one ``after``.

    Raises when Redis or PostgreSQL is unreachable; nothing is lost then, the next call retries.
    """
    settings = conf.get()
    grace = settings.RELAY_GRACE if grace is None else grace
    cutoff = timezone.now() - timedelta(seconds=grace)
    # Redis says what PostgreSQL says about pauses (a failover or a flush may have lost them).
    pauses.assert_pauses()
    release_lost_slots(cutoff)
    waiting = (
        JobRun.objects.filter(status__in=WAITING_STATUSES)
        .alias(due=Coalesce(F("scheduled_for"), F("queued_at")))
        .filter(due__lte=cutoff)
        .order_by("pk")
    )
    alive = transport.liveness()
    checked = pushed = failed = 0
    last_pk: uuid.UUID | None = after
    stopped_after: uuid.UUID | None = None
    while True:
        if limit is not None and checked >= limit:
            stopped_after = last_pk
            break
        page = waiting.filter(pk__gt=last_pk) if last_pk is not None else waiting
        size = batch_size if limit is None else min(batch_size, limit - checked)
        rows = list(
            page.values_list(
                "pk", "status", "attempts", "defer_count", "gate_defer_count", "queue"
            )[:size]
        )
        if not rows:
            break
        last_pk = rows[-1][0]
        checked += len(rows)
        missing = _missing_messages(rows, alive)
        if missing:
            p, f = _push_missing(missing)
            pushed, failed = pushed + p, failed + f
    if pushed or failed:
        logger.warning(
            "relay: pushed %d message(s) Redis did not hold, failed closed %d run(s) (unknown "
            "jobs, oversized messages; %d waiting run(s) checked)",
            pushed,
            failed,
            checked,
        )
    return RelayResult(checked, pushed, failed, stopped_after)


def release_lost_slots(cutoff: datetime) -> int:
    """Free the RQ rate-limit slots still held by messages whose run finished before ``cutoff``.

    A worker frees its message's slot in RQ's bookkeeping after the run's record. When Redis
    goes away in between (a failover, a restart) the record is kept and the release is lost:
    the slot stays taken, and every message waiting for it (a ``sequential`` job's next run, a
    tenant's ``max_per_tenant`` runs) waits until RQ's own cleanup expires the message's
    started entry, the job's timeout later. The run row says the holder is done. Waiting
    messages are admitted by RQ's own script, which never fills more slots than the limit.
    Returns the number of slots freed.
    """
    seen: set[tuple[Any, ...]] = set()
    freed = 0
    for name in project_settings.rq_queue_names():
        where = transport.redis_identity(transport.connection_for(name))
        if where in seen:
            continue
        seen.add(where)
        holders = transport.rate_limit_slot_holders(name)
        runs = {h.job_id: run for h in holders if (run := run_id_of(h.job_id))}
        if not runs:
            continue
        done = {
            pk.hex
            for pk in JobRun.objects.filter(
                pk__in=[uuid.UUID(r) for r in set(runs.values())],
                status__in=FINISHED_STATUSES,
                finished_at__lte=cutoff,
            ).values_list("pk", flat=True)
        }
        for holder in holders:
            if runs.get(holder.job_id) in done:
                admitted = transport.release_rate_limit_slot(name, holder)
                freed += 1
                logger.warning(
                    "relay: freed the rate-limit slot %s held by %s, whose run finished "
                    "(admitted: %s)",
                    holder.key,
                    holder.job_id,
                    ", ".join(admitted) or "none",
                )
    return freed


@dataclass(slots=True)
class _Missing:
    snapshot: Snapshot
    queue: str
    candidates: list[str]
    dead: list[str]


def _missing_messages(
    rows: Sequence[tuple[Any, ...]], alive: transport.Liveness | None
) -> dict[uuid.UUID, _Missing]:
    """The runs of ``rows`` whose message no RQ job in Redis will ever deliver."""
    by_queue: dict[str, list[tuple[uuid.UUID, Snapshot, list[str]]]] = {}
    for pk, status, attempts, defers, gate_defers, queue in rows:
        snapshot: Snapshot = (status, attempts, defers, gate_defers)
        counters = pending_counters(status, attempts, defers, gate_defers)
        ids = [rq_job_id_of(pk.hex, *c) for c in counters]
        by_queue.setdefault(queue, []).append((pk, snapshot, ids))
    missing: dict[uuid.UUID, _Missing] = {}
    for queue, entries in by_queue.items():
        held = iter(transport.held_messages(queue, [i for _, _, ids in entries for i in ids]))
        for pk, snapshot, ids in entries:
            present, dead = False, []
            for job_id in ids:
                message = next(held)
                status, worker = message.status, message.worker
                if status is None:
                    continue
                if (
                    status in _DEAD_STATES
                    or (
                        status == "started"
                        and worker
                        and alive is not None
                        and alive.is_gone(worker)
                    )
                    or (status == "queued" and message.taken and _stranded(queue, job_id))
                    or (status == "started" and _start_cut(queue, message, alive, pk.hex))
                ):
                    dead.append(job_id)
                else:
                    # Queued, scheduled, waiting for a rate-limit slot, or started by a live
                    # worker: it is being delivered.
                    present = True
            if not present:
                missing[pk] = _Missing(snapshot, queue, ids, dead)
    return missing


def _stranded(queue: str, job_id: str) -> bool:
    """Taken off the queue by a worker that never started it (killed in between)?

    A worker moves a message to the queue's intermediate list and marks it started a moment
    later; one still there, unstarted, on a later relay round at least ``RELAY_GRACE`` (and a
    second) after the first sighting, belongs to a worker that died in between. RQ's own
    cleanup of that list runs only with its ten-minute maintenance.
    """
    return transport.taken_for(queue, job_id) >= max(conf.get().RELAY_GRACE, 1)


def _start_cut(
    queue: str, message: transport.HeldMessage, alive: transport.Liveness | None, run_hex: str
) -> bool:
    """Marked started by a live kumiko worker that does not execute it, while its run waits?

    The worker's start reached Redis but its reply did not (the connection was cut after
    RQ's start transaction was applied, and redis-py's retries failed too), and the failure's
    own bookkeeping was lost as well: the worker went on to other work, the message stays
    ``started`` with a live worker's name, and its run never started (it still waits). Nothing
    else takes it back: the worker is alive (so not the dead-worker rule), the run is not
    ``running`` (so not the sweep), and RQ's own cleanup comes only with its ten-minute
    maintenance and the job's heartbeat expiry.

    A kumiko worker names the RQ job it executes in its liveness key from at most one beat
    after taking it until it returns; so once the start is ``WORKER_DEAD_AFTER`` old (the key
    has been written since, or has expired: then the worker is gone), a key that names
    neither the message nor its run means no attempt is under way. A live worker of another
    class does not beat: what it executes is unknown, and its message is left alone.
    """
    if alive is None or not message.worker or message.worker not in alive.workers:
        return False
    if alive.executes(message.job_id, run_hex):
        return False
    dead_after = max(conf.get().WORKER_DEAD_AFTER, 1)
    if message.started_at is None:  # no start time in RQ's hash: the relay's own sighting
        return transport.taken_for(queue, message.job_id) >= dead_after
    return time.time() - message.started_at >= dead_after


def _push_missing(missing: dict[uuid.UUID, _Missing]) -> tuple[int, int]:
    messages: list[transport.Message] = []
    forget: list[tuple[str, str]] = []
    failed = 0
    unpushable: set[str | None] = set()  # tenants whose weight or rate cannot be resolved
    with transaction.atomic():
        # Locked while we push: a worker's start (UPDATE ... WHERE status IN waiting) waits for
        # this commit, so the row cannot move on between our check and our push. Rows a worker
        # is starting right now are skipped; they are being delivered.
        # In the order of the runs' enqueues (run ids are time-ordered): pushed in that order,
        # they reach their buckets in it, and a tenant's relayed runs keep FIFO; unordered,
        # PostgreSQL returned them in any order (a backlog relayed in reverse).
        rows = (
            JobRun.objects.select_for_update(skip_locked=True)
            .filter(pk__in=list(missing))
            .order_by("queued_at", "pk")
        )
        for run in rows:
            entry = missing[run.pk]
            now: Snapshot = (run.status, run.attempts, run.defer_count, run.gate_defer_count)
            if now != entry.snapshot:
                continue  # delivered meanwhile
            try:
                definition = registry.get(run.job_name)
            except JobNotRegistered as exc:
                _fail_unknown(run, str(exc))
                failed += 1
                continue
            # Due already (that is why it is relayed): straight to the queue, not the scheduler.
            message = pushable(
                definition, waiting_envelope(run), 0.0, priority=run.priority, failed=unpushable
            )
            if message is None:
                continue  # its tenant's TENANT_WEIGHT/TENANT_RATE_LIMIT fails: it waits, logged
            limit = conf.get().MAX_ENVELOPE_BYTES
            if len(message.body) > limit:
                # Every worker would refuse it, and each round would push it again, forever
                # (a run enqueued before sizes were checked at the last attempt, or under a
                # larger limit): fail it closed once, like a worker would.
                _fail_closed(
                    run,
                    "EnvelopeError",
                    f"its message is {len(message.body)} bytes at attempt {run.attempts + 1}, "
                    f"over MAX_ENVELOPE_BYTES={limit}: no worker would accept it",
                )
                failed += 1
                continue
            messages.append(message)
            forget.extend((entry.queue, job_id) for job_id in entry.dead)
        transport.forget_messages(forget)
        if messages:
            transport.push_many(messages)
    return len(messages), failed


def _fail_unknown(run: JobRun, reason: str) -> None:
    _fail_closed(run, "JobNotRegistered", reason)


def _fail_closed(run: JobRun, error_type: str, reason: str) -> None:
    # What a worker would do with the message (fail closed), without the round trip.
    logger.error("run %s failed closed by the relay: %s", run.run_id, reason)
    transitions.fail_closed(run.pk, error_type, reason)
