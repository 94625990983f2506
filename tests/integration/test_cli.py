"""``manage.py kumiko_jobs``: enqueue, runs (with filters), retry, cancel; errors name flags.

Real PostgreSQL, Redis and an in-process RQ worker; the command runs through call_command.
"""

from __future__ import annotations

import uuid
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from kumiko_jobs.admin.tenant_acts import started_by_operator
from kumiko_jobs.management.cli.common import operator
from kumiko_jobs.models import JobRun, RunStatus
from tests.conftest import kumiko_jobs_command, work
from tests.testapp import jobs

pytestmark = pytest.mark.usefixtures("live_db")


def cli(*args: str) -> str:
    out = StringIO()
    call_command("kumiko_jobs", *args, stdout=out)
    return out.getvalue()


def rid(run_id: object) -> str:
    """Run ids as the CLI prints them (UUIDs with dashes)."""
    return str(uuid.UUID(str(run_id)))


def test_enqueue_without_tenant_names_the_flag(tenants):
    with pytest.raises(CommandError) as raised:
        cli("enqueue", jobs.probe.name, "--kwargs", '{"tag": "x"}')
    message = str(raised.value)
    assert "--tenant" in message and "tenant=" not in message
    assert not JobRun.objects.exists()  # nothing half-written


def test_enqueue_then_runs_with_filters(tenants):
    out = cli("enqueue", jobs.probe.name, "--tenant", "t1", "--kwargs", '{"tag": "cli"}')
    assert out.startswith("queued run ") and f"of {jobs.probe.name} for t1" in out
    by_hand = JobRun.objects.get(job_name=jobs.probe.name)
    assert by_hand.trigger == f"manual by {operator()}" and started_by_operator(by_hand, "t1")
    failed = jobs.flaky.enqueue(tenant="t2", tag="cli-bad", fail_times=99)
    work(scheduler_rounds=3)
    ok = JobRun.objects.get(job_name=jobs.probe.name)
    assert ok.status == RunStatus.SUCCEEDED

    listed = cli("runs")
    assert listed.splitlines()[0].split()[:3] == ["run", "id", "job"]
    assert str(ok.run_id) in listed and rid(failed.run_id) in listed

    only_failed = cli("runs", "--status", "failed")
    assert rid(failed.run_id) in only_failed and str(ok.run_id) not in only_failed
    assert "boom on attempt" in only_failed  # the error column

    by_tenant = cli("runs", "--tenant", "t1", "--job", jobs.probe.name, "--since", "1h")
    assert str(ok.run_id) in by_tenant and rid(failed.run_id) not in by_tenant
    assert cli("runs", "--tenant", "t3") == "no runs match\n"
    assert len(cli("runs", "--limit", "1").splitlines()) == 2  # header + one row

    with pytest.raises(CommandError, match="--since"):
        cli("runs", "--since", "yesterday")


def test_retry_a_failed_run_and_refuse_a_succeeded_one(tenants):
    bad = jobs.flaky.enqueue(tenant="t1", tag="cli-retry", fail_times=99)
    good = jobs.probe.enqueue(tenant="t1", tag="cli-good")
    work(scheduler_rounds=3)
    assert JobRun.objects.get(pk=bad.run_id).status == RunStatus.FAILED

    out = cli("retry", bad.run_id)
    assert out.startswith(f"run {rid(bad.run_id)} retried as run ")
    new = JobRun.objects.exclude(pk__in=(bad.run_id, good.run_id)).get()
    # The operator's retry, by the login that typed it: not a tenant member's to cancel.
    assert new.trigger == f"retry:{rid(bad.run_id)} by {operator()}" and new.payload == {
        "tag": "cli-retry",
        "fail_times": 99,
    }
    assert started_by_operator(new, "t1")
    with pytest.raises(CommandError, match="only failed or cancelled runs can be retried"):
        cli("retry", good.run_id)
    with pytest.raises(CommandError, match="not a run id"):
        cli("retry", "nope")


def test_cancel_a_waiting_run_at_once_and_refuse_a_finished_one(tenants):
    """(Running runs are asked to stop: test_cancel_running.py.)"""
    waiting = jobs.probe.enqueue_in(3600, tenant="t1", tag="cli-wait")
    out = cli("cancel", waiting.run_id)
    assert out == f"cancelled run {rid(waiting.run_id)} (it had not started)\n"
    assert JobRun.objects.get(pk=waiting.run_id).status == RunStatus.CANCELLED

    done = jobs.probe.enqueue(tenant="t1", tag="cli-done")
    work()
    with pytest.raises(CommandError, match="has already finished"):
        cli("cancel", done.run_id)
    assert JobRun.objects.get(pk=done.run_id).status == RunStatus.SUCCEEDED


def typed(*args: str) -> str:
    done = kumiko_jobs_command(*args)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_command_line_says_what_an_enqueue_without_tenant_makes(tenants):
    """A per-tenant job enqueued without --tenant fans out: the line says so (it said "for
    system"), ``list`` names the kind and the schedule, and each subcommand's --help has its
    description and says what omitting --tenant does."""
    out = typed("enqueue", jobs.fanned.name, "--kwargs", '{"tag": "cli-fan"}')
    assert out.endswith(f"of {jobs.fanned.name} for every tenant (a fan-out)\n"), out
    parent = JobRun.objects.get(job_name=jobs.fanned.name)
    assert parent.schema_name == ""
    work()
    children = JobRun.objects.filter(parent_run_id=parent.run_id)
    assert sorted(children.values_list("schema_name", flat=True)) == ["t1", "t2", "t3"]

    listed = {line.split()[0]: line.split() for line in typed("list").splitlines()}
    assert listed["job"] == ["job", "queue", "retries", "kind", "cron", "grants"]
    assert listed[jobs.fanned.name][3:5] == ["per-tenant", "-"]
    assert listed[jobs.every_minute.name][3:] == [
        "per-tenant",
        "*",
        "*",
        "*",
        "*",
        "*",
        "(UTC)",
        "-",
    ]
    assert listed[jobs.probe.name][3] == "tenant"

    helped = " ".join(typed("enqueue", "--help").split())
    assert "enqueue a job" in helped.lower() and "fan it out to every tenant" in helped
