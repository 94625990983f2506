"""OpenTelemetry traces and metrics of kumiko_jobs, through the API only.

The library never installs an SDK: without one, every call here is a no-op. The project
chooses providers and exporters (see docs/observability.md and example_project/telemetry.py).

Traces follow OpenTelemetry's messaging conventions: a PRODUCER span ``send <queue>`` around
each enqueue, whose W3C trace context (``traceparent``/``tracestate``) travels in the signed
envelope, and a CONSUMER span ``job.execute`` per attempt (steps/tracing.py) whose parent is
that context, so every attempt of a run is a child of the enqueue that created it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import metrics, trace
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.trace import Link, SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from .. import transport
from ..core import project_settings
from .guarded import GuardedTracer

if TYPE_CHECKING:
    from ..core.envelope import Envelope

logger = logging.getLogger("kumiko_jobs.telemetry")

SCOPE = "kumiko_jobs"
CONSUMER_SPAN = "job.execute"
MESSAGING_SYSTEM = "rq"
# Runs these triggers start are a unit of work of their own, not part of whatever scheduled
# them: they get a new trace, linked to the scheduler's (or fan-out run's) span when there is
# one. A per-tenant fan-out would otherwise put every tenant's run of every tick in one trace.
NEW_TRACE_TRIGGERS = ("cron", "boot", "fanout")
# Job durations range from milliseconds to an hour; the SDK's default buckets stop at 10 s.
DURATION_BUCKETS_MS = (
    5,
    10,
    25,
    50,
    100,
    250,
    500,
    1000,
    2500,
    5000,
    10_000,
    30_000,
    60_000,
    300_000,
    900_000,
    3_600_000,
)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("kumiko-jobs")
    except PackageNotFoundError:  # running from a checkout that is not installed
        return ""


# Only W3C trace context crosses the queue, whatever the global propagator is: the envelope
# is signed and size-limited, and JobRun.trace_id is read from ``traceparent``.
_propagator = TraceContextTextMapPropagator()
# Guarded: a span processor that raises must not fail an enqueue or a run (guarded.py).
_tracer = GuardedTracer(trace.get_tracer(SCOPE, _version()))
_meter = metrics.get_meter(SCOPE, _version())


# --- traces ---------------------------------------------------------------------------------


def starts_new_trace(trigger: str | None) -> bool:
    """Whether a run with this trigger (cron, boot, fan-out) starts a trace of its own instead of
    joining its scheduler's, which would otherwise put every tenant's run of every tick in one
    trace.
    """
    return bool(trigger) and str(trigger).startswith(NEW_TRACE_TRIGGERS)


@contextmanager
def producer_span(
    queue: str, job_name: str, trigger: str | None = None
) -> Iterator[dict[str, str]]:
    """The span around one enqueue; yields the trace context to put in the envelope.

    The push itself happens later, when the caller's transaction commits; the span covers
    building and recording the message, which is where a failure would surface.
    """
    parent: otel_context.Context | None = None
    links: list[Link] = []
    if starts_new_trace(trigger):
        scheduler = trace.get_current_span().get_span_context()
        if scheduler.is_valid:
            links.append(Link(scheduler, {"kumiko.link": "scheduled_by"}))
        parent = otel_context.Context()  # an empty context: the span becomes a trace root
    attributes: dict[str, Any] = {
        "messaging.system": MESSAGING_SYSTEM,
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
        "messaging.destination.name": queue,
        "job.name": job_name,
        "kumiko.job.run_in": queue,
    }
    if trigger:
        attributes["kumiko.job.trigger"] = trigger
    with _tracer.start_as_current_span(
        f"send {queue}", context=parent, kind=SpanKind.PRODUCER, attributes=attributes, links=links
    ):
        carrier: dict[str, str] = {}
        _propagator.inject(carrier)
        yield carrier


def describe_message(envelope: Envelope) -> None:
    """Name the message on the current producer span, once the envelope exists."""
    span = trace.get_current_span()
    if not span.is_recording():
        return
    span.set_attribute("messaging.message.id", envelope.rq_job_id)
    span.set_attribute("job.id", envelope.run_id)
    if envelope.schema:
        span.set_attribute("kumiko.tenant_id", envelope.schema)
    if envelope.correlation_id:
        span.set_attribute("kumiko.correlation_id", envelope.correlation_id)
    if envelope.parent_run_id:
        span.set_attribute("kumiko.job.parent_id", envelope.parent_run_id)


def extract(envelope: Envelope) -> otel_context.Context:
    """The enqueue's context from the envelope (an empty one when it carries none)."""
    return _propagator.extract(carrier=envelope.trace, context=otel_context.Context())


def tracer() -> GuardedTracer:
    """The tracer kumiko's spans are made with (this package's instrumentation scope)."""
    return _tracer


# --- metrics --------------------------------------------------------------------------------
# Attributes stay bounded: job names (the registry), outcomes, grants and queue names. Tenant
# ids are deliberately absent: a SaaS has an unbounded number of tenants, and per-tenant
# questions are answered by JobRun rows, spans (kumiko.tenant_id) and log lines.

_runs = _meter.create_counter(
    "kumiko.job.runs",
    unit="{attempt}",
    description="Finished attempts by job and outcome (succeeded, failed, retrying, deferred, "
    "dropped, cancelled).",
)
_duration = _meter.create_histogram(
    "kumiko.job.duration",
    unit="ms",
    description="Duration of an attempt, by job and outcome.",
    explicit_bucket_boundaries_advisory=DURATION_BUCKETS_MS,
)
_deferrals = _meter.create_counter(
    "kumiko.job.deferrals",
    unit="{deferral}",
    description="Attempts that ended deferred, by job and by whom (job or gate).",
)
_escape_hatch_uses = _meter.create_counter(
    "kumiko.escape_hatch.uses",
    unit="{use}",
    description="Escape-hatch blocks entered, by job and grant (every use, not deduplicated).",
)

# job name -> unix time of its last success in this process, for the last_success gauge.
_last_success: dict[str, float] = {}


def _observe_last_success(options: CallbackOptions) -> Iterable[Observation]:
    return [Observation(at, {"job": job}) for job, at in list(_last_success.items())]


def _observe_queue_depth(options: CallbackOptions) -> Iterable[Observation]:
    observations = []
    for queue in project_settings.rq_queue_names():
        try:
            observations.append(Observation(transport.queue_length(queue), {"queue": queue}))
        except Exception:  # Redis away: report nothing rather than fail the whole collection
            logger.debug("could not read the length of queue %s", queue, exc_info=True)
    return observations


_meter.create_observable_gauge(
    "kumiko.job.last_success",
    callbacks=[_observe_last_success],
    unit="s",
    description="Unix time of the job's last successful attempt seen by this process.",
)
_meter.create_observable_gauge(
    "kumiko.queue.depth",
    callbacks=[_observe_queue_depth],
    unit="{message}",
    description="Messages waiting in the RQ queue (not counting scheduled ones).",
)


def record_attempt(job: str, outcome: str, duration_ms: float, *, deferred_by: str) -> None:
    """Count one finished attempt (run.report.run_finished; its caller catches errors).

    ``deferred_by`` ("job" or "gate") is recorded for a deferred attempt only.
    """
    attributes = {"job": job, "outcome": outcome}
    _runs.add(1, attributes)
    _duration.record(duration_ms, attributes)
    if outcome == "succeeded":
        _last_success[job] = time.time()
    elif outcome == "deferred":
        _deferrals.add(1, {"job": job, "by": deferred_by})


def escape_hatch_used(job: str, grant: str) -> None:
    """Count one use of ``grant`` by ``job``; a telemetry failure is logged, never raised into the
    run.
    """
    try:
        _escape_hatch_uses.add(1, {"job": job, "grant": grant})
    except Exception:
        logger.warning("could not count an escape-hatch use", exc_info=True)
