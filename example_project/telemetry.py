"""OpenTelemetry SDK set-up of the example project (the library itself uses the API only).

``configure()`` is called by ``manage.py`` (runserver, rqworker, rqscheduler) before Django
starts; a WSGI/ASGI entry point would call it before ``get_wsgi_application()``. Exporters come
from the standard variables:

- ``OTEL_TRACES_EXPORTER``: ``console`` (default for the example), ``otlp``, ``none``, or a
  comma-separated list. ``none`` silences tracing output.
- ``OTEL_METRICS_EXPORTER``: ``none`` (default: a metrics dump every minute drowns the demo's
  console), ``console``, ``otlp``.
- ``OTEL_SDK_DISABLED=true``: no SDK at all. ``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``,
  ``OTEL_BSP_*`` and ``OTEL_EXPORTER_OTLP_*`` work as the SDK documents them.
- ``KUMIKO_OTEL_SPAN_FILE=/path/spans.jsonl`` (ours): also append every span, one JSON
  object per line, to that file. The test suite reads it back from worker processes, and it
  is how docs/observability.md's trace was captured.

Settings modules that build on this one (the test suite's ``tests.settings``) get no exporter
unless one of these variables asks for it, so CI logs carry no span dumps.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    ConsoleMetricExporter,
    MetricExporter,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SpanExporter,
    SpanExportResult,
)

EXAMPLE_SETTINGS = "example_project.settings"
SPAN_FILE_VARIABLE = "KUMIKO_OTEL_SPAN_FILE"
_TRACE_EXPORTERS = ("console", "otlp", "none")
_METRIC_EXPORTERS = ("console", "otlp", "none")

_configured = False
_lock = threading.Lock()


def configure() -> None:
    """Install tracer and meter providers for this process, once, from the environment."""
    global _configured
    with _lock:
        if _configured:
            return
        _configured = True
        if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
            return
        own_settings = os.environ.get("DJANGO_SETTINGS_MODULE", EXAMPLE_SETTINGS)
        is_example = own_settings == EXAMPLE_SETTINGS
        traces = _exporter_names(
            "OTEL_TRACES_EXPORTER", "console" if is_example else "none", _TRACE_EXPORTERS
        )
        metric_names = _exporter_names("OTEL_METRICS_EXPORTER", "none", _METRIC_EXPORTERS)
        span_file = os.environ.get(SPAN_FILE_VARIABLE, "")
        if traces or span_file:
            _install_tracing(traces, span_file)
        if metric_names:
            _install_metrics(metric_names)


def _exporter_names(variable: str, default: str, known: Sequence[str]) -> list[str]:
    raw = os.environ.get(variable, "").strip() or default
    names = [n.strip().lower() for n in raw.split(",") if n.strip()]
    unknown = sorted(set(names) - set(known))
    if unknown:
        raise ValueError(f"{variable}={raw!r}: unknown exporter(s) {unknown}; use {known}.")
    return [n for n in names if n != "none"]


def _resource() -> Resource:
    # OTEL_SERVICE_NAME, when set, wins: Resource.create would let an explicit value override it.
    if os.environ.get("OTEL_SERVICE_NAME"):
        return Resource.create()
    return Resource.create({"service.name": "kumiko-example"})


def _install_tracing(names: Sequence[str], span_file: str) -> None:
    provider = TracerProvider(resource=_resource())
    exporters = [_span_exporter(name) for name in names]
    if span_file:
        exporters.append(JsonLinesSpanExporter(span_file))
    for exporter in exporters:
        # Batched, also for the file: the forking worker's flush before the work horse exits
        # is what gets these spans out, and the tests rely on that.
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)

    from opentelemetry.instrumentation.django import DjangoInstrumentor

    # Adds its middleware to settings.MIDDLEWARE: one SERVER span per request, the parent of
    # every "send <queue>" span that request's enqueues create.
    DjangoInstrumentor().instrument(tracer_provider=provider)


def _span_exporter(name: str) -> SpanExporter:
    if name == "console":
        return ConsoleSpanExporter()
    try:
        if os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf").startswith("grpc"):
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        else:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
                OTLPSpanExporter,
            )
    except ImportError as exc:
        raise RuntimeError(
            "OTEL_TRACES_EXPORTER=otlp needs the exporter: pip install opentelemetry-exporter-otlp"
        ) from exc
    return OTLPSpanExporter()


def _install_metrics(names: Sequence[str]) -> None:
    readers = [PeriodicExportingMetricReader(_metric_exporter(name)) for name in names]
    metrics.set_meter_provider(MeterProvider(resource=_resource(), metric_readers=readers))


def _metric_exporter(name: str) -> MetricExporter:
    if name == "console":
        return ConsoleMetricExporter()
    try:
        if os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf").startswith("grpc"):
            from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
        else:
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
                OTLPMetricExporter,
            )
    except ImportError as exc:
        raise RuntimeError(
            "OTEL_METRICS_EXPORTER=otlp needs the exporter: pip install opentelemetry-exporter-otlp"
        ) from exc
    return OTLPMetricExporter()


class JsonLinesSpanExporter(SpanExporter):
    """Appends spans to a file, one compact JSON document per line.

    One ``write`` per batch on a file opened for appending: several processes (a worker and
    its work horses) can share the file without interleaving their lines.
    """

    def __init__(self, path: str) -> None:
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = "".join(span.to_json(indent=None) + "\n" for span in spans)
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(lines)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None
