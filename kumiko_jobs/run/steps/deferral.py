"""Retry and deferral policy: turn what happened into the next message, or a final outcome.

Only the decision is made here; the message is pushed by the runner after the history is
written, so a quick next attempt can never overtake the record of the previous one.
"""

from __future__ import annotations

from ...core.exceptions import (
    FALLBACK_MESSAGE_KEY,
    DatabaseAccessDenied,
    InvalidJob,
    JobCancelled,
    TenantVisibleError,
    Unrecoverable,
    message_key_problem,
)
from ...core.outcome import DeferralKind, Outcome
from ...guard import denials
from .. import cancellation
from ..pipeline import Next
from ..state import RunState

# Retrying these cannot help: the same code with the same input fails the same way.
_NEVER_RETRY = (Unrecoverable, DatabaseAccessDenied, InvalidJob)


def deferral(state: RunState, call_next: Next) -> None:
    """Turn what the rest of the pipeline did into the run's ending: an exception (or a swallowed
    access denial) fails the attempt, with a retry when one is left; a deferral becomes the
    resumption; an operator's cancellation wins over both.
    """
    ending = state.ending
    try:
        call_next(state)
    except Exception as exc:
        _failed(state, exc)
    else:
        if state.watch.violations and ending.outcome in (Outcome.SUCCEEDED, Outcome.DEFERRED):
            # The job caught DatabaseAccessDenied and carried on: it still fails.
            _failed(state, denials.swallowed(state.watch))
    if settle_cancellation(state):
        return  # cancelled on an operator's request: no retry, no resumption
    if ending.outcome is Outcome.DEFERRED:
        _defer(state)
    if ending.outcome is Outcome.FAILED and ending.failure_key is None:
        visible = state.definition.tenant_visible_failure
        if visible is not None:
            ending.show_tenant(visible.message_key)


def _failed(state: RunState, exc: Exception) -> None:
    ending = state.ending
    # Rendered by the db_guard step inside the run's tenant when the job raised it.
    traceback = ending.rendering_of(exc).traceback
    retryable = not isinstance(exc, _NEVER_RETRY)
    if isinstance(exc, TenantVisibleError):
        ending.show_tenant(_storable_key(state, exc))
        retryable = exc.retry
    if retryable and not state.final_attempt:
        delay = state.definition.backoff.seconds_after(state.envelope.attempt)
        ending.retry(exc, traceback, state.envelope.next_attempt(), delay)
    else:
        ending.fail(exc, traceback=traceback)


def _storable_key(state: RunState, exc: TenantVisibleError) -> str:
    """The key to record: one the history can hold, else the job's declared or a generic one.

    An unstorable key (too long for the column, say) would make the final history write fail
    and leave the run ``running``, the tenant never seeing the failure.
    """
    key = getattr(exc, "message_key", None)
    if not getattr(exc, "key_problem", None) and message_key_problem(key) is None:
        return str(key)
    declared = state.definition.tenant_visible_failure
    return declared.message_key if declared is not None else FALLBACK_MESSAGE_KEY


def _defer(state: RunState) -> None:
    env, ending = state.envelope, state.ending
    if ending.deferral_kind is DeferralKind.GATE:
        ending.resume_in(env.deferred(by_gate=True))
        return
    limit = state.definition.effective_max_defers
    if env.defers >= limit:
        ending.fail(
            Unrecoverable(
                f"deferred {env.defers} times, which is max_defers={limit}; the run gives up"
            )
        )
        return
    ending.resume_in(env.deferred(by_gate=False))


def settle_cancellation(state: RunState) -> bool:
    """Turn the attempt's outcome into ``cancelled`` when a cancellation decides it.

    * The job acknowledged the request (``ctx.check_cancelled()`` raised): cancelled, whatever
      the body did after catching the exception.
    * A request reached the run and the body did not complete (it raised, timed out, was
      denied, or asked to be deferred): cancelled, never retried or resumed.
    * The body returned normally without acknowledging: **success wins**. Its work is done, and
      calling it cancelled would hide effects that happened; ``cancel_requested_at`` stays on
      the row to show the request came too late.
    """
    ending = state.ending
    who = cancellation.requested_by(state.envelope.run_id)
    acknowledged = state.cancellation.acknowledged
    if not acknowledged and who is None:
        return False
    if ending.outcome is Outcome.SUCCEEDED and not acknowledged:
        return False
    if isinstance(ending.error, JobCancelled):
        ending.cancel(None)  # the job's own: its message and traceback stay
    else:
        ended = f" (the attempt ended with {type(ending.error).__name__})" if ending.error else ""
        ending.cancel(JobCancelled(f"cancelled on request{cancellation.by_whom(who)}{ended}"))
    return True
