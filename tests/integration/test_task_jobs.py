"""Django tasks as kumiko jobs, through a real worker (issue 22, issue 23): each task is a job
of its own (its module path, its docstring as title) in the history, the admin and the
metrics; old runs and messages of the one-job-per-queue kind still run and read; a run's task
is resolved against the known tasks without importing what it names; a return value that is
not JSON fails the run, as Django's own backends fail the task."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import pytest
from django.tasks import TaskResultStatus, default_task_backend
from django.tasks.exceptions import TaskResultDoesNotExist
from django_tenants.utils import schema_context
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from kumiko_jobs import task_jobs
from kumiko_jobs.definition.registry import registry
from kumiko_jobs.enqueueing import submit
from kumiko_jobs.models import JobAttempt, JobRun, RunStatus
from tests.conftest import probes, work
from tests.integration.test_admin import (  # noqa: F401 - fixtures
    clerk,
    client_for,
    make_user,
    operator,
    operator_user,
    text,
)
from tests.testapp import canary_record, tasks

pytestmark = pytest.mark.usefixtures("live_db")

CANARY = "tests.testapp.import_canary"
LEGACY = "django_tasks.default:default"


def _forget_canary() -> None:
    sys.modules.pop(CANARY, None)
    canary_record.IMPORTS.clear()


def test_each_task_is_a_job_of_its_own_named_by_its_module_path(tenants: Any) -> None:
    with schema_context("t1"):
        add = tasks.add.enqueue(1, 1)
        low = tasks.low_lane.enqueue("x")
        moved = tasks.add.using(queue_name="low").enqueue(2, 2)
    names = {run.hex: name for run, name in JobRun.objects.values_list("run_id", "job_name")}
    assert {names[r.id] for r in (add, low, moved)} == {
        "tests.testapp.tasks.add",
        "tests.testapp.tasks.low_lane",
        "tests.testapp.tasks.add:low",  # another queue than the one the task declares
    }
    assert JobRun.objects.get(pk=moved.id).queue == "low"
    work()
    work("low")
    assert tasks.add.get_result(add.id).return_value == 2
    assert tasks.add.get_result(moved.id).return_value == 4
    assert tasks.low_lane.get_result(low.id).return_value == "x"
    # The task's own docstring (first paragraph) is the job's title; none: its name.
    assert registry.get("tests.testapp.tasks.add").description == "Add two numbers for the tests."
    assert registry.get("tests.testapp.tasks.undocumented").description == ""
    assert registry.get(LEGACY).description == ""  # was run_django_task's own docstring


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """The job.execute spans of this test (an exporter on the process's tracer provider, which
    test_observability's fixture shares: a second MeterProvider could not be installed)."""
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield exporter
    exporter.shutdown()  # the processor stays; a shut exporter keeps nothing


def test_the_admin_and_the_metrics_tell_tasks_apart(
    tenants: Any,
    operator: Any,  # noqa: F811 - the fixtures imported above
    clerk: Any,  # noqa: F811
    spans: InMemorySpanExporter,
) -> None:
    from kumiko_jobs import telemetry

    telemetry._last_success.clear()  # the source of the kumiko.job.last_success gauge
    with schema_context("t1"):
        tasks.add.enqueue(3, 4)
        tasks.always_fails.enqueue()
    work()
    # The metrics' "job" attribute: the gauge's observations, one per job that succeeded.
    assert set(telemetry._last_success) == {"tests.testapp.tasks.add"}
    names = {s.attributes.get("job.name") for s in spans.get_finished_spans()}
    assert {"tests.testapp.tasks.add", "tests.testapp.tasks.always_fails"} <= names
    assert LEGACY not in names

    operators = text(operator.get("/admin/kumiko_jobs/jobrun/"))
    assert "tests.testapp.tasks.add" in operators
    assert "tests.testapp.tasks.always_fails" in operators
    assert LEGACY not in operators
    tenant = text(clerk.get("/admin/kumiko_jobs/jobrun/"))
    assert "Add two numbers for the tests." in tenant  # the title, for a tenant
    assert "Call the Django task" not in tenant and "Call the Django task" not in operators


def test_runs_and_messages_of_the_old_one_job_per_queue_kind_still_run_and_read(
    tenants: Any,
) -> None:
    """Rows and queued messages from before tasks had names of their own name the backend's
    job for the queue, with the task in their arguments (docs/design.md, "Public paths")."""
    legacy = registry.get(LEGACY)
    with schema_context("t2"):
        handle = submit.enqueue(
            legacy, task="tests.testapp.tasks.add", args=[5, 6], kwargs={}, priority=0
        )
    assert JobRun.objects.get(pk=handle.run_id).job_name == LEGACY
    work()
    result = tasks.add.get_result(handle.run_id)
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == 11
    assert [(p.tag, p.schema_seen) for p in probes("t2")] == [("add 5+6", "t2")]


@pytest.mark.parametrize(
    ("job", "named"),
    [
        (LEGACY, f"{CANARY}.planted"),  # a module with an import side effect and a real task
        ("tests.testapp.tasks.add", f"{CANARY}.planted"),
        (LEGACY, "os.system"),
        ("tests.testapp.tasks.add", "tests.testapp.tasks.always_fails"),  # another task
    ],
)
def test_a_run_naming_a_task_that_is_not_its_own_or_not_known_imports_nothing(
    tenants: Any, job: str, named: str
) -> None:
    """Before: the worker (and get_result() in the web process) imported whatever module the
    ``task`` argument named, then checked it was a task; the canary module was imported and its
    planted task ran (proved by reverting ``resolve_task`` to ``import_string``)."""
    _forget_canary()
    with schema_context("t1"):
        handle = submit.enqueue(registry.get(job), task=named, args=[], kwargs={}, priority=0)
    work()
    run = JobRun.objects.get(pk=handle.run_id)
    assert run.status == RunStatus.FAILED and run.error_type == "Unrecoverable"
    assert run.attempts == 1  # refused at once, not retried
    assert "not a task this process knows" in run.error_message or "runs the Django task" in (
        run.error_message
    )
    # The web process reads the row without importing what it names either.
    with pytest.raises(TaskResultDoesNotExist, match="not a known task"):
        default_task_backend.get_result(handle.run_id)
    assert CANARY not in sys.modules and canary_record.IMPORTS == []
    assert probes("t1") == []


def test_a_task_returning_a_value_that_is_not_json_fails_its_run(tenants: Any) -> None:
    """Django's backends fail such a task; kumiko recorded it succeeded with a marker. Not
    retried (RETRIES=2 here): the same code returns the same value, and the effect is done."""
    with schema_context("t3"):
        failing = {kind: tasks.returns.enqueue(kind) for kind in ("set", "nan", "object", "nul")}
        kept = {kind: tasks.returns.enqueue(kind) for kind in ("tuple", "huge")}
    work(scheduler_rounds=2)
    for kind, result in failing.items():
        result.refresh()
        run = JobRun.objects.get(pk=result.id)
        assert result.status == TaskResultStatus.FAILED, kind
        assert run.status == RunStatus.FAILED and run.error_type == "Unrecoverable"
        assert "returned a value that" in run.error_message
        assert "must be JSON" in run.error_message and run.result is None
        assert run.attempts == 1
        assert list(JobAttempt.objects.filter(run=run).values_list("outcome", flat=True)) == [
            "failed"
        ]
        assert [e.exception_class_path for e in result.errors] == [
            "kumiko_jobs.core.exceptions.Unrecoverable"
        ]
    assert "is not JSON" in JobRun.objects.get(pk=failing["set"].id).error_message
    assert "NUL" in JobRun.objects.get(pk=failing["nul"].id).error_message
    # JSON comes back as JSON (a tuple as a list); over MAX_RESULT_BYTES is kept as the marker.
    assert tasks.returns.get_result(kept["tuple"].id).return_value == [1, [2, 3]]
    huge = tasks.returns.get_result(kept["huge"].id)
    assert huge.status == TaskResultStatus.SUCCESSFUL
    assert "MAX_RESULT_BYTES" in huge.return_value["kumiko_result_not_kept"]


def test_a_task_not_known_at_start_up_is_refused_at_enqueue(tenants: Any) -> None:
    from django.tasks import task
    from django.tasks.exceptions import InvalidTask

    def late() -> None:  # module level in spirit; Django checks that at enqueue only
        pass

    late.__qualname__ = "late_task_of_the_test"
    globals()["late_task_of_the_test"] = late
    made = task(late)
    assert task_jobs.known_task(made.module_path) is made  # known now, but it has no job
    with schema_context("t1"), pytest.raises(InvalidTask, match="was not known when kumiko"):
        made.enqueue()
    assert JobRun.objects.count() == 0


def test_a_worker_process_knows_the_tasks_from_start_up_and_imports_no_module_a_run_names(
    tenants: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``manage.py rqworker`` in its own process: the tasks modules are imported at its start
    (the task runs under its own job name), and a crafted run naming the canary module leaves
    no trace of an import (with ``resolve_task`` reverted to ``import_string``, the canary's
    file was written and its planted task ran)."""
    from tests.conftest import start_rqworker

    canary_file = tmp_path / "canary.txt"
    monkeypatch.setenv("KUMIKO_TEST_CANARY_FILE", str(canary_file))
    with schema_context("t1"):
        real = tasks.add.enqueue(20, 22)
        crafted = submit.enqueue(
            registry.get(LEGACY), task=f"{CANARY}.planted", args=[], kwargs={}, priority=0
        )
    proc = start_rqworker("default", "--burst")
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    assert tasks.add.get_result(real.id).return_value == 42
    assert JobRun.objects.get(pk=real.id).job_name == "tests.testapp.tasks.add"
    run = JobRun.objects.get(pk=crafted.run_id)
    assert (run.status, run.error_type) == (RunStatus.FAILED, "Unrecoverable"), out
    assert not canary_file.exists(), canary_file.read_text()


def test_a_task_whose_name_no_job_may_have_does_not_stop_start_up(
    tenants: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Start-up registers every known task; one whose module path is not a valid job name (here
    over 200 characters, the history's column) gets no job, the others do, and its enqueue says
    why. (A fresh registry stands in for start-up: the project's is frozen.)"""
    from django.tasks import task
    from django.tasks.exceptions import InvalidTask

    from kumiko_jobs.definition.registry import Registry

    def odd() -> None:
        pass

    odd.__module__, odd.__qualname__ = "tests." + "m" * 220, "odd"
    made = task(odd)
    fresh = Registry()
    monkeypatch.setattr(task_jobs, "registry", fresh)
    monkeypatch.setattr(task_jobs, "_known", {made.module_path: made, **task_jobs._known})
    monkeypatch.setattr(task_jobs, "_jobs", {})
    monkeypatch.setattr(task_jobs, "_refused", {})
    monkeypatch.setattr(task_jobs, "discover_tasks", lambda: None)
    task_jobs.register_task_jobs()
    assert "tests.testapp.tasks.add" in fresh and LEGACY in fresh
    assert "must match" in task_jobs.why_unregistered(made)
    with schema_context("t1"), pytest.raises(InvalidTask, match=r"has no kumiko job: .*must match"):
        made.enqueue()
