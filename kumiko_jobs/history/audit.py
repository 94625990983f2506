"""Reporting of escape-hatch use: every allowed crossing is logged and kept in ``EscapeHatchUse``.

Reports are deduplicated per (job, grant, tenant, actor) within a window (60 s by default) so a
loop of a thousand granted statements makes one report, and once per process for system cron
runs, which would otherwise report every tick. Rows are written with the run's history, outside
the guard, in the public schema.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from .. import telemetry
from ..core import conf
from ..core.current import current_user
from ..models import EscapeHatchUse

if TYPE_CHECKING:
    from ..core.envelope import Envelope

logger = logging.getLogger("kumiko_jobs.audit")

# (job, grant, tenant, actor) -> monotonic time of the last report in this process
_last_reported: dict[tuple[str, str, str, str], float] = {}


@dataclass(slots=True)
class AuditUses:
    """The escape-hatch uses one run reported, written with its history (``save_uses``)."""

    # What the job declared (its EscapeHatch's reason; "system job" for a system job without).
    reason: str
    # A system job's cron runs report once per process rather than once per window.
    system: bool = False
    # (grant, reason, actor) of every report not deduplicated away.
    reported: list[tuple[str, str, str]] = field(default_factory=list)


class Audited(Protocol):
    """What the audit reads of a run (``context.RunState`` has it)."""

    @property
    def envelope(self) -> Envelope:
        """The run's envelope: job, tenant, trigger and triggering user."""
        ...

    @property
    def audit_uses(self) -> AuditUses:
        """The run's escape-hatch reports so far, which ``save_uses`` writes with the history."""
        ...


def actor_of(state: Audited) -> str:
    """Who made the run use the hatch: the user the job acts for, else the user who triggered the
    run, else nobody (``""``).
    """
    user = current_user()
    if user is not None:
        return f"user:{getattr(user, 'pk', user)}"
    return f"user:{state.envelope.triggered_by}" if state.envelope.triggered_by else ""


def record_use(state: Audited, grant: str) -> None:
    """Count one use of ``grant`` and, unless the same job, grant, tenant and actor reported within
    the dedupe window (or, for a system cron job, at all in this process), log it and note it for
    the history.
    """
    env, uses = state.envelope, state.audit_uses
    # Every use is counted; only the log line and the EscapeHatchUse row are deduplicated.
    telemetry.escape_hatch_used(env.job, grant)
    actor = actor_of(state)
    key = (env.job, grant, env.schema or "", actor)
    now = time.monotonic()
    last = _last_reported.get(key)
    once_per_process = uses.system and (env.trigger or "").startswith("cron")
    if last is not None and (
        once_per_process or now - last < conf.get().ESCAPE_HATCH_DEDUPE_SECONDS
    ):
        return
    _last_reported[key] = now
    reason = uses.reason
    uses.reported.append((grant, reason, actor))
    logger.warning(
        "escape hatch %s used by %s in %s (actor %s): %s",
        grant,
        env.job,
        env.schema or "public",
        actor or "-",
        reason,
        extra={"kumiko_grant": grant, "kumiko_job": env.job},
    )


def save_uses(state: Audited) -> None:
    """Upsert the run's reported uses (called by the records step, outside the guard)."""
    if not state.audit_uses.reported:
        return
    # Models: the run side imports this module while apps may still be loading.
    from django.db.models import F
    from django.utils import timezone

    now = timezone.now()
    env = state.envelope
    for grant, reason, actor in state.audit_uses.reported:
        updated = EscapeHatchUse.objects.filter(
            job_name=env.job, grant=grant, schema_name=env.schema or "", actor=actor
        ).update(
            count=F("count") + 1,
            last_seen=now,
            reason=reason,
            triggered_by=env.triggered_by or "",
            last_run_id=env.run_id,
        )
        if not updated:
            EscapeHatchUse.objects.get_or_create(
                job_name=env.job,
                grant=grant,
                schema_name=env.schema or "",
                actor=actor,
                defaults={
                    "reason": reason,
                    "first_seen": now,
                    "last_seen": now,
                    "triggered_by": env.triggered_by or "",
                    "last_run_id": env.run_id,
                },
            )
