"""``manage.py kumiko_jobs pause`` / ``resume`` as a user types them (docs/reference.md,
"Management commands"), with ``manage.py rqworker default --burst`` processes doing the work.

Each command is its own process with the suite's settings, database and Redis
(``worker_env``); the workers too. What is asserted is what a user sees: the commands' words
and exit codes, and the runs' statuses in the history (the paused tenant's runs stay queued,
in order, with no attempt spent, and run after ``resume``; everyone else's run meanwhile).
Bad input ends with exit status 1, one sentence naming the fix, no traceback, and no pause
written.

Seen failing with the dequeue's paused-tenant check disabled in transport/fair.py: the paused
tenant's runs ran during the pause.
"""

from __future__ import annotations

import subprocess

import pytest

from kumiko_jobs.models import FlowPause, JobRun, RunStatus
from tests.conftest import kumiko_jobs_command, start_rqworker
from tests.testapp import jobs

pytestmark = pytest.mark.usefixtures("live_db")


def kumiko_jobs(*args: str) -> subprocess.CompletedProcess[str]:
    """``python manage.py kumiko_jobs ARGS``, its own process."""
    return kumiko_jobs_command(*args, timeout=120)


def burst() -> None:
    """``python manage.py rqworker default --burst``: drains what it may run, then exits."""
    worker = start_rqworker("default", "--burst")
    output, _ = worker.communicate(timeout=180)
    assert worker.returncode == 0, output


def statuses(schema: str) -> list[tuple[str, str, int]]:
    """(tag, status, attempts) of the probe runs of ``schema``, in enqueue order."""
    return [
        (payload["tag"], status, attempts)
        for payload, status, attempts in JobRun.objects.filter(
            schema_name=schema, job_name=jobs.probe.name
        )
        .order_by("queued_at")
        .values_list("payload", "status", "attempts")
    ]


def test_pause_a_tenant_from_the_command_line_then_resume_it(tenants):
    paused = kumiko_jobs("pause", "--tenant", "t1")
    assert (paused.returncode, paused.stdout) == (0, "paused tenant t1\n"), paused.stderr
    for i in range(3):
        jobs.probe.enqueue(tenant="t1", tag=f"t1-{i}")
        jobs.probe.enqueue(tenant="t2", tag=f"t2-{i}")
    burst()
    assert statuses("t2") == [(f"t2-{i}", RunStatus.SUCCEEDED, 1) for i in range(3)]
    assert statuses("t1") == [(f"t1-{i}", RunStatus.QUEUED, 0) for i in range(3)]

    listed = kumiko_jobs("runs", "--tenant", "t1")
    assert listed.returncode == 0, listed.stderr
    rows = listed.stdout.splitlines()[1:]
    assert len(rows) == 3 and all("queued, paused (tenant t1)" in r for r in rows), listed.stdout

    again = kumiko_jobs("pause", "--tenant", "t1")
    assert (again.returncode, again.stdout) == (0, "tenant t1 was paused already\n")
    resumed = kumiko_jobs("resume", "--tenant", "t1")
    assert (resumed.returncode, resumed.stdout) == (0, "resumed tenant t1\n"), resumed.stderr
    burst()
    assert statuses("t1") == [(f"t1-{i}", RunStatus.SUCCEEDED, 1) for i in range(3)]
    assert not FlowPause.objects.exists()


def test_pause_one_job_in_one_tenant_from_the_command_line(tenants):
    paused = kumiko_jobs("pause", "--job", jobs.probe.name, "--tenant", "t1")
    assert paused.returncode == 0, paused.stderr
    jobs.probe.enqueue(tenant="t1", tag="held")
    jobs.probe.enqueue(tenant="t2", tag="other-tenant")
    jobs.list_tags.enqueue(tenant="t1", tag="other-job")  # another job of that tenant runs
    burst()
    assert statuses("t1")[0][:2] == ("held", RunStatus.QUEUED)
    assert statuses("t2") == [("other-tenant", RunStatus.SUCCEEDED, 1)]
    assert JobRun.objects.get(job_name=jobs.list_tags.name).status == RunStatus.SUCCEEDED

    resumed = kumiko_jobs("resume", "--job", jobs.probe.name, "--tenant", "t1")
    assert resumed.returncode == 0, resumed.stderr
    burst()
    assert statuses("t1")[0][:2] == ("held", RunStatus.SUCCEEDED)


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("pause", "--tenant", "nosuch"), "no tenant with schema 'nosuch'"),
        (("pause", "--queue", "nosuch"), "no queue 'nosuch' in RQ_QUEUES"),
        (("resume", "--job", "testapp.nosuch"), "Pause a registered job by its name"),
        (("pause",), "name what to pause"),
    ],
    ids=["unknown-tenant", "unknown-queue", "unknown-job", "nothing-named"],
)
def test_pause_refuses_what_names_nothing(tenants, args, words):
    result = kumiko_jobs(*args)
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert words in output and "Traceback" not in output, output
    assert not FlowPause.objects.exists()
