"""Unit tests for the deferral step's policy (run/steps/deferral.py): no database, no Redis.

Each test drives the real ``deferral`` step over a run's state (``states.make_state``) with a
tiny fake for the rest of the pipeline (it returns, defers, or raises). Pinned here:

* retry vs final failure: by attempts left (``retries``), with the backoff's delay and the next
  attempt's envelope; the final attempt fails for good;
* ``Unrecoverable``, ``DatabaseAccessDenied`` and ``InvalidJob`` are never retried;
  ``TenantVisibleError`` shows its key to the tenant (or a storable fallback) and retries only
  when it says so; a failed run shows the job's declared ``tenant_visible_failure``;
* a guard violation the job swallowed still fails the run (success and deferral alike);
* deferral limits: the job's deferrals count against ``max_defers``, a gate's do not;
* cancellation (``settle_cancellation``): the flags live in this process
  (run/cancellation.py), so marking a run is pure; success wins unless the job acknowledged,
  and a cancelled run is never retried or resumed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from kumiko_jobs.core.envelope import new_run_id
from kumiko_jobs.core.exceptions import (
    FALLBACK_MESSAGE_KEY,
    DatabaseAccessDenied,
    InvalidJob,
    JobCancelled,
    TenantVisibleError,
    Unrecoverable,
)
from kumiko_jobs.core.outcome import DeferralKind, Outcome
from kumiko_jobs.run import cancellation
from kumiko_jobs.run.state import RunState
from kumiko_jobs.run.steps.deferral import deferral, settle_cancellation
from tests.unit.states import make_state


def make_run(
    *, attempt: int = 1, defers: int = 0, gate_defers: int = 0, **options: Any
) -> RunState:
    """A tenant run of a job declared with ``options`` (retries=2 and a fixed 7 s backoff
    unless given), at ``attempt`` with the given deferral counters."""
    options = {"retries": 2, "backoff": {"type": "fixed", "delay": 7}} | options
    return make_state(
        name="unit.deferral_body",
        attempt=attempt,
        defers=defers,
        gate_defers=gate_defers,
        tenant=object(),
        **options,
    )


def raising(exc: BaseException) -> Callable[[RunState], None]:
    def body(state: RunState) -> None:
        raise exc

    return body


def succeeding(state: RunState) -> None:
    state.ending.succeed("done")


def deferring(seconds: float, kind: DeferralKind = DeferralKind.JOB) -> Callable[[RunState], None]:
    def body(state: RunState) -> None:
        state.ending.defer(seconds, kind)

    return body


@pytest.fixture(autouse=True)
def no_cancellations_left() -> Iterator[None]:
    """Cancellation marks are process memory: none leaks from one test into another."""
    yield
    cancellation._requested.clear()


# --- retry vs final failure ----------------------------------------------------------------------


def test_a_failure_with_attempts_left_is_retried_after_the_backoff() -> None:
    state = make_run(attempt=1)
    error = RuntimeError("provider down")
    deferral(state, raising(error))
    ending = state.ending
    assert ending.outcome is Outcome.RETRYING
    assert ending.error is error
    assert "provider down" in ending.error_traceback
    assert ending.reschedule == (state.envelope.next_attempt(), 7.0)
    assert ending.reschedule[0].attempt == 2
    assert ending.failure_key is None


def test_the_retry_delay_follows_an_exponential_backoff() -> None:
    state = make_run(attempt=2, backoff={"type": "exponential", "delay": 3, "max_delay": 100})
    deferral(state, raising(RuntimeError("again")))
    assert state.ending.outcome is Outcome.RETRYING
    assert state.ending.reschedule is not None
    assert state.ending.reschedule[1] == 6.0  # 3 * 2**(2-1)


def test_the_final_attempt_fails_for_good() -> None:
    state = make_run(attempt=3)  # retries=2: attempts 1, 2, 3
    assert state.final_attempt
    error = RuntimeError("still down")
    deferral(state, raising(error))
    assert state.ending.outcome is Outcome.FAILED
    assert state.ending.error is error
    assert state.ending.reschedule is None


def test_no_retries_fails_at_the_first_attempt() -> None:
    state = make_run(retries=0)
    deferral(state, raising(RuntimeError("once")))
    assert state.ending.outcome is Outcome.FAILED
    assert state.ending.reschedule is None


@pytest.mark.parametrize(
    "error",
    [
        Unrecoverable("bad input"),
        DatabaseAccessDenied("denied", job_name="unit.deferral_body"),
        InvalidJob("wrong arguments"),
    ],
    ids=["Unrecoverable", "DatabaseAccessDenied", "InvalidJob"],
)
def test_never_retried_even_with_attempts_left(error: Exception) -> None:
    state = make_run(attempt=1, retries=5)
    deferral(state, raising(error))
    assert state.ending.outcome is Outcome.FAILED
    assert state.ending.error is error
    assert state.ending.reschedule is None


def test_a_success_passes_through_untouched() -> None:
    state = make_run()
    deferral(state, succeeding)
    assert state.ending.outcome is Outcome.SUCCEEDED
    assert state.ending.result == "done"
    assert state.ending.reschedule is None
    assert state.ending.error is None


def test_a_base_exception_is_not_policy_and_passes_up() -> None:
    """Only ``Exception`` is turned into an outcome; a KeyboardInterrupt (or a worker's
    shutdown) is not swallowed as a failure."""
    state = make_run()
    with pytest.raises(KeyboardInterrupt):
        deferral(state, raising(KeyboardInterrupt()))
    assert state.ending.outcome is None


# --- what the tenant sees ------------------------------------------------------------------------


def test_tenant_visible_error_fails_with_its_key_and_is_not_retried_by_default() -> None:
    state = make_run(attempt=1)
    deferral(state, raising(TenantVisibleError("billing.sync_failed")))
    assert state.ending.outcome is Outcome.FAILED
    assert state.ending.failure_key == "billing.sync_failed"


def test_tenant_visible_error_with_retry_is_retried_and_keeps_its_key() -> None:
    state = make_run(attempt=1)
    deferral(state, raising(TenantVisibleError("billing.sync_failed", retry=True)))
    assert state.ending.outcome is Outcome.RETRYING
    assert state.ending.failure_key == "billing.sync_failed"


def test_an_unstorable_key_becomes_the_declared_one() -> None:
    state = make_run(
        tenant_visible_failure={"message_key": "billing.declared", "subject_fields": []}
    )
    deferral(state, raising(TenantVisibleError("x" * 500)))
    assert state.ending.outcome is Outcome.FAILED
    assert state.ending.failure_key == "billing.declared"


def test_an_unstorable_key_without_a_declared_one_becomes_the_fallback() -> None:
    state = make_run()
    deferral(state, raising(TenantVisibleError("")))
    assert state.ending.failure_key == FALLBACK_MESSAGE_KEY


def test_a_final_failure_shows_the_declared_tenant_visible_failure() -> None:
    state = make_run(
        attempt=3, tenant_visible_failure={"message_key": "billing.declared", "subject_fields": []}
    )
    deferral(state, raising(RuntimeError("x")))
    assert state.ending.outcome is Outcome.FAILED
    assert state.ending.failure_key == "billing.declared"


def test_a_retry_does_not_show_the_declared_failure_yet() -> None:
    state = make_run(
        attempt=1, tenant_visible_failure={"message_key": "billing.declared", "subject_fields": []}
    )
    deferral(state, raising(RuntimeError("x")))
    assert state.ending.outcome is Outcome.RETRYING
    assert state.ending.failure_key is None


# --- a swallowed guard violation -----------------------------------------------------------------


def test_a_swallowed_violation_fails_a_success() -> None:
    state = make_run(attempt=1, retries=5)

    def swallowing(state: RunState) -> None:
        state.watch.violations.append("UPDATE on public.shared_plan")
        state.ending.succeed("pretended fine")

    deferral(state, swallowing)
    assert state.ending.outcome is Outcome.FAILED  # a denial is never retried
    assert isinstance(state.ending.error, DatabaseAccessDenied)
    assert "swallowed" in str(state.ending.error)
    assert "UPDATE on public.shared_plan" in str(state.ending.error)
    assert state.ending.error.job_name == "unit.deferral_body"


def test_a_swallowed_violation_fails_a_deferral() -> None:
    state = make_run()

    def swallowing(state: RunState) -> None:
        state.watch.violations.append("DELETE on public.x")
        state.ending.defer(30, DeferralKind.JOB)

    deferral(state, swallowing)
    assert state.ending.outcome is Outcome.FAILED
    assert state.ending.reschedule is None
    assert isinstance(state.ending.error, DatabaseAccessDenied)


# --- deferral limits -----------------------------------------------------------------------------


def test_a_job_deferral_resumes_with_one_more_defer() -> None:
    state = make_run(defers=2, max_defers=5)
    deferral(state, deferring(45))
    ending = state.ending
    assert ending.outcome is Outcome.DEFERRED
    assert ending.reschedule is not None
    resumed, seconds = ending.reschedule
    assert seconds == 45
    assert resumed == state.envelope.deferred(by_gate=False)
    assert (resumed.defers, resumed.gate_defers, resumed.attempt) == (3, 0, 1)


def test_the_job_deferral_at_max_defers_gives_up() -> None:
    state = make_run(defers=5, max_defers=5)
    deferral(state, deferring(45))
    ending = state.ending
    assert ending.outcome is Outcome.FAILED
    assert ending.reschedule is None
    assert isinstance(ending.error, Unrecoverable)
    assert "max_defers=5" in str(ending.error)


def test_the_last_allowed_job_deferral_still_resumes() -> None:
    state = make_run(defers=4, max_defers=5)
    deferral(state, deferring(1))
    assert state.ending.outcome is Outcome.DEFERRED
    assert state.ending.reschedule is not None


def test_max_defers_zero_refuses_every_job_deferral() -> None:
    state = make_run(max_defers=0)
    deferral(state, deferring(1))
    assert state.ending.outcome is Outcome.FAILED


def test_gate_deferrals_have_no_cap() -> None:
    state = make_run(defers=0, gate_defers=10_000, max_defers=0)
    deferral(state, deferring(300, DeferralKind.GATE))
    ending = state.ending
    assert ending.outcome is Outcome.DEFERRED
    assert ending.reschedule is not None
    resumed, seconds = ending.reschedule
    assert seconds == 300
    assert (resumed.defers, resumed.gate_defers) == (0, 10_001)


# --- cancellation --------------------------------------------------------------------------------


def test_settle_without_a_request_changes_nothing() -> None:
    state = make_run()
    state.ending.fail(RuntimeError("x"))
    assert settle_cancellation(state) is False
    assert state.ending.outcome is Outcome.FAILED


def test_a_requested_cancellation_of_a_failing_run_cancels_instead_of_retrying() -> None:
    state = make_run(attempt=1)
    cancellation.mark(state.envelope.run_id, "alice")
    deferral(state, raising(RuntimeError("interrupted")))
    ending = state.ending
    assert ending.outcome is Outcome.CANCELLED
    assert ending.reschedule is None
    assert ending.failure_key is None
    assert isinstance(ending.error, JobCancelled)
    assert str(ending.error) == (
        "cancelled on request by alice (the attempt ended with RuntimeError)"
    )


def test_a_cancelled_run_never_shows_the_tenant_a_failure() -> None:
    state = make_run(
        attempt=3, tenant_visible_failure={"message_key": "billing.declared", "subject_fields": []}
    )
    cancellation.mark(state.envelope.run_id, "")
    deferral(state, raising(TenantVisibleError("billing.sync_failed")))
    assert state.ending.outcome is Outcome.CANCELLED
    assert state.ending.failure_key is None
    assert str(state.ending.error).startswith("cancelled on request (the attempt")


def test_a_requested_cancellation_of_a_deferral_is_not_resumed() -> None:
    state = make_run()
    cancellation.mark(state.envelope.run_id, "-")
    deferral(state, deferring(60))
    assert state.ending.outcome is Outcome.CANCELLED
    assert state.ending.reschedule is None
    assert str(state.ending.error) == "cancelled on request"


def test_success_wins_over_a_request_the_job_did_not_acknowledge() -> None:
    state = make_run()
    cancellation.mark(state.envelope.run_id, "alice")
    deferral(state, succeeding)
    assert state.ending.outcome is Outcome.SUCCEEDED
    assert state.ending.result == "done"


def test_an_acknowledged_cancellation_cancels_even_a_success() -> None:
    state = make_run()

    def acknowledged_then_returned(state: RunState) -> None:
        state.cancellation.acknowledge()
        state.ending.succeed("partial")

    deferral(state, acknowledged_then_returned)
    assert state.ending.outcome is Outcome.CANCELLED
    assert isinstance(state.ending.error, JobCancelled)


def test_the_jobs_own_job_cancelled_is_kept() -> None:
    state = make_run(attempt=1)
    cancellation.mark(state.envelope.run_id, "alice")
    own = JobCancelled("cancellation requested by alice")

    def acknowledging(state: RunState) -> None:
        state.cancellation.acknowledge()
        raise own

    deferral(state, acknowledging)
    assert state.ending.outcome is Outcome.CANCELLED
    assert state.ending.error is own
    assert state.ending.reschedule is None


def test_a_cancellation_of_another_run_does_not_apply() -> None:
    state = make_run(attempt=1)
    cancellation.mark(new_run_id(), "alice")
    deferral(state, raising(RuntimeError("x")))
    assert state.ending.outcome is Outcome.RETRYING
