"""Traces, metrics, correlation and failure logs, checked with the SDK's in-memory exporters.

The OpenTelemetry globals can be set once per process, so one session fixture installs an SDK
tracer provider (in-memory span exporter) and meter provider (in-memory reader) and the Django
instrumentation; each test clears the spans. Metrics are cumulative for the whole session, so
the tests compare snapshots taken before and after their runs.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django_tenants.utils import schema_context
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from kumiko_jobs import log_context
from kumiko_jobs.core.envelope import Envelope
from kumiko_jobs.definition.registry import registry
from kumiko_jobs.enqueueing.submit import submit
from kumiko_jobs.models import JobRun, RunStatus
from tests.conftest import ROOT, start_rqworker, work
from tests.integration.test_admin import client_for, make_user
from tests.testapp import jobs

pytestmark = pytest.mark.usefixtures("live_db")

Key = tuple[str, frozenset[tuple[str, Any]]]


@dataclass
class Telemetry:
    exporter: InMemorySpanExporter
    reader: InMemoryMetricReader

    def spans(self, name: str | None = None) -> list[ReadableSpan]:
        found = self.exporter.get_finished_spans()
        return [s for s in found if name is None or s.name == name]

    def points(self) -> dict[Key, Any]:
        """Every data point of kumiko's metrics, by (metric name, attributes)."""
        data = self.reader.get_metrics_data()
        out: dict[Key, Any] = {}
        for resource_metrics in data.resource_metrics if data else ():
            for scope_metrics in resource_metrics.scope_metrics:
                if scope_metrics.scope.name != "kumiko_jobs":
                    continue
                for metric in scope_metrics.metrics:
                    for point in metric.data.data_points:
                        out[(metric.name, frozenset(point.attributes.items()))] = point
        return out


@pytest.fixture(scope="session")
def otel() -> Iterator[Telemetry]:
    from opentelemetry.instrumentation.django import DjangoInstrumentor

    exporter = InMemorySpanExporter()
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    instrumentor = DjangoInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    yield Telemetry(exporter, reader)
    instrumentor.uninstrument()


@pytest.fixture
def telemetry(otel: Telemetry) -> Telemetry:
    otel.exporter.clear()
    return otel


def _one(spans: list[ReadableSpan]) -> ReadableSpan:
    assert len(spans) == 1, [s.name for s in spans]
    return spans[0]


def _hex(value: int, width: int) -> str:
    return format(value, f"0{width}x")


def _attempt(span: ReadableSpan) -> int:
    return int(span.attributes["job.attempt"])  # type: ignore[index,arg-type]


# --- traces -------------------------------------------------------------------------------


def test_request_trace_continues_in_the_worker(tenants, telemetry, caplog):
    from example_project.billing.models import Invoice

    with schema_context("t1"):
        invoice = Invoice.objects.create(number="INV-OBS-1", amount="42.00")
    caplog.set_level(logging.INFO, logger="kumiko_jobs")
    caplog.handler.addFilter(log_context.RunContextFilter())

    # The example's sync view takes POSTs from signed-in users only.
    client = client_for("t1.localhost", "t1", make_user("t1", "obs-clerk"))
    response = client.post(f"/invoices/{invoice.pk}/sync/", HTTP_X_REQUEST_ID="req-obs-0001")
    assert response.status_code == 200, response.content
    assert response["X-Request-ID"] == "req-obs-0001"
    run_id = response.json()["run_id"]
    work()

    run = JobRun.objects.get(pk=run_id)
    assert run.status == RunStatus.SUCCEEDED
    assert run.correlation_id == "req-obs-0001"

    server = _one([s for s in telemetry.spans() if s.kind == SpanKind.SERVER])
    producer = _one(telemetry.spans("send default"))
    consumer = _one(telemetry.spans("job.execute"))
    trace_id = server.context.trace_id
    assert producer.context.trace_id == consumer.context.trace_id == trace_id
    assert producer.kind == SpanKind.PRODUCER and consumer.kind == SpanKind.CONSUMER
    assert producer.parent is not None and producer.parent.span_id == server.context.span_id
    assert consumer.parent is not None and consumer.parent.span_id == producer.context.span_id
    assert run.trace_id == _hex(trace_id, 32)

    assert dict(consumer.attributes or {}) == {
        "job.name": "billing.sync_invoice",
        "job.id": run_id,
        "job.attempt": 1,
        "kumiko.tenant_id": "t1",
        "kumiko.job.run_in": "default",
        "kumiko.correlation_id": "req-obs-0001",
        "kumiko.job.outcome": "succeeded",
        "messaging.system": "rq",
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.destination.name": "default",
        "messaging.message.id": run.rq_job_id,
    }
    assert consumer.status.status_code == StatusCode.UNSET
    producer_attributes = producer.attributes or {}
    assert producer_attributes["messaging.message.id"] == run.rq_job_id
    assert producer_attributes["messaging.operation.type"] == "send"
    assert producer_attributes["job.id"] == run_id
    assert producer_attributes["kumiko.tenant_id"] == "t1"

    # ctx.log lines carry the run's context through the filter.
    synced = [r for r in caplog.records if r.name == "kumiko_jobs.job" and "synced" in r.message]
    assert len(synced) == 1
    record = synced[0]
    assert (record.job, record.run_id, record.tenant, record.attempt) == (  # type: ignore[attr-defined]
        "billing.sync_invoice",
        run_id,
        "t1",
        1,
    )
    assert record.correlation_id == "req-obs-0001"  # type: ignore[attr-defined]
    assert record.trace_id == _hex(trace_id, 32)  # type: ignore[attr-defined]
    assert record.span_id == _hex(consumer.context.span_id, 16)  # type: ignore[attr-defined]


def test_retries_are_one_span_per_attempt_under_the_same_enqueue(tenants, telemetry, caplog):
    caplog.set_level(logging.WARNING, logger="kumiko_jobs.runs")
    handle = jobs.flaky.enqueue(tenant="t1", tag="retry", fail_times=2)
    work(scheduler_rounds=2)
    assert JobRun.objects.get(pk=handle.run_id).status == RunStatus.SUCCEEDED

    producer = _one(telemetry.spans("send default"))
    attempts = sorted(telemetry.spans("job.execute"), key=_attempt)
    assert [_attempt(s) for s in attempts] == [1, 2, 3]
    for span in attempts:
        assert span.context.trace_id == producer.context.trace_id
        assert span.parent is not None and span.parent.span_id == producer.context.span_id
        assert (span.attributes or {})["job.id"] == handle.run_id
    for number, span in enumerate(attempts[:2], start=1):
        assert span.status.status_code == StatusCode.ERROR
        assert (span.attributes or {})["kumiko.job.outcome"] == "retrying"
        assert (span.attributes or {})["kumiko.job.final_attempt"] is False
        event = _one([e for e in span.events if e.name == "exception"])
        assert (event.attributes or {})["exception.type"] == "RuntimeError"
        assert (event.attributes or {})["exception.message"] == f"boom on attempt {number}"
    assert attempts[2].status.status_code == StatusCode.UNSET
    assert (attempts[2].attributes or {})["kumiko.job.outcome"] == "succeeded"

    lines = [r for r in caplog.records if r.name == "kumiko_jobs.runs"]
    assert [(r.levelno, r.kumiko_attempt, r.kumiko_final) for r in lines] == [  # type: ignore[attr-defined]
        (logging.WARNING, 1, False),
        (logging.WARNING, 2, False),
    ]
    assert "attempt=1/3 final=false error_type=RuntimeError" in lines[0].getMessage()


def test_a_relayed_message_continues_the_trace_of_its_enqueue(tenants, telemetry):
    from kumiko_jobs import transport
    from kumiko_jobs.worker.relay import relay_pending

    handle = jobs.probe.enqueue(tenant="t2", tag="relayed")
    transport.connection_for("default").flushdb()  # the message is lost; the row is not
    assert relay_pending(grace=0).pushed == 1  # rebuilt from the row
    work()
    assert JobRun.objects.get(pk=handle.run_id).status == RunStatus.SUCCEEDED
    producer = _one(telemetry.spans("send default"))
    consumer = _one(telemetry.spans("job.execute"))
    assert consumer.context.trace_id == producer.context.trace_id
    assert consumer.parent is not None and consumer.parent.span_id == producer.context.span_id


def test_followup_is_a_child_of_the_parent_run(tenants, telemetry):
    parent = jobs.with_followup.enqueue(tenant="t1", tag="p")
    work()
    work()
    child = JobRun.objects.get(parent_run_id=parent.run_id)
    assert child.status == RunStatus.SUCCEEDED

    consumers = {(s.attributes or {})["job.id"]: s for s in telemetry.spans("job.execute")}
    parent_span, child_span = consumers[parent.run_id], consumers[child.run_id.hex]
    child_producer = _one(
        [s for s in telemetry.spans("send default") if s.parent is not None]  # the root is ours
    )
    assert child_producer.parent is not None
    assert child_producer.parent.span_id == parent_span.context.span_id
    assert child_span.parent is not None
    assert child_span.parent.span_id == child_producer.context.span_id
    assert child_span.context.trace_id == parent_span.context.trace_id
    assert child.trace_id == JobRun.objects.get(pk=parent.run_id).trace_id
    assert (child_span.attributes or {})["kumiko.job.parent_id"] == parent.run_id


@pytest.mark.parametrize("trigger", ["cron:testapp.probe", "boot:testapp.probe", "fanout"])
def test_cron_boot_and_fanout_runs_start_a_new_trace_linked_to_the_scheduler(
    tenants, telemetry, trigger
):
    definition = registry.get("testapp.probe")
    tracer = trace.get_tracer("tests.scheduler")
    with tracer.start_as_current_span("scheduler tick") as tick:
        cron = submit(definition, "t1", {"tag": "cron"}, delay=0.0, trigger=trigger)
        plain = submit(definition, "t1", {"tag": "plain"}, delay=0.0)
    work()

    tick_context = tick.get_span_context()
    producers = {(s.attributes or {})["job.id"]: s for s in telemetry.spans("send default")}
    cron_producer, plain_producer = producers[cron.run_id], producers[plain.run_id]
    assert cron_producer.parent is None
    assert cron_producer.context.trace_id != tick_context.trace_id
    assert [link.context.span_id for link in cron_producer.links] == [tick_context.span_id]
    assert plain_producer.context.trace_id == tick_context.trace_id
    assert plain_producer.links == ()

    consumers = {(s.attributes or {})["job.id"]: s for s in telemetry.spans("job.execute")}
    assert consumers[cron.run_id].context.trace_id == cron_producer.context.trace_id
    assert (consumers[cron.run_id].attributes or {})["kumiko.job.trigger"] == trigger
    assert JobRun.objects.get(pk=cron.run_id).trace_id == _hex(cron_producer.context.trace_id, 32)


@pytest.mark.parametrize(
    "worker_class", ["kumiko_jobs.worker.ForkingWorker", "kumiko_jobs.worker.Worker"]
)
def test_worker_processes_export_their_spans(
    tenants, telemetry, tmp_path, monkeypatch, worker_class
):
    span_file = tmp_path / "spans.jsonl"
    monkeypatch.setenv("KUMIKO_OTEL_SPAN_FILE", str(span_file))
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    # Ten minutes between batch exports: spans reach the file only through the flush before a
    # work horse exits (forking) or the provider's shutdown at process exit (kumiko worker).
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "600000")
    handles = [jobs.probe.enqueue(tenant="t1", tag=f"exported-{i}") for i in range(2)]

    proc = start_rqworker("default", "--burst", "--worker-class", worker_class)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    assert all(JobRun.objects.get(pk=h.run_id).status == RunStatus.SUCCEEDED for h in handles)

    exported = [json.loads(line) for line in span_file.read_text().splitlines()]
    consumers = {s["attributes"]["job.id"]: s for s in exported if s["name"] == "job.execute"}
    assert set(consumers) == {h.run_id for h in handles}, out
    producers = {(s.attributes or {})["job.id"]: s for s in telemetry.spans("send default")}
    for handle in handles:
        span, producer = consumers[handle.run_id], producers[handle.run_id]
        assert span["kind"] == "SpanKind.CONSUMER"
        assert span["context"]["trace_id"] == f"0x{_hex(producer.context.trace_id, 32)}"
        assert span["parent_id"] == f"0x{_hex(producer.context.span_id, 16)}"
        assert span["attributes"]["kumiko.tenant_id"] == "t1"


# --- metrics ------------------------------------------------------------------------------


def _delta(before: dict[Key, Any], after: dict[Key, Any], name: str, **attrs: Any) -> float:
    key = (name, frozenset(attrs.items()))
    value = lambda points: getattr(points.get(key), "value", 0)  # noqa: E731
    return value(after) - value(before)


def _count_delta(before: dict[Key, Any], after: dict[Key, Any], name: str, **attrs: Any) -> int:
    key = (name, frozenset(attrs.items()))
    count = lambda points: getattr(points.get(key), "count", 0)  # noqa: E731
    return count(after) - count(before)


def test_metrics_record_success_failure_deferral_and_duration(tenants, telemetry):
    started = time.time()
    before = telemetry.points()
    jobs.probe.enqueue(tenant="t1", tag="ok")
    jobs.gives_up.enqueue(tenant="t2", tag="no")
    jobs.defers_once.enqueue(tenant="t3", tag="later")
    work(scheduler_rounds=1)
    after = telemetry.points()

    runs = "kumiko.job.runs"
    assert _delta(before, after, runs, job="testapp.probe", outcome="succeeded") == 1
    assert _delta(before, after, runs, job="testapp.gives_up", outcome="failed") == 1
    assert _delta(before, after, runs, job="testapp.defers_once", outcome="deferred") == 1
    assert _delta(before, after, runs, job="testapp.defers_once", outcome="succeeded") == 1
    deferrals = "kumiko.job.deferrals"
    assert _delta(before, after, deferrals, job="testapp.defers_once", by="job") == 1

    duration = "kumiko.job.duration"
    assert _count_delta(before, after, duration, job="testapp.probe", outcome="succeeded") == 1
    assert _count_delta(before, after, duration, job="testapp.gives_up", outcome="failed") == 1
    point = after[(duration, frozenset({"job": "testapp.probe", "outcome": "succeeded"}.items()))]
    assert point.sum > 0 and point.explicit_bounds[-1] == 3_600_000

    last_success = after[("kumiko.job.last_success", frozenset({"job": "testapp.probe"}.items()))]
    assert started <= last_success.value <= time.time()
    # The tenant is deliberately not a metric attribute (unbounded cardinality).
    assert not [k for k in after if any(name == "tenant" for name, _ in k[1])]


def test_queue_depth_gauge_reads_the_queues(tenants, telemetry):
    for i in range(3):
        jobs.probe.enqueue(tenant="t1", tag=f"waiting-{i}")
    points = telemetry.points()
    assert points[("kumiko.queue.depth", frozenset({"queue": "default"}.items()))].value == 3
    assert points[("kumiko.queue.depth", frozenset({"queue": "low"}.items()))].value == 0
    work()
    points = telemetry.points()
    assert points[("kumiko.queue.depth", frozenset({"queue": "default"}.items()))].value == 0


def test_every_escape_hatch_use_is_counted_though_reports_are_deduplicated(telemetry, caplog):
    from kumiko_jobs.history import audit
    from kumiko_jobs.run.state import RunState

    definition = registry.get("testapp.probe")
    env = Envelope(job=definition.name, schema="t1", kwargs={}, run_id=uuid.uuid4().hex)
    state = RunState.new(env, definition)
    before = telemetry.points()
    caplog.set_level(logging.WARNING, logger="kumiko_jobs.audit")
    for _ in range(3):
        audit.record_use(state, "global_writes")
    after = telemetry.points()
    uses = "kumiko.escape_hatch.uses"
    assert _delta(before, after, uses, job="testapp.probe", grant="global_writes") == 3
    assert len([r for r in caplog.records if r.name == "kumiko_jobs.audit"]) <= 1


# --- failure log and scrubbing ----------------------------------------------------------------


def test_final_failure_is_one_scrubbed_error_line(tenants, telemetry, caplog):
    caplog.set_level(logging.WARNING, logger="kumiko_jobs.runs")
    key = "testapp.denied password=hunter2 api_key: 'k-123'"
    handle = jobs.visible_error.enqueue(tenant="t1", tag="payload-value-77", key=key)
    work()
    assert JobRun.objects.get(pk=handle.run_id).status == RunStatus.FAILED

    line = _one([r for r in caplog.records if r.name == "kumiko_jobs.runs"])
    text = line.getMessage()
    assert line.levelno == logging.ERROR
    assert (
        f"job=testapp.visible_error run_id={handle.run_id} tenant=t1 attempt=1/1 final=true "
        "error_type=TenantVisibleError" in text
    )
    assert "password=***" in text and "api_key: '***'" in text
    for secret in ("hunter2", "k-123", "payload-value-77"):
        assert secret not in text
    assert line.kumiko_error_message == "testapp.denied password=*** api_key: '***'"  # type: ignore[attr-defined]
    assert (line.kumiko_job, line.kumiko_tenant, line.kumiko_final) == (  # type: ignore[attr-defined]
        "testapp.visible_error",
        "t1",
        True,
    )

    span = _one(telemetry.spans("job.execute"))
    event = _one([e for e in span.events if e.name == "exception"])
    event_text = json.dumps(dict(event.attributes or {})) + (span.status.description or "")
    assert "hunter2" not in event_text and "k-123" not in event_text
    assert span.status.status_code == StatusCode.ERROR


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("login failed: password=hunter2", "login failed: password=***"),
        ("DB_PASSWORD = 's3cr3t' next", "DB_PASSWORD = '***' next"),
        ('{"api_key": "abc", "user": "bob"}', '{"api_key": "***", "user": "bob"}'),
        ("Authorization: Bearer eyJhbGc.x.y rest", "Authorization: *** rest"),
        ("token=a1&page=2", "token=***&page=2"),
        ("connect postgres://app:pa55@db:5432/x", "connect postgres://app:***@db:5432/x"),
        ("invoice 7 not found", "invoice 7 not found"),
        ("", ""),
    ],
)
def test_scrub_hides_values_of_sensitive_keys(text, expected):
    assert log_context.scrub(text, patterns=("password", "api_key", "authorization", "token")) == (
        expected
    )


def test_scrub_uses_the_sensitive_keys_setting(settings):
    settings.KUMIKO_JOBS = {**settings.KUMIKO_JOBS, "SENSITIVE_KEYS": ["pin"]}
    assert log_context.scrub("pin=1234 password=x") == "pin=*** password=x"


def test_filter_outside_a_run_fills_placeholders():
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "hello", None, None)
    assert log_context.RunContextFilter().filter(record)
    assert {name: getattr(record, name) for name in log_context.FIELDS} == dict.fromkeys(
        log_context.FIELDS, "-"
    )


# --- packaging and the example's SDK set-up ---------------------------------------------------


def test_the_library_uses_the_opentelemetry_api_only():
    offenders = [
        str(path.relative_to(ROOT))
        for path in (ROOT / "kumiko_jobs").rglob("*.py")
        if "opentelemetry.sdk" in path.read_text()
        or "opentelemetry.instrumentation" in path.read_text()
    ]
    assert offenders == []


def _example_process(**env: str) -> str:
    code = (
        "from example_project import telemetry; telemetry.configure(); "
        "from opentelemetry import trace; "
        "trace.get_tracer('probe').start_span('hello-span').end(); "
        "getattr(trace.get_tracer_provider(), 'force_flush', lambda: None)()"
    )
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "KUMIKO_OTEL"))}
    clean.update({"PYTHONPATH": str(ROOT), "DJANGO_SETTINGS_MODULE": "example_project.settings"})
    clean.update(env)
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=clean,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_example_prints_spans_to_the_console_by_default():
    assert '"name": "hello-span"' in _example_process()


@pytest.mark.parametrize(
    "env",
    [
        {"OTEL_TRACES_EXPORTER": "none"},
        {"OTEL_SDK_DISABLED": "true"},
        {"DJANGO_SETTINGS_MODULE": "tests.settings"},
    ],
)
def test_example_console_output_can_be_silenced(env):
    assert "hello-span" not in _example_process(**env)


def test_example_span_file(tmp_path: Path):
    span_file = tmp_path / "spans.jsonl"
    out = _example_process(OTEL_TRACES_EXPORTER="none", KUMIKO_OTEL_SPAN_FILE=str(span_file))
    assert out == ""
    assert [json.loads(line)["name"] for line in span_file.read_text().splitlines()] == [
        "hello-span"
    ]
