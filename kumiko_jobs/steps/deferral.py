"""Retry and deferral policy: turn what happened into the next message, or a final outcome.

Only the decision is made here; the message is pushed by the runner after the history is
written, so a quick next attempt can never overtake the record of the previous one.
"""

from __future__ import annotations

from .. import conf
from ..context import RunState
from ..exceptions import DatabaseAccessDenied, InvalidJob, TenantVisibleError, Unrecoverable
from ..pipeline import Next

# Retrying these cannot help: the same code with the same input fails the same way.
_NEVER_RETRY = (Unrecoverable, DatabaseAccessDenied, InvalidJob)


def deferral(state: RunState, call_next: Next) -> None:
    try:
        call_next(state)
    except Exception as exc:
        _failed(state, exc)
    else:
        if state.guard_violations and state.outcome in ("succeeded", "deferred"):
            # The job caught DatabaseAccessDenied and carried on: it still fails.
            _failed(
                state,
                DatabaseAccessDenied(
                    "the job swallowed a database access denial: " + state.guard_violations[0],
                    job_name=state.envelope.job,
                ),
            )
    if state.outcome == "deferred":
        _defer(state)
    if state.outcome == "failed" and state.failure_key is None:
        visible = state.definition.tenant_visible_failure
        if visible is not None:
            state.failure_key = visible.message_key


def _failed(state: RunState, exc: Exception) -> None:
    state.error = exc
    # Rendered by the db_guard step inside the run's tenant when the job raised it.
    described = state.described_error()
    state.error_traceback = described.traceback if described else ""
    retryable = not isinstance(exc, _NEVER_RETRY)
    if isinstance(exc, TenantVisibleError):
        state.failure_key = exc.message_key
        retryable = exc.retry
    if retryable and not state.final_attempt:
        state.outcome = "retrying"
        delay = state.definition.backoff.seconds_after(state.envelope.attempt)
        state.reschedule = (state.envelope.next_attempt(), delay)
    else:
        state.outcome = "failed"


def _defer(state: RunState) -> None:
    env = state.envelope
    seconds = state.deferral_seconds or 0.0
    if state.deferred_by_gate:
        state.reschedule = (env.deferred(by_gate=True), seconds)
        return
    limit = state.definition.max_defers
    if limit is None:
        limit = conf.get().MAX_DEFERS
    if env.defers >= limit:
        state.outcome = "failed"
        state.error = Unrecoverable(
            f"deferred {env.defers} times, which is max_defers={limit}; the run gives up"
        )
        return
    state.reschedule = (env.deferred(by_gate=False), seconds)
