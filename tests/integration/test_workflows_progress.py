"""``ctx.progress`` through real workers: kept in memory, written at most every
``PROGRESS_INTERVAL`` seconds while running and with the finish (one statement, not one per
call), validated, and shown in the admin to both audiences (docs/workflows.md, "Progress")."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import connection
from django.test import override_settings

import kumiko_jobs
from kumiko_jobs.models import JobRun, RunStatus
from tests.conftest import work
from tests.integration.audiences import RUNS, TENANT_STAFF_PERMS
from tests.integration.test_admin import client_for, make_user
from tests.integration.test_run_sql import _kind, recording
from tests.testapp import jobs
from tests.testapp import workflow_jobs as wf

pytestmark = pytest.mark.usefixtures("live_db")

NO_ROLES = {**settings.KUMIKO_JOBS, "DB_ROLES": False}


def _progress_writes(sqls: list[str]) -> list[str]:
    return [s for s in sqls if s.startswith("UPDATE") and '"progress"' in s]


# Counted on the test's connection, which the body shares only with DB_ROLES off.
@override_settings(KUMIKO_JOBS={**NO_ROLES, "PROGRESS_INTERVAL": 60})
def test_five_hundred_reports_cost_one_interim_write_and_the_last_rides_the_finish(
    tenants: Any,
) -> None:
    handle = wf.progressing.enqueue(tenant="t1", tag="p", reports=500)
    with recording() as statements:
        work()
    run = JobRun.objects.get(pk=handle.run_id)
    assert run.status == RunStatus.SUCCEEDED
    assert (run.progress, run.progress_message) == (1.0, "row 500 of 500")
    sqls = statements.of(run.rq_job_id)
    # The first report is written at once (nothing was for 60 s), the other 499 wait in memory.
    assert len(_progress_writes(sqls)) == 1
    (finish,) = [s for s in sqls if _kind(s) == "finish"]
    assert '"progress"' in finish and '"progress_message"' in finish


@override_settings(KUMIKO_JOBS=NO_ROLES)
def test_a_run_that_never_reports_progress_sends_what_it_did(tenants: Any) -> None:
    handle = jobs.probe.enqueue(tenant="t1", tag="plain")
    with recording() as statements:
        work()
    run = JobRun.objects.get(pk=handle.run_id)
    assert [_kind(s) for s in statements.of(run.rq_job_id)] == [
        "start",
        'SET search_path = "t1","public"',
        "job",
        "reset",
        "finish",
    ]
    assert not any("progress" in s for s in statements.of(run.rq_job_id))
    assert run.progress is None and run.progress_message == ""


@override_settings(KUMIKO_JOBS={**NO_ROLES, "PROGRESS_INTERVAL": 0})
def test_progress_interval_zero_writes_only_with_the_finish(tenants: Any) -> None:
    handle = wf.progressing.enqueue(tenant="t1", tag="p", reports=20)
    with recording() as statements:
        work()
    run = JobRun.objects.get(pk=handle.run_id)
    assert _progress_writes(statements.of(run.rq_job_id)) == []
    assert (run.progress, run.progress_message) == (1.0, "row 20 of 20")


@pytest.mark.parametrize("roles", [False, True], ids=["project-login", "db-roles"])
def test_a_running_runs_progress_is_on_its_row_before_it_ends(
    tenants: Any, tmp_path: Path, roles: bool
) -> None:
    """The first report is written while the body still runs (it waits for a file), on the
    project's connection: with DB_ROLES the tenant's login could not write kumiko's row."""
    hold = tmp_path / "go"
    seen: dict[str, Any] = {}

    def watch_the_row() -> None:  # on its own connection, while the worker runs the body
        try:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and not seen:
                row = JobRun.objects.values("status", "progress", "progress_message").get(
                    pk=handle.run_id
                )
                if row["progress"] is not None:
                    seen.update(row)
                time.sleep(0.05)
        finally:
            hold.touch()
            connection.close()

    with override_settings(KUMIKO_JOBS={**settings.KUMIKO_JOBS, "DB_ROLES": roles}):
        handle = wf.progressing.enqueue(tenant="t1", tag="p", reports=4, hold=str(hold))
        watcher = threading.Thread(target=watch_the_row)
        watcher.start()
        work()
        watcher.join(30)
    assert seen == {"status": "running", "progress": 0.25, "progress_message": "row 1 of 4"}
    run = JobRun.objects.get(pk=handle.run_id)
    assert (run.status, run.progress, run.progress_message) == ("succeeded", 1.0, "row 4 of 4")


@pytest.mark.parametrize(
    ("fraction", "message", "says"),
    [
        (1.5, None, "a fraction from 0 to 1"),
        (True, None, "a fraction from 0 to 1"),
        ("half", None, "a fraction from 0 to 1"),
        (0.5, "x" * 201, "at most 200 are kept"),
        (0.5, "nul<NUL>here", "contains a NUL character"),
        (0.5, 7, "takes text"),
    ],
)
def test_a_bad_report_fails_the_run_with_what_to_pass(
    tenants: Any, fraction: Any, message: Any, says: str
) -> None:
    handle = wf.progressing.enqueue(
        tenant="t1", tag="bad", reports=0, fraction=fraction, message=message
    )
    work()
    run = JobRun.objects.get(pk=handle.run_id)
    assert run.status == RunStatus.FAILED
    assert run.error_type == "InvalidJob"
    assert says in run.error_message
    assert run.progress is None  # nothing half-written


def test_the_admin_shows_progress_to_the_operator_and_to_the_tenant(tenants: Any) -> None:
    mine = wf.progressing.enqueue(tenant="t1", tag="p", reports=5)
    theirs = wf.progressing.enqueue(tenant="t2", tag="p", reports=3)
    work()
    staff = client_for("t1.localhost", "t1", make_user("t1", "t1-staff", perms=TENANT_STAFF_PERMS))
    listing = staff.get(RUNS).content.decode()
    assert "100 %" in listing and "row 5 of 5" in listing
    assert "row 3 of 3" not in listing  # t2's run is not t1's to see
    page = staff.get(f"{RUNS}{mine.run_id}/change/").content.decode()
    assert "row 5 of 5" in page
    operator = client_for("localhost", "public", make_user("public", "op", superuser=True))
    listing = operator.get(RUNS).content.decode()
    assert "row 5 of 5" in listing and "row 3 of 3" in listing
    assert "row 3 of 3" in operator.get(f"{RUNS}{theirs.run_id}/change/").content.decode()


def test_a_workflows_page_shows_its_steps_progress(tenants: Any) -> None:
    flow = kumiko_jobs.chain(
        wf.progressing.step(tag="a", reports=4, key="a"), wf.record.step(tag="b", key="b")
    )
    handle = kumiko_jobs.workflow(flow, name="progress").enqueue(tenant="t1")
    work()
    operator = client_for("localhost", "public", make_user("public", "op", superuser=True))
    page = operator.get(f"/admin/kumiko_jobs/workflow/{handle.workflow_id}/change/")
    text = page.content.decode()
    assert page.status_code == 200
    assert "100 % · row 4 of 4" in text
