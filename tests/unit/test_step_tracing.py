"""Unit tests for the tracing step (run/steps/tracing.py): no database, no exporter process.

``telemetry.tracer`` is replaced by a tracer of a private SDK provider that keeps finished spans
in memory (the process's global provider is left alone). Pinned: one consumer span per attempt,
continuing the enqueue's trace; its attributes (what ran, for whom, from which message); its
status and ``exception`` event per outcome (errors only for failed and retrying attempts, a final
attempt marked, a drop's reason, an escaping exception recorded as escaped and re-raised); the
error text is the db_guard step's rendering, scrubbed and truncated, never ``str()`` again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from kumiko_jobs import telemetry
from kumiko_jobs.core.outcome import DeferralKind
from kumiko_jobs.run.rendered_errors import RenderedError
from kumiko_jobs.run.state import RunState
from kumiko_jobs.run.steps.tracing import MESSAGE_LIMIT, STACKTRACE_LIMIT, tracing
from tests.unit.states import make_state

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"


@pytest.fixture
def exporter(monkeypatch: pytest.MonkeyPatch) -> InMemorySpanExporter:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("kumiko_jobs")
    monkeypatch.setattr(telemetry, "tracer", lambda: tracer)
    return exporter


def one_span(exporter: InMemorySpanExporter) -> ReadableSpan:
    [span] = exporter.get_finished_spans()
    return span


def ending(end: Callable[[RunState], Any]) -> Callable[[RunState], None]:
    def rest(state: RunState) -> None:
        end(state)

    return rest


def exception_events(span: ReadableSpan) -> list[dict[str, Any]]:
    return [dict(e.attributes or {}) for e in span.events if e.name == "exception"]


# --- the span and its attributes -----------------------------------------------------------------


def test_one_consumer_span_continues_the_enqueues_trace(exporter: InMemorySpanExporter) -> None:
    traceparent = f"00-{TRACE_ID}-{PARENT_ID}-01"
    state = make_state(envelope_fields={"trace": {"traceparent": traceparent}})
    tracing(state, ending(lambda s: s.ending.succeed()))
    span = one_span(exporter)
    assert span.name == "job.execute"
    assert span.kind is SpanKind.CONSUMER
    assert span.parent is not None
    assert format(span.context.trace_id, "032x") == TRACE_ID
    assert format(span.parent.span_id, "016x") == PARENT_ID


def test_without_a_trace_in_the_message_the_span_starts_one(
    exporter: InMemorySpanExporter,
) -> None:
    tracing(make_state(), ending(lambda s: s.ending.succeed()))
    assert one_span(exporter).parent is None


def test_the_span_says_what_ran_for_whom_from_which_message(
    exporter: InMemorySpanExporter,
) -> None:
    state = make_state(
        "t1",
        attempt=2,
        defers=1,
        gate_defers=2,
        rq_job_id="kj-delivered",
        queue="mail",
        envelope_fields={
            "correlation_id": "req-7",
            "trigger": "invoice.paid",
            "parent_run_id": "a" * 32,
        },
    )
    tracing(state, ending(lambda s: s.ending.succeed()))
    attributes = dict(one_span(exporter).attributes or {})
    assert attributes == {
        "job.name": "unit.body",
        "job.id": state.envelope.run_id,
        "job.attempt": 2,
        "kumiko.job.run_in": "mail",
        "messaging.system": "rq",
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.destination.name": "mail",
        "messaging.message.id": "kj-delivered",
        "kumiko.tenant_id": "t1",
        "kumiko.correlation_id": "req-7",
        "kumiko.job.trigger": "invoice.paid",
        "kumiko.job.parent_id": "a" * 32,
        "kumiko.job.defers": 3,
        "kumiko.job.outcome": "succeeded",
    }


def test_optional_attributes_are_left_out_and_the_message_id_comes_from_the_envelope(
    exporter: InMemorySpanExporter,
) -> None:
    state = make_state(None, kwargs={}, system=True)
    tracing(state, ending(lambda s: s.ending.succeed()))
    attributes = dict(one_span(exporter).attributes or {})
    for absent in (
        "kumiko.tenant_id",
        "kumiko.correlation_id",
        "kumiko.job.trigger",
        "kumiko.job.parent_id",
        "kumiko.job.defers",
    ):
        assert absent not in attributes, absent
    assert attributes["messaging.message.id"] == state.envelope.rq_job_id


# --- status per outcome --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("end", "outcome"),
    [
        (lambda s: s.ending.succeed(1), "succeeded"),
        (lambda s: s.ending.defer(30, DeferralKind.GATE), "deferred"),
        (lambda s: s.ending.cancel(None), "cancelled"),
    ],
    ids=["succeeded", "deferred", "cancelled"],
)
def test_an_attempt_that_did_not_fail_has_no_error(
    exporter: InMemorySpanExporter, end: Callable[[RunState], Any], outcome: str
) -> None:
    tracing(make_state(), ending(end))
    span = one_span(exporter)
    assert span.attributes is not None
    assert span.attributes["kumiko.job.outcome"] == outcome
    assert "kumiko.job.final_attempt" not in span.attributes
    assert span.status.status_code is StatusCode.UNSET
    assert exception_events(span) == []


def test_a_final_failure_is_an_error_with_its_exception(exporter: InMemorySpanExporter) -> None:
    error = ValueError("invoice 4 is broken")

    def fail(state: RunState) -> None:
        state.ending.fail(error, traceback="Traceback (most recent call last):\n  boom\n")

    tracing(make_state(), ending(fail))
    span = one_span(exporter)
    assert span.attributes is not None
    assert span.attributes["kumiko.job.outcome"] == "failed"
    assert span.attributes["kumiko.job.final_attempt"] is True
    assert span.status.status_code is StatusCode.ERROR
    assert span.status.description == "ValueError: invoice 4 is broken"
    assert exception_events(span) == [
        {
            "exception.type": "ValueError",
            "exception.message": "invoice 4 is broken",
            "exception.stacktrace": "Traceback (most recent call last):\n  boom\n",
            "exception.escaped": False,
        }
    ]


def test_a_retry_is_an_error_that_is_not_final(exporter: InMemorySpanExporter) -> None:
    def retry(state: RunState) -> None:
        state.ending.retry(RuntimeError("down"), "tb", state.envelope.next_attempt(), 5)

    tracing(make_state(), ending(retry))
    span = one_span(exporter)
    assert span.attributes is not None
    assert span.attributes["kumiko.job.final_attempt"] is False
    assert span.status.status_code is StatusCode.ERROR
    assert [e["exception.type"] for e in exception_events(span)] == ["RuntimeError"]


def test_a_failure_without_an_exception_is_still_an_error(exporter: InMemorySpanExporter) -> None:
    tracing(make_state(), ending(lambda s: s.ending.fail()))
    span = one_span(exporter)
    assert span.status.status_code is StatusCode.ERROR
    assert span.status.description == "failed"
    assert exception_events(span) == []


def test_an_attempt_no_step_decided_is_an_error_span(exporter: InMemorySpanExporter) -> None:
    tracing(make_state(), ending(lambda s: None))
    span = one_span(exporter)
    assert span.attributes is not None
    assert span.attributes["kumiko.job.outcome"] == "failed"
    assert span.status.status_code is StatusCode.ERROR


def test_a_drop_carries_its_reason(exporter: InMemorySpanExporter) -> None:
    tracing(make_state(), ending(lambda s: s.ending.drop("duplicate delivery")))
    span = one_span(exporter)
    assert span.attributes is not None
    assert span.attributes["kumiko.job.outcome"] == "dropped"
    assert span.attributes["kumiko.job.drop_reason"] == "duplicate delivery"
    assert span.status.status_code is StatusCode.UNSET


def test_an_escaping_exception_is_recorded_as_escaped_and_passes_up(
    exporter: InMemorySpanExporter,
) -> None:
    def interrupted(state: RunState) -> None:
        raise KeyboardInterrupt("cold shutdown")

    with pytest.raises(KeyboardInterrupt):
        tracing(make_state(), interrupted)
    span = one_span(exporter)
    [event] = exception_events(span)
    assert event["exception.type"] == "KeyboardInterrupt"
    assert event["exception.escaped"] is True
    assert span.status.status_code is StatusCode.ERROR
    assert span.attributes is not None
    assert "kumiko.job.outcome" not in span.attributes


# --- the error's text ----------------------------------------------------------------------------


class Refusing(Exception):
    """An exception whose ``__str__`` must not run outside the guard (it would run SQL)."""

    def __str__(self) -> str:
        raise AssertionError("str() called outside the run's tenant and guard")


def test_the_error_text_is_the_db_guard_steps_rendering(exporter: InMemorySpanExporter) -> None:
    error = Refusing()
    rendered = RenderedError(error, "Refusing", "rendered inside the tenant", "Traceback: t\n")

    def fail(state: RunState) -> None:
        state.ending.fail(error)
        state.ending.note_rendered(rendered)

    tracing(make_state(), ending(fail))
    [event] = exception_events(one_span(exporter))
    assert event["exception.message"] == "rendered inside the tenant"
    assert event["exception.type"] == "Refusing"
    assert event["exception.stacktrace"] == "Traceback: t\n"


def test_the_error_text_is_scrubbed_and_truncated(exporter: InMemorySpanExporter) -> None:
    long_traceback = "".join(f"  frame {i}\n" for i in range(5000))
    error = ValueError("login failed: password=hunter2 " + "x" * 5000)

    def fail(state: RunState) -> None:
        state.ending.fail(error, traceback=long_traceback + "ValueError: password=hunter2\n")

    tracing(make_state(), ending(fail))
    span = one_span(exporter)
    [event] = exception_events(span)
    message, stacktrace = str(event["exception.message"]), str(event["exception.stacktrace"])
    assert "hunter2" not in message and "password=***" in message
    assert len(message) <= MESSAGE_LIMIT
    assert "hunter2" not in stacktrace
    assert stacktrace.startswith("[... ")  # the end of the stack trace, from a line start
    assert stacktrace.endswith("ValueError: password=***\n")
    assert len(stacktrace) <= STACKTRACE_LIMIT
    assert span.status.description is not None
    assert "hunter2" not in span.status.description
    assert len(span.status.description) <= 500


def test_an_unsampled_span_costs_no_attributes(monkeypatch: pytest.MonkeyPatch) -> None:
    """A non-recording span (no SDK, or not sampled): the step records nothing and the run
    goes on (the no-op tracer of the API)."""
    monkeypatch.setattr(telemetry, "tracer", lambda: trace.NoOpTracer())
    state = make_state()
    tracing(state, ending(lambda s: s.ending.fail(ValueError("x"))))
    assert state.ending.error is not None
