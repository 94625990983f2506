"""A system run a tenant's run started counts against that tenant's flow control, through real
workers on real Redis and PostgreSQL.

``@job(system=True, tenant_may_start=True)`` lets a tenant's run start a system job (a
follow-up, ``ctx.enqueue``). The run is still a system run (public schema, no tenant on its
row, the system job's own options), but its messages wait in the starting tenant's bucket
(``Envelope.flow_tenant``): that tenant's pause holds them, its ``TENANT_CONCURRENCY`` caps
them with its other runs, and it shares its fair share with them, so a tenant cannot fan out
system runs to escape its pause or its cap.
"""

from __future__ import annotations

from datetime import datetime
from io import StringIO
from typing import Any

import pytest
from django.conf import settings
from django.core.management import call_command
from django.test import override_settings

from kumiko_jobs import transport
from kumiko_jobs.core import conf
from kumiko_jobs.models import JobAttempt, JobRun, RunStatus
from kumiko_jobs.worker import Worker
from tests import slot_harness
from tests.conftest import probes, work
from tests.testapp import jobs

pytestmark = pytest.mark.usefixtures("live_db")

SYSTEM = jobs.tenant_started_system.name


def command(*args: str) -> str:
    out = StringIO()
    call_command("kumiko_jobs", *args, stdout=out)
    return out.getvalue()


def system_runs() -> list[JobRun]:
    return list(JobRun.objects.filter(job_name=SYSTEM).order_by("queued_at"))


def test_a_paused_tenant_s_system_run_waits_until_the_tenant_is_resumed(tenants: Any) -> None:
    """t1's run starts a system run; t1 is paused before a worker takes it. The worker runs
    t2's run and leaves the system run waiting (queued, no attempt, shown as paused by t1);
    after ``resume --tenant t1`` it runs, as a system run (public schema, no tenant on its
    row). Proven able to fail: with the message in the system's bucket (``message_for``'s
    bucket of ``envelope.schema``) the system run runs while t1 is paused."""
    from kumiko_jobs.admin.display import RunDisplay

    starter = jobs.starts_system_runs.enqueue(tenant="t1", tag="starter")
    queue = transport.get_queue("default")
    Worker([queue], connection=queue.connection).work(burst=True, max_jobs=1)
    assert JobRun.objects.get(pk=starter.run_id).status == RunStatus.SUCCEEDED
    [started] = system_runs()
    assert (started.schema_name, started.flow_schema) == ("", "t1")
    assert started.status == RunStatus.QUEUED

    assert command("pause", "--tenant", "t1") == "paused tenant t1\n"
    control = jobs.probe.enqueue(tenant="t2", tag="control")
    work()
    assert JobRun.objects.get(pk=control.run_id).status == RunStatus.SUCCEEDED
    started.refresh_from_db()
    assert started.status == RunStatus.QUEUED and not started.attempt_set.exists()
    assert "tenant t1" in RunDisplay().status_label(started)  # why it waits
    # another tenant's pause does not hold it
    assert command("pause", "--tenant", "t2") == "paused tenant t2\n"
    assert command("resume", "--tenant", "t1") == "resumed tenant t1\n"
    work()
    started.refresh_from_db()
    assert started.status == RunStatus.SUCCEEDED, started.error_message
    assert started.result == "public"  # still a system run
    assert [p.tag for p in probes("t1")] == ["starter"]


def _spans(tenant: str) -> list[tuple[datetime, datetime]]:
    """(start, finish) of the attempts of ``tenant``'s runs and of the system runs they
    started."""
    rows = JobAttempt.objects.select_related("run")
    return [
        (a.started_at, a.finished_at)
        for a in rows
        if tenant in (a.run.schema_name, a.run.flow_schema)
    ]


def _most_at_once(spans: list[tuple[datetime, datetime]]) -> int:
    events = sorted([(s, 1) for s, _ in spans] + [(f, -1) for _, f in spans])
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    return peak


def test_a_tenant_at_its_cap_gets_no_extra_run_through_a_system_job(
    tenants: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TENANT_CONCURRENCY=1, one worker of three slots: t1's run starts four system runs of
    0.4 s, t2's run one. No two of t1's runs (its own and the system runs it started) ever
    run at once, nor t2's, while t1's and t2's run beside each other (the cap holds each
    tenant, not the system). Proven able to fail: without the tenant's cap on the system runs
    (``caps_of`` without ``flow``) two of t1's run at once (and with them in the system's
    bucket, as before, too)."""
    if slot_harness.slots_wanted() > 1:
        pytest.skip("makes its own slots; KUMIKO_TEST_SLOTS pins a suite's runs to one")
    monkeypatch.setenv(conf.CONCURRENCY_ENV, "3")
    with override_settings(KUMIKO_JOBS={**settings.KUMIKO_JOBS, "TENANT_CONCURRENCY": 1}):
        jobs.starts_system_runs.enqueue(tenant="t1", tag="a", count=4, seconds=0.4)
        jobs.starts_system_runs.enqueue(tenant="t2", tag="b", count=1, seconds=0.4)
        work()
    runs = system_runs()
    assert len(runs) == 5 and {r.status for r in runs} == {RunStatus.SUCCEEDED}
    assert sorted(r.flow_schema for r in runs) == ["t1", "t1", "t1", "t1", "t2"]
    assert all(r.schema_name == "" and r.result == "public" for r in runs)
    assert _most_at_once(_spans("t1")) == 1, _spans("t1")
    assert _most_at_once(_spans("t2")) == 1, _spans("t2")
    assert _most_at_once(_spans("t1") + _spans("t2")) == 2  # the tenants side by side


def test_a_relayed_system_run_still_waits_for_its_tenant_s_resume(
    tenants: Any, redis_conn: Any
) -> None:
    """The system run t1's run started loses its message (Redis flushed) and is pushed again
    by the relay, from its row: the rebuilt message is t1's too, so t1's pause holds it until
    the resume. Proven able to fail: without the row's ``flow_schema`` in the rebuilt envelope
    (``messages.envelope_of``) the relayed message runs while t1 is paused."""
    from tests.integration.test_flow_end_to_end_relay import relay_all

    jobs.starts_system_runs.enqueue(tenant="t1", tag="starter")
    queue = transport.get_queue("default")
    Worker([queue], connection=queue.connection).work(burst=True, max_jobs=1)
    [started] = system_runs()
    redis_conn.flushdb()  # the message is lost; the row waits, queued
    assert command("pause", "--tenant", "t1") == "paused tenant t1\n"
    relay_all(1)
    work()
    started.refresh_from_db()
    assert started.status == RunStatus.QUEUED and not started.attempt_set.exists()
    assert command("resume", "--tenant", "t1") == "resumed tenant t1\n"
    work()
    started.refresh_from_db()
    assert started.status == RunStatus.SUCCEEDED, started.error_message


def test_a_held_tenant_started_run_does_not_hold_the_system_s_own_runs_back(
    tenants: Any,
) -> None:
    """The run a paused tenant's run started waits for that tenant; it must not stand in for
    the system's own runs of the job: not as the running run ``concurrency="skip"`` skips
    for, and not as the run a unique key already covers. Proven able to fail: with
    admission counting every system row, and the key without the flow tenant, the system's
    enqueues were recorded ``skipped`` and handed back t1's waiting run."""
    starter = jobs.starts_skip_and_unique.enqueue(tenant="t1", tag="starter")
    queue = transport.get_queue("default")
    Worker([queue], connection=queue.connection).work(burst=True, max_jobs=1)
    assert JobRun.objects.get(pk=starter.run_id).status == RunStatus.SUCCEEDED
    assert command("pause", "--tenant", "t1") == "paused tenant t1\n"
    [held_skip] = JobRun.objects.filter(job_name=jobs.tenant_started_skip.name)
    [held_unique] = JobRun.objects.filter(job_name=jobs.tenant_started_unique.name)
    assert (held_skip.flow_schema, held_unique.flow_schema) == ("t1", "t1")

    own_skip = jobs.tenant_started_skip.enqueue(tag="system")
    own_unique = jobs.tenant_started_unique.enqueue(key=1, tag="system")
    assert own_unique.run_id != held_unique.pk.hex
    work()
    for handle in (own_skip, own_unique):
        run = JobRun.objects.get(pk=handle.run_id)
        assert (run.status, run.flow_schema) == (RunStatus.SUCCEEDED, ""), run.error_message
    for held in (held_skip, held_unique):
        held.refresh_from_db()
        assert held.status == RunStatus.QUEUED  # still t1's, still paused

    assert command("resume", "--tenant", "t1") == "resumed tenant t1\n"
    work()
    for held in (held_skip, held_unique):
        held.refresh_from_db()
        assert held.status == RunStatus.SUCCEEDED, held.error_message


def test_an_operator_s_retry_of_such_a_run_still_counts_against_its_tenant(tenants: Any) -> None:
    """An operator cancels the waiting system run t1's run started, then retries it: the new
    run is still t1's (its pause holds it), not a system run free of t1's flow control.
    Proven able to fail: without ``flow`` through ``submit``, the retry ran while t1 was
    paused."""
    from kumiko_jobs import operations

    jobs.starts_system_runs.enqueue(tenant="t1", tag="starter")
    queue = transport.get_queue("default")
    Worker([queue], connection=queue.connection).work(burst=True, max_jobs=1)
    assert command("pause", "--tenant", "t1") == "paused tenant t1\n"
    [started] = system_runs()
    operations.cancel_run(started, by="operator")
    started.refresh_from_db()
    assert started.status == RunStatus.CANCELLED

    retry = operations.retry_run(started, by="operator")
    work()
    again = JobRun.objects.get(pk=retry.run_id)
    assert (again.schema_name, again.flow_schema) == ("", "t1")
    assert again.status == RunStatus.QUEUED  # held by t1's pause
    assert command("resume", "--tenant", "t1") == "resumed tenant t1\n"
    work()
    again.refresh_from_db()
    assert again.status == RunStatus.SUCCEEDED, again.error_message


@pytest.mark.parametrize("mode", ["purge", "anonymise"])
def test_deleting_a_tenant_forgets_the_system_runs_its_runs_started(
    tenants: Any, mode: str
) -> None:
    """A system run a tenant's run started carries that tenant's arguments: the tenant's
    deletion (``forget_tenant``, which the tenant model's deletion calls: test_retention.py)
    purges or scrubs it with the tenant's own runs, and leaves the system's and other
    tenants' runs alone. Proven able to fail: with ``forget_tenant`` looking at
    ``schema_name`` only, the secret stayed in both modes."""
    from kumiko_jobs.history import retention

    jobs.starts_system_runs.enqueue(tenant="t1", tag="card-4242")
    jobs.starts_system_runs.enqueue(tenant="t2", tag="card-1111")
    own = jobs.tenant_started_system.enqueue(tag="system")
    work()
    [started] = JobRun.objects.filter(job_name=SYSTEM, flow_schema="t1")
    assert started.status == RunStatus.SUCCEEDED and "card-4242" in str(started.payload)
    with override_settings(KUMIKO_JOBS={**settings.KUMIKO_JOBS, "TENANT_DELETION": mode}):
        retention.forget_tenant("t1")
    left = JobRun.objects.filter(pk=started.pk)
    if mode == "purge":
        assert not left.exists()
    else:
        assert left.get().payload == {} and left.get().subject == ""
    [other] = JobRun.objects.filter(job_name=SYSTEM, flow_schema="t2")
    assert "card-1111" in str(other.payload)
    assert JobRun.objects.get(pk=own.run_id).payload != {}
