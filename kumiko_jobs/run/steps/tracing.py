"""The consumer span ``job.execute``: one per attempt, outermost, so it covers the history writes.

Its parent is the trace context the enqueue put in the envelope. The pipeline records errors
in ``state`` instead of raising, so the span's status comes from the outcome; an exception
that does escape (a cold shutdown, a timeout) is recorded too and re-raised.
"""

from __future__ import annotations

from typing import Any

from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from ... import telemetry
from ...core.outcome import Outcome
from ...log_context import scrub
from ..pipeline import Next
from ..rendered_errors import render_error
from ..state import Ending, RunState

_FAILED = (Outcome.FAILED, Outcome.RETRYING)


def tracing(state: RunState, call_next: Next) -> None:
    """Wrap the attempt in its ``job.execute`` consumer span, continuing the enqueue's trace, with
    the span's status taken from the outcome and any escaping exception recorded scrubbed.
    """
    with telemetry.tracer().start_as_current_span(
        telemetry.CONSUMER_SPAN,
        context=telemetry.extract(state.envelope),
        kind=SpanKind.CONSUMER,
        attributes=_attributes(state),
        # Recorded below with the message scrubbed: exception text may carry secrets.
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        try:
            call_next(state)
        except BaseException as exc:
            _record_error(span, state.ending, exc, escaped=True)
            raise
        if not span.is_recording():
            return
        # An attempt no step decided is recorded as failed (records step): the span says the same.
        outcome = state.ending.outcome or Outcome.FAILED
        span.set_attribute("kumiko.job.outcome", str(outcome))
        if outcome in _FAILED:
            span.set_attribute("kumiko.job.final_attempt", outcome is Outcome.FAILED)
            if state.ending.error is not None:
                _record_error(span, state.ending, state.ending.error, escaped=False)
            else:
                span.set_status(Status(StatusCode.ERROR, outcome))
        elif outcome is Outcome.DROPPED and state.ending.drop_reason:
            span.set_attribute("kumiko.job.drop_reason", state.ending.drop_reason)


def _attributes(state: RunState) -> dict[str, Any]:
    env = state.envelope
    queue = state.delivery.queue
    attributes: dict[str, Any] = {
        "job.name": env.job,
        "job.id": env.run_id,
        "job.attempt": env.attempt,
        "kumiko.job.run_in": queue,
        "messaging.system": telemetry.MESSAGING_SYSTEM,
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.destination.name": queue,
        "messaging.message.id": state.delivery.rq_job_id or env.rq_job_id,
    }
    if env.schema:
        attributes["kumiko.tenant_id"] = env.schema
    if env.correlation_id:
        attributes["kumiko.correlation_id"] = env.correlation_id
    if env.trigger:
        attributes["kumiko.job.trigger"] = env.trigger
    if env.parent_run_id:
        attributes["kumiko.job.parent_id"] = env.parent_run_id
    if env.defers or env.gate_defers:
        attributes["kumiko.job.defers"] = env.defers + env.gate_defers
    return attributes


# What of the error text reaches the span: its message like the failure log line, the end of
# its stack trace (where the exception and the innermost frames are).
MESSAGE_LIMIT = 1000
STACKTRACE_LIMIT = 16_384


def _record_error(span: Span, ending: Ending, error: BaseException, *, escaped: bool) -> None:
    """The ``exception`` event, built here from the error as the db_guard step rendered it.

    The SDK's ``record_exception`` would call ``str(error)`` and format the traceback itself:
    outside the run's tenant and the guard (an exception's ``__str__`` may run SQL), unscrubbed
    and untruncated. Everything is truncated before it is scrubbed, so this stays cheap even
    when a job timed out (RQ's alarm is spent) with megabytes of exception text.
    """
    if not span.is_recording():
        return
    rendered = ending.rendered_error
    if rendered is None or rendered.error is not error:
        rendered = render_error(error)  # not the job's: one of kumiko's own, or an interruption
    message = scrub(rendered.message, limit=MESSAGE_LIMIT)
    stacktrace = (ending.error_traceback if ending.error is error else "") or rendered.traceback
    span.add_event(
        "exception",
        {
            "exception.type": rendered.type_name,
            "exception.message": message,
            "exception.stacktrace": scrub(
                _tail(stacktrace, STACKTRACE_LIMIT), limit=STACKTRACE_LIMIT
            ),
            "exception.escaped": escaped,
        },
    )
    span.set_status(Status(StatusCode.ERROR, f"{rendered.type_name}: {message}"[:500]))


def _tail(text: str, limit: int) -> str:
    """At most ``limit`` characters: the end of ``text`` from a line start (no half token
    survives), after a line that says how much was left out. The line counts against the limit:
    ``scrub`` keeps the first ``limit`` characters, and would cut the end, where the exception is.
    """
    if len(text) <= limit:
        return text
    room = limit - len(f"[... {len(text)} characters before]\n")
    tail = text[-room:]
    newline = tail.find("\n")
    tail = tail[newline + 1 :] if newline >= 0 else ""
    return f"[... {len(text) - len(tail)} characters before]\n{tail}"
