"""Reporting of escape-hatch use: every allowed crossing is logged, deduplicated per window."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from . import conf

if TYPE_CHECKING:
    from .context import RunState

logger = logging.getLogger("kumiko_jobs.audit")

# (job, grant, tenant, actor) -> monotonic time of the last report in this process
_last_reported: dict[tuple[str, str, str, str], float] = {}


def record_use(state: RunState, grant: str) -> None:
    env = state.envelope
    key = (env.job, grant, env.schema or "", env.triggered_by or "")
    now = time.monotonic()
    window = conf.get().ESCAPE_HATCH_DEDUPE_SECONDS
    last = _last_reported.get(key)
    if last is not None and now - last < window:
        return
    _last_reported[key] = now
    reason = state.definition.escape_hatch.reason if state.definition.escape_hatch else "system job"
    logger.warning(
        "escape hatch %s used by %s in %s: %s",
        grant,
        env.job,
        env.schema or "public",
        reason,
        extra={"kumiko_grant": grant, "kumiko_job": env.job},
    )
