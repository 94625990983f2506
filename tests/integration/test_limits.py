"""Limits that used to leave runs stuck or loop (issue 17, item 7), through a real worker.

Real PostgreSQL, real Redis, the in-process kumiko worker. Each bound is exercised at its
limit and just past it; no run may stay ``running``.
"""

from __future__ import annotations

import json
import logging
import re
from types import SimpleNamespace
from typing import Any

import pytest
from django.test import Client
from django_tenants.utils import schema_context

from kumiko_jobs import EscapeHatch, InvalidJob, TenantVisibleError, transport
from kumiko_jobs.core.exceptions import FALLBACK_MESSAGE_KEY
from kumiko_jobs.definition.job import JobDefinition
from kumiko_jobs.models import (
    EscapeHatchUse,
    JobAttempt,
    JobFailure,
    JobRun,
    RejectedMessage,
    RunStatus,
)
from tests.conftest import TENANTS, probes, work
from tests.testapp import jobs

pytestmark = pytest.mark.usefixtures("live_db")

JOB_PREFIX = "limits"  # conftest.declare names jobs "limits.<function>"


def the_run(handle: Any) -> JobRun:
    return JobRun.objects.get(pk=handle.run_id)


# --- TenantVisibleError keys ----------------------------------------------------------------


def raises_a_long_key(ctx: Any, *, tag: str) -> None:
    raise TenantVisibleError("billing." + "k" * 492)


def test_a_500_character_key_fails_the_run_and_the_tenant_sees_the_declared_key(tenants):
    """testapp.visible_error declares tenant_visible_failure: its key stands in."""
    handle = jobs.visible_error.enqueue(tenant="t1", tag="long", key="k" * 500)
    work()
    run = the_run(handle)
    assert run.status == RunStatus.FAILED and run.finished_at is not None
    assert run.error_type == "TenantVisibleError"
    assert "500 characters long, over 200" in run.error_message
    failure = JobFailure.objects.get(schema_name="t1")
    assert (failure.message_key, failure.subject) == ("testapp.generic", "tag=long")


def test_a_500_character_key_without_a_declared_one_shows_the_fallback(tenants, declare):
    job = declare(raises_a_long_key, tenant_visible_run=["tag"])
    handle = job.enqueue(tenant="t2", tag="long")
    work()
    assert the_run(handle).status == RunStatus.FAILED
    failure = JobFailure.objects.get(schema_name="t2")
    assert (failure.message_key, failure.subject) == (FALLBACK_MESSAGE_KEY, "tag=long")
    assert not JobFailure.objects.exclude(schema_name="t2").exists()


def test_a_key_at_the_column_size_is_shown_as_is(tenants):
    key = "k" * 200
    handle = jobs.visible_error.enqueue(tenant="t1", tag="exact", key=key)
    work()
    assert the_run(handle).status == RunStatus.FAILED
    assert JobFailure.objects.get(schema_name="t1").message_key == key


# --- act_as ---------------------------------------------------------------------------------

HATCH = EscapeHatch(reason="acts for the requesting user", grants=["system_identity"])


def acts_as(ctx: Any, *, pk: str) -> None:
    with ctx.act_as(SimpleNamespace(pk=pk)):
        pass


@pytest.mark.parametrize(("length", "outcome"), [(95, "succeeded"), (96, "failed")])
def test_act_as_actor_is_bounded_where_it_enters(tenants, declare, length, outcome):
    """ "user:" + 95 characters is the column's 100; one more fails the job, not its history."""
    EscapeHatchUse.objects.all().delete()  # not among the tables live_db empties
    job = declare(acts_as, escape_hatch=HATCH)
    handle = job.enqueue(tenant="t1", pk="u" * length)
    work()
    run = the_run(handle)
    assert run.status == outcome and run.finished_at is not None
    if outcome == "succeeded":
        assert EscapeHatchUse.objects.get().actor == "user:" + "u" * 95
    else:
        assert run.error_type == "InvalidJob"
        assert "101 characters long; the audit keeps at most 100" in run.error_message
        assert not EscapeHatchUse.objects.exists()


# --- message size at every reachable attempt ------------------------------------------------


def always_fails(ctx: Any, *, blob: str) -> None:
    raise RuntimeError(f"attempt {ctx.attempt} fails")


def _blob_length_for(job: JobDefinition, limit: int) -> int:
    """The blob length whose largest reachable message is exactly ``limit`` bytes, read from
    the refusal of an oversized enqueue, which reports the probe's largest reachable size
    (run ids, correlation ids and the signing times it is measured with: all fixed length)."""
    probe_length = limit * 2
    with pytest.raises(InvalidJob) as refused:
        job.enqueue(tenant="t1", blob="x" * probe_length)
    match = re.search(r"message of up to (\d+) bytes", str(refused.value))
    assert match, refused.value
    largest = int(match.group(1))  # the probe's message at its last attempt
    return probe_length - (largest - limit)


def test_a_message_at_the_bound_for_its_last_attempt_runs_every_attempt(tenants, declare, settings):
    """Eleven attempts (1 digit to 2): every retry message is accepted by the worker."""
    limit = 8192
    settings.KUMIKO_JOBS = {**settings.KUMIKO_JOBS, "MAX_ENVELOPE_BYTES": limit}
    job = declare(always_fails, retries=10, backoff={"type": "fixed", "delay": 0})
    length = _blob_length_for(job, limit)
    handle = job.enqueue(tenant="t1", blob="x" * length)
    work()
    run = the_run(handle)
    assert (run.status, run.attempts) == (RunStatus.FAILED, 11)
    assert JobAttempt.objects.filter(run=run).count() == 11
    assert not RejectedMessage.objects.exists()


def test_a_message_one_byte_past_the_bound_is_refused_at_enqueue(tenants, declare, settings):
    """Previously accepted: attempt 10 grew by a byte, every worker rejected it, and the relay
    pushed it again each round. Now the enqueue says so and writes nothing."""
    limit = 8192
    settings.KUMIKO_JOBS = {**settings.KUMIKO_JOBS, "MAX_ENVELOPE_BYTES": limit}
    job = declare(always_fails, retries=10, backoff={"type": "fixed", "delay": 0})
    length = _blob_length_for(job, limit) + 1
    with pytest.raises(InvalidJob, match=f"up to {limit + 1} bytes .*MAX_ENVELOPE_BYTES={limit}"):
        job.enqueue(tenant="t1", blob="x" * length)
    assert not JobRun.objects.exists()
    assert transport.queue_length("default") == 0


# --- error text PostgreSQL cannot store ------------------------------------------------------


def raises_with_nul(ctx: Any) -> None:
    raise ValueError("bad byte \x00 and a lone surrogate \ud800 in the text")


def test_an_exception_text_with_nul_fails_the_run_instead_of_leaving_it_running(tenants, declare):
    """PostgreSQL refuses NUL in text: the final history write failed and the run stayed
    ``running``. The rendered error is made storable where it is rendered."""
    job = declare(raises_with_nul)
    handle = job.enqueue(tenant="t1")
    work()
    run = the_run(handle)
    assert run.status == RunStatus.FAILED
    assert run.error_type == "ValueError"
    assert "bad byte \\x00 and a lone surrogate \\ud800" in run.error_message
    attempt = JobAttempt.objects.get(run=run)
    assert "\\x00" in attempt.traceback


# --- ctx.log --------------------------------------------------------------------------------


def logs_a_lot(ctx: Any, *, lines: int, size: int) -> None:
    for i in range(lines):
        ctx.log.info(f"line {i} " + "word " * (size // 5), password="hunter2", n=i)


def test_a_20_mb_log_attempt_is_capped_with_a_marker(tenants, declare, caplog):
    caplog.set_level(logging.INFO, logger="kumiko_jobs.job")
    job = declare(logs_a_lot)
    handle = job.enqueue(tenant="t1", lines=100, size=200_000)  # 20 MB of ctx.log
    work()
    run = the_run(handle)
    assert run.status == RunStatus.SUCCEEDED
    log = JobAttempt.objects.get(run=run).log
    stored = len(json.dumps(log))
    assert stored <= 256 * 1024 + 1024  # LOG_BYTES_PER_ATTEMPT and the marker line
    marker = log[-1]
    assert marker["level"] == "WARNING" and "later lines dropped" in marker["msg"]
    kept = len(log) - 1
    assert 0 < kept < 100 and marker["data"]["dropped_lines"] == 100 - kept
    for line in log[:-1]:
        assert len(json.dumps(line)) < 4096 + 200  # LOG_LINE_BYTES and a truncation marker
        # The message took the line's budget: the fields are counted, not kept.
        assert line["data"] == {"…dropped_fields": 2}
    assert "hunter2" not in json.dumps(log)
    records = [r for r in caplog.records if r.name == "kumiko_jobs.job"]
    assert len(records) == 100
    assert all(len(r.getMessage()) < 5000 and "hunter2" not in r.getMessage() for r in records)


def test_log_lines_are_capped_in_number_and_bytes_by_settings(tenants, declare, settings):
    settings.KUMIKO_JOBS = {
        **settings.KUMIKO_JOBS,
        "LOG_LINES_PER_ATTEMPT": 5,
        "LOG_LINE_BYTES": 256,
    }
    job = declare(logs_a_lot)
    handle = job.enqueue(tenant="t1", lines=5, size=10)
    more = job.enqueue(tenant="t1", lines=6, size=1000)
    work()
    exact = JobAttempt.objects.get(run_id=handle.run_id).log
    assert [line["msg"] for line in exact] == [f"line {i} " + "word " * 2 for i in range(5)]
    assert [line["data"] for line in exact] == [{"password": "***", "n": i} for i in range(5)]
    capped = JobAttempt.objects.get(run_id=more.run_id).log
    assert len(capped) == 6 and capped[-1]["data"]["dropped_lines"] == 1
    assert all(len(json.dumps(line)) < 256 + 200 for line in capped)


# --- follow-ups and fan-out -----------------------------------------------------------------


def enqueues_followups(ctx: Any, *, n: int) -> None:
    for i in range(n):
        ctx.enqueue(jobs.probe, tag=f"follow-{i}")


@pytest.mark.parametrize(("n", "outcome"), [(3, "succeeded"), (4, "failed")])
def test_follow_ups_per_run_are_bounded(tenants, declare, settings, n, outcome):
    settings.KUMIKO_JOBS = {**settings.KUMIKO_JOBS, "MAX_FOLLOWUPS_PER_RUN": 3}
    job = declare(enqueues_followups)
    handle = job.enqueue(tenant="t1", n=n)
    work()
    run = the_run(handle)
    assert run.status == outcome
    if outcome == "succeeded":
        assert len(probes("t1")) == 3
    else:
        assert "more than MAX_FOLLOWUPS_PER_RUN=3 follow-ups" in run.error_message
        assert probes("t1") == []
        assert JobRun.objects.count() == 1


def fans_out(ctx: Any) -> None:
    from tests.testapp.models import Probe

    Probe.objects.create(tag="fanned", schema_seen="")


@pytest.mark.parametrize(("limit", "children"), [(3, 3), (2, 0)])
def test_fan_out_size_is_bounded(tenants, declare, settings, limit, children):
    settings.KUMIKO_JOBS = {**settings.KUMIKO_JOBS, "MAX_FANOUT_TENANTS": limit}
    job = declare(fans_out, per_tenant=True)
    parent = job.enqueue()
    work()
    run = the_run(parent)
    assert run.status == (RunStatus.SUCCEEDED if children else RunStatus.FAILED)
    assert JobRun.objects.filter(parent_run_id=run.run_id).count() == children
    if not children:
        assert "more than MAX_FANOUT_TENANTS=2 tenants; no child run" in run.error_message
    assert sum(len(probes(s)) for s in TENANTS) == children


# --- nesting through the operator's run-a-job form -----------------------------------------


def manual_blob(ctx: Any, *, blob: Any = None) -> None:
    pass


@pytest.fixture
def operator() -> Client:
    from django.contrib.auth import get_user_model

    with schema_context("public"):
        User = get_user_model()
        user = User.objects.filter(username="limits-op").first() or User(username="limits-op")
        user.is_staff = user.is_superuser = True
        user.set_password("x" * 20)
        user.save()
        client = Client(HTTP_HOST="localhost")
        client.force_login(user)
    return client


@pytest.mark.parametrize("depth", [33, 990])  # 32 levels of lists pass (unit tests)
def test_deep_arguments_in_the_run_a_job_form_are_a_form_error(tenants, declare, operator, depth):
    """990 levels is below json.loads' own limit: the previous check_json recursed into a
    RecursionError there (a 500)."""
    declare(manual_blob, manual=True)
    arguments = '{"blob": ' + "[" * depth + "]" * depth + "}"
    response = operator.post(
        "/admin/kumiko_jobs/jobrun/run-job/",
        {"job": "limits.manual_blob", "tenant": "t1", "arguments": arguments},
    )
    assert response.status_code == 200
    assert "nested more than MAX_ARGUMENT_DEPTH=32 levels" in response.content.decode()
    assert not JobRun.objects.exists()


def test_arguments_deeper_than_json_can_parse_are_a_form_error(tenants, declare, operator):
    """5,000 levels: json.loads itself raises RecursionError (a 500 before the form caught it)."""
    declare(manual_blob, manual=True)
    arguments = '{"blob": ' + "[" * 5000 + "]" * 5000 + "}"
    response = operator.post(
        "/admin/kumiko_jobs/jobrun/run-job/",
        {"job": "limits.manual_blob", "tenant": "t1", "arguments": arguments},
    )
    assert response.status_code == 200
    assert "nested too deeply" in response.content.decode()
    assert not JobRun.objects.exists()


# --- the failure line of a huge exception ---------------------------------------------------


def raises_a_megabyte(ctx: Any) -> None:
    raise RuntimeError("login password=hunter2 to redis://:hunter2@cache/0 " + "aaaa " * 200_000)


def test_a_megabyte_of_exception_text_makes_one_short_scrubbed_failure_line(
    tenants, declare, caplog
):
    """The line is truncated before it is scrubbed (the previous code scrubbed first, in
    quadratic time, then truncated)."""
    caplog.set_level(logging.WARNING, logger="kumiko_jobs.runs")
    job = declare(raises_a_megabyte)
    handle = job.enqueue(tenant="t1")
    work()
    assert the_run(handle).status == RunStatus.FAILED
    (line,) = [r for r in caplog.records if r.name == "kumiko_jobs.runs"]
    message = line.kumiko_error_message  # type: ignore[attr-defined]
    assert message.startswith("login password=*** to redis://:***@cache/0 aaaa")
    assert message.endswith("more characters]") and len(message) < 1100
    assert "hunter2" not in line.getMessage()
