"""Reporting of escape-hatch use: every allowed crossing is logged and kept in ``EscapeHatchUse``.

Reports are deduplicated per (job, grant, tenant, actor) within a window (60 s by default) so a
loop of a thousand granted statements makes one report, and once per process for system cron
runs, which would otherwise report every tick. Rows are written with the run's history, outside
the guard, in the public schema.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from . import conf, telemetry
from .context import current_user

if TYPE_CHECKING:
    from .context import RunState

logger = logging.getLogger("kumiko_jobs.audit")

# (job, grant, tenant, actor) -> monotonic time of the last report in this process
_last_reported: dict[tuple[str, str, str, str], float] = {}


def actor_of(state: RunState) -> str:
    user = current_user()
    if user is not None:
        return f"user:{getattr(user, 'pk', user)}"
    return f"user:{state.envelope.triggered_by}" if state.envelope.triggered_by else ""


def record_use(state: RunState, grant: str) -> None:
    env = state.envelope
    # Every use is counted; only the log line and the EscapeHatchUse row are deduplicated.
    telemetry.escape_hatch_used(env.job, grant)
    actor = actor_of(state)
    key = (env.job, grant, env.schema or "", actor)
    now = time.monotonic()
    last = _last_reported.get(key)
    once_per_process = state.definition.system and (env.trigger or "").startswith("cron")
    if last is not None and (
        once_per_process or now - last < conf.get().ESCAPE_HATCH_DEDUPE_SECONDS
    ):
        return
    _last_reported[key] = now
    hatch = state.definition.escape_hatch
    reason = hatch.reason if hatch else "system job"
    state.audit_uses.append((grant, reason, actor))
    logger.warning(
        "escape hatch %s used by %s in %s (actor %s): %s",
        grant,
        env.job,
        env.schema or "public",
        actor or "-",
        reason,
        extra={"kumiko_grant": grant, "kumiko_job": env.job},
    )


def save_uses(state: RunState) -> None:
    """Upsert the run's reported uses (called by the records step, outside the guard)."""
    if not state.audit_uses:
        return
    from django.db.models import F
    from django.utils import timezone

    from .models import EscapeHatchUse

    now = timezone.now()
    env = state.envelope
    for grant, reason, actor in state.audit_uses:
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
