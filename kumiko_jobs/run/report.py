"""What every finished attempt reports: its metrics and one log line.

The records step calls ``run_finished`` once the history is written. It reads the run's state
(outcome, attempts, the rendered error), so it sits on the run side; the counters it feeds
belong to kumiko_jobs.telemetry and the scrubbing to kumiko_jobs.log_context.

The line replaces RQ's own, which names the message by its RQ id and a truncated JSON envelope
and says "Job OK" even after a failed attempt (kumiko records the failure and returns normally;
the worker hides those lines). Only names, counters and the scrubbed error reach the log: the
arguments of the job (its payload) and the traceback stay in the operator-only attempt record.
"""

from __future__ import annotations

import json
import logging

from .. import telemetry
from ..core.outcome import Outcome
from ..log_context import scrub
from .state import RunState

logger = logging.getLogger("kumiko_jobs.runs")
# A failure to report is telemetry's: logged under its name, where operators look for it.
telemetry_logger = logging.getLogger("kumiko_jobs.telemetry")

_NONE = "-"
_MAX_MESSAGE = 1000


def run_finished(state: RunState, duration_ms: float) -> None:
    """Metrics and the log line of one finished attempt. Never raises."""
    try:
        outcome = state.ending.outcome or Outcome.FAILED
        telemetry.record_attempt(
            state.envelope.job, outcome, duration_ms, deferred_by=state.ending.deferral_kind
        )
        if outcome in (Outcome.FAILED, Outcome.RETRYING):
            log_failed_attempt(state, outcome)
        else:
            log_attempt_outcome(state, outcome, duration_ms)
    except Exception:  # telemetry must never change the outcome of a run
        telemetry_logger.warning(
            "could not record telemetry for run %s", state.envelope.run_id, exc_info=True
        )


def log_attempt_outcome(state: RunState, outcome: Outcome, duration_ms: float) -> None:
    """One INFO line for an attempt that did not fail: what ran, for whom, and how it ended.
    Failed attempts get ``log_failed_attempt``'s line instead."""
    env = state.envelope
    tenant = env.schema or "public"
    logger.info(
        "run %s: job=%s tenant=%s run_id=%s attempt=%d/%d duration_ms=%.0f",
        outcome,
        env.job,
        tenant,
        env.run_id,
        env.attempt,
        state.max_attempts,
        duration_ms,
        extra={
            "kumiko_job": env.job,
            "kumiko_run_id": env.run_id,
            "kumiko_tenant": tenant,
            "kumiko_attempt": env.attempt,
            "kumiko_outcome": outcome,
        },
    )


def log_failed_attempt(state: RunState, outcome: Outcome) -> None:
    """One line per failed attempt: WARNING when it will be retried, ERROR when it is final."""
    env, described = state.envelope, state.ending.described_error()
    final = outcome is Outcome.FAILED
    error_type = described.type_name if described is not None else _NONE
    # Truncated before it is scrubbed: the text may be megabytes (scrubbing.py).
    message = scrub(described.message, limit=_MAX_MESSAGE) if described is not None else ""
    fields = {
        "kumiko_job": env.job,
        "kumiko_run_id": env.run_id,
        "kumiko_tenant": env.schema or "public",
        "kumiko_attempt": env.attempt,
        "kumiko_max_attempts": state.max_attempts,
        "kumiko_final": final,
        "kumiko_error_type": error_type,
        "kumiko_error_message": message,
    }
    logger.log(
        logging.ERROR if final else logging.WARNING,
        # logfmt-style and one line whatever the error text: json.dumps escapes newlines.
        "attempt failed: job=%s run_id=%s tenant=%s attempt=%d/%d final=%s error_type=%s error=%s",
        env.job,
        env.run_id,
        fields["kumiko_tenant"],
        env.attempt,
        state.max_attempts,
        "true" if final else "false",
        error_type,
        json.dumps(message),
        extra=fields,
    )
