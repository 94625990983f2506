"""What holds a waiting run back, in the words the admin's status column and ``manage.py
kumiko_jobs runs`` both use: an operator's pause, a rate window, a concurrency cap, a delay
(a retry's back-off, ``enqueue_in``) or a deferral.

A queued run that waits for one of these is not stuck, and a user reading "queued" alone
cannot tell. Each source is read the cheap way its owner offers (the pauses from PostgreSQL,
the rate windows and the caps' waiters from Redis, each at most once a second per process), so
a list of runs costs no query per row.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum

from django.utils.timezone import now
from django.utils.translation import gettext

from .. import transport
from ..models import JobRun, RunStatus
from .pauses import paused_by_rule


class HoldKind(StrEnum):
    """What holds a waiting run back."""

    PAUSED = "paused"  # an operator's pause (FlowPause)
    RATE = "rate"  # a rate window, until it reopens
    CAP = "cap"  # a concurrency cap, until a slot frees
    UNTIL = "until"  # a delay not yet due (a retry's back-off, enqueue_in)
    DEFERRAL = "deferral"  # a deferral's kind (the job's own, the inactive-tenant gate)


@dataclass(frozen=True, slots=True)
class Hold:
    """Why a run waits: its ``kind``, the sentence to show, and ``at``, when it lifts by
    itself (a window, a delay)."""

    kind: HoldKind
    text: str
    at: datetime | None = None


def hold_of(run: JobRun) -> Hold | None:
    """What holds ``run`` back, or None (it is not waiting, or nothing but its turn)."""
    held = paused_by_rule(run)
    if held:
        return Hold(HoldKind.PAUSED, gettext("paused (%(what)s)") % {"what": held})
    if run.status == RunStatus.QUEUED:
        # (the bucket its messages wait in: a system run a tenant's run started waits in that
        # tenant's, Envelope.flow_tenant)
        schema = run.schema_name or run.flow_schema or None
        reopens = transport.rate_wait_until(run.queue, schema, run.priority, run.job_name)
        if reopens is not None:
            at = datetime.fromtimestamp(reopens, UTC)
            return Hold(HoldKind.RATE, gettext("waiting for a rate limit"), at)
        if transport.held_by_cap(run.queue, schema, run.priority, run.job_name):
            return Hold(HoldKind.CAP, gettext("waiting for a free slot (concurrency cap)"))
        if run.scheduled_for and run.scheduled_for > now():
            return Hold(HoldKind.UNTIL, "", run.scheduled_for)
    if run.status == RunStatus.DEFERRED and run.waiting_for:
        # Which deferral (recorded since migration 0012): the job's own delay, or the
        # inactive-tenant gate, which an operator resolves by reactivating the tenant.
        what = run.get_waiting_for_display()
        return Hold(HoldKind.DEFERRAL, gettext("waiting for %(what)s") % {"what": what})
    return None
