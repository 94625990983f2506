"""The seed's promises that had no end-to-end test (issue 23), each through a real worker.

Real PostgreSQL (django-tenants schemas), real Redis, a real kumiko worker (RQ SimpleWorker, in
this process, ``tests.conftest.work``); requests through Django's full middleware stack. A
worker's start alone enqueuing the boot job is in test_boot_once_after_retention.py.

* the second event of a multi-trigger job (``on=[...]``) starts it, with that event's payload;
* listeners of one event on two queues each run on their own queue's worker only;
* ``emit()`` against ``max_per_tenant``: over the cap the listener's run is recorded ``capped``
  and never runs; the cap is per tenant and counts waiting or running runs only;
* the personal-data gate (docs/guard.md, "Personal data and write origin"): an anonymous GET's
  run may not write a personal-data column, nor may its follow-ups or the fan-out children of
  an anonymous request in the public schema; outside any request (a command, a shell) the same
  write is allowed, and so are other columns;
* a telemetry failure (a span processor or an exporter that raises) never fails a run.

Calibrated: with no write origin stamped (``origin.request_origin`` returning None) the three
denied personal-data tests failed (the email was written); with follow-ups and fan-out children
not inheriting their parent's origin (``Envelope.followup`` / ``child``), those two failed. The
raising span processor failed the enqueue itself (``_Broken`` out of the SDK's ``start_span``)
until kumiko's spans were guarded (``telemetry/guarded.py``); an exporter that raises was
already caught by the SDK's own span processor.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection
from django.http import HttpRequest, HttpResponse
from django.test import Client as HttpClient
from django.test import override_settings
from django.urls import path
from django_tenants.utils import tenant_context

from kumiko_jobs import emit
from kumiko_jobs.models import JobRun, RunStatus
from tests.conftest import work
from tests.guardapp.jobs import save_person

pytestmark = pytest.mark.usefixtures("live_db")

JOB_PREFIX = "seed"
ran: list[tuple[str, str | None, dict[str, Any]]] = []


@pytest.fixture(autouse=True)
def _forget_calls() -> Iterator[None]:
    ran.clear()
    yield
    ran.clear()


def _note(ctx: Any, **payload: Any) -> None:
    ran.append((ctx.job_name, ctx.trigger_name, payload))


def runs_of(job: Any) -> list[JobRun]:
    return list(JobRun.objects.filter(job_name=job.name).order_by("queued_at"))


# --- events ------------------------------------------------------------------------------------


def test_the_second_event_of_a_multi_trigger_job_starts_it(declare, tenants):
    def on_either(ctx: Any, **payload: Any) -> None:
        _note(ctx, **payload)

    job = declare(on_either, on=["seed.first", "seed.second"])
    with tenant_context(tenants["t1"]):
        emit("seed.second", invoice=7)
    connection.set_schema_to_public()
    work()
    assert ran == [(job.name, "seed.second", {"invoice": 7})]
    [run] = runs_of(job)
    assert (run.status, run.schema_name, run.trigger) == (RunStatus.SUCCEEDED, "t1", "seed.second")
    assert emit("seed.third", tenant=tenants["t1"]) == []  # an event it is not declared on


def test_listeners_on_two_queues_each_run_on_their_own_queue(declare, tenants):
    def on_default(ctx: Any, **payload: Any) -> None:
        _note(ctx, **payload)

    def on_low(ctx: Any, **payload: Any) -> None:
        _note(ctx, **payload)

    default_job = declare(on_default, on="seed.split")
    low_job = declare(on_low, on="seed.split", queue="low")
    handles = emit("seed.split", tenant=tenants["t2"], n=1)
    assert len(handles) == 2
    work("default")
    assert ran == [(default_job.name, "seed.split", {"n": 1})]  # the low one waits for its worker
    [low_run] = runs_of(low_job)
    assert (low_run.status, low_run.queue) == (RunStatus.QUEUED, "low")
    work("low")
    assert sorted(name for name, _, _ in ran) == sorted([default_job.name, low_job.name])
    for job, queue in ((default_job, "default"), (low_job, "low")):
        [run] = runs_of(job)
        assert (run.status, run.queue, run.schema_name) == (RunStatus.SUCCEEDED, queue, "t2")


def test_emit_against_max_per_tenant(declare, tenants):
    def capped_listener(ctx: Any, **payload: Any) -> None:
        _note(ctx, **payload)

    job = declare(capped_listener, on="seed.capped", max_per_tenant=1)
    [first] = emit("seed.capped", tenant=tenants["t1"], n=1)
    [second] = emit("seed.capped", tenant=tenants["t1"], n=2)
    [other_tenant] = emit("seed.capped", tenant=tenants["t2"], n=3)
    assert second.capped and not first.capped and not other_tenant.capped
    work()
    assert sorted(payload["n"] for _, _, payload in ran) == [1, 3]  # n=2 never ran
    statuses = {str(r.run_id.hex): r.status for r in runs_of(job)}
    assert statuses[second.run_id] == RunStatus.CAPPED
    assert statuses[first.run_id] == statuses[other_tenant.run_id] == RunStatus.SUCCEEDED
    # The cap counts waiting or running runs: with the first one done, the next is admitted.
    [again] = emit("seed.capped", tenant=tenants["t1"], n=4)
    assert not again.capped
    work()
    assert [payload["n"] for _, _, payload in ran][-1] == 4


# --- the personal-data gate --------------------------------------------------------------------

VIEW_JOB: dict[str, Any] = {}


def _enqueue_view(request: HttpRequest) -> HttpResponse:
    """What a view does: enqueue the test's job (anonymous visitors included)."""
    handle = VIEW_JOB["job"].enqueue(name="Ann", email="ann@example.com")
    return HttpResponse(handle.run_id)


urlpatterns = [path("look/", _enqueue_view)]


def _anonymous_get(host: str, job: Any) -> str:
    """An anonymous GET through the whole middleware stack (tenant, auth, kumiko's)."""
    VIEW_JOB["job"] = job
    urlconf = "tests.integration.test_seed_end_to_end"
    try:
        with override_settings(ROOT_URLCONF=urlconf, PUBLIC_SCHEMA_URLCONF=urlconf):
            response = HttpClient().get("/look/", HTTP_HOST=host)
    finally:
        VIEW_JOB.clear()
        connection.set_schema_to_public()
    assert response.status_code == 200, response.content
    return response.content.decode()


def _people(tenant: Any) -> list[tuple[str, str]]:
    from tests.guardapp.models import Person

    with tenant_context(tenant):
        rows = list(Person.objects.values_list("name", "email"))
    connection.set_schema_to_public()
    return rows


def _assert_denied_personal_data(run: JobRun) -> None:
    assert run.status == RunStatus.FAILED, (run.status, run.error_message)
    assert run.error_type == "DatabaseAccessDenied"
    assert "public_intake_required" in run.error_message
    assert "writes personal data to 'guardapp_person'" in run.error_message


def test_an_anonymous_get_may_not_write_personal_data(tenants, guard_data):
    run_id = _anonymous_get("t1.localhost", save_person)
    run = JobRun.objects.get(pk=run_id)
    assert run.origin == {"anonymous": True, "path": "/look/", "public_intake": False}
    work()
    run.refresh_from_db()
    _assert_denied_personal_data(run)
    assert _people(tenants["t1"]) == []


def test_a_follow_up_of_an_anonymous_run_may_not_write_personal_data(declare, tenants, guard_data):
    def hands_on(ctx: Any, *, name: str, email: str) -> None:
        ctx.enqueue(save_person, name=name, email=email)

    parent = declare(hands_on)
    parent_id = _anonymous_get("t1.localhost", parent)
    work()
    assert JobRun.objects.get(pk=parent_id).status == RunStatus.SUCCEEDED
    [child] = JobRun.objects.filter(parent_run_id=parent_id)
    assert child.origin is not None and child.origin["anonymous"] is True  # inherited
    _assert_denied_personal_data(child)
    assert _people(tenants["t1"]) == []


def test_fan_out_children_of_an_anonymous_request_may_not_write_personal_data(
    declare, tenants, guard_data
):
    from tests.guardapp.models import Person

    def saves_everywhere(ctx: Any, *, name: str, email: str) -> None:
        Person.objects.create(name=name, email=email)

    job = declare(saves_everywhere, per_tenant=True)
    parent_id = _anonymous_get("localhost", job)  # the public schema: a fan-out
    work()
    children = list(JobRun.objects.filter(parent_run_id=parent_id))
    assert sorted(c.schema_name for c in children) == ["t1", "t2", "t3"]
    for child in children:
        assert child.origin is not None and child.origin["anonymous"] is True
        _assert_denied_personal_data(child)
    for schema in ("t1", "t2", "t3"):
        assert _people(tenants[schema]) == []


def test_outside_any_request_personal_data_may_be_written(tenants, guard_data):
    """A command or a shell has no write origin: the gate is about anonymous web visitors."""
    with tenant_context(tenants["t1"]):
        handle = save_person.enqueue(name="Ann", email="ann@example.com")
    connection.set_schema_to_public()
    work()
    run = JobRun.objects.get(pk=handle.run_id)
    assert run.origin is None
    assert run.status == RunStatus.SUCCEEDED, run.error_message
    assert _people(tenants["t1"]) == [("Ann", "ann@example.com")]


# --- telemetry failures ------------------------------------------------------------------------


class _Broken(Exception):
    pass


def _raising_processor() -> Any:
    from opentelemetry.sdk.trace import SpanProcessor

    class RaisingProcessor(SpanProcessor):
        """A span processor whose hooks raise while ``armed`` (a provider keeps its
        processors for good, so a test can only disarm it afterwards)."""

        armed = False

        def on_start(self, span: Any, parent_context: Any = None) -> None:
            if self.armed:
                raise _Broken("span processor on_start")

        def on_end(self, span: Any) -> None:
            if self.armed:
                raise _Broken("span processor on_end")

    return RaisingProcessor()


class RaisingExporter:
    armed = False

    def export(self, spans: Any) -> Any:
        if self.armed:
            raise _Broken("exporter")
        from opentelemetry.sdk.trace.export import SpanExportResult

        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


@pytest.fixture(scope="module")
def broken_telemetry() -> Iterator[tuple[Any, RaisingExporter]]:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    processor, exporter = _raising_processor(), RaisingExporter()
    provider.add_span_processor(processor)
    provider.add_span_processor(SimpleSpanProcessor(exporter))  # type: ignore[arg-type]
    yield processor, exporter
    processor.armed = exporter.armed = False


@pytest.mark.parametrize("broken", ["processor", "exporter"])
def test_a_telemetry_failure_never_fails_a_run(declare, tenants, broken_telemetry, broken):
    processor, exporter = broken_telemetry
    part = processor if broken == "processor" else exporter

    def traced(ctx: Any) -> str:
        ran.append((ctx.job_name, None, {}))
        return "done"

    job = declare(traced)
    part.armed = True
    try:
        handle = job.enqueue(tenant=tenants["t1"])
        work()
    finally:
        part.armed = False
    run = JobRun.objects.get(pk=handle.run_id)
    assert ran == [(job.name, None, {})]
    assert run.status == RunStatus.SUCCEEDED, (run.error_type, run.error_message)
    assert run.result == "done"
