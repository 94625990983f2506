"""Results and handles by id are read in the caller's tenant only (issue 22).

A run id travels (a URL, a form, a cache), so holding one proves nothing: from tenant one's
context (its domain, ``tenant_context()``, one of its runs) tenant two's run is "does not exist",
exactly as an id no run has. Operators (the public schema) read any run, and only they get
tracebacks. Tenant two's run is checked through the test's second connection: it exists, with
the arguments and the result an answer would have leaked.

Each attack here got through before ``history.run_reads`` (proved by reverting
``load_run``'s tenant filter and ``get_result``'s use of it: every "does not exist" below
then returned tenant two's result, arguments and traceback).
"""

from __future__ import annotations

from io import StringIO
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.conf import settings
from django.core.management import call_command
from django.tasks import TaskResultStatus, default_task_backend
from django.tasks.exceptions import TaskResultDoesNotExist
from django.test import Client, override_settings
from django_tenants.utils import schema_context, tenant_context

from kumiko_jobs.enqueueing.handle import RunHandle
from kumiko_jobs.models import JobRun, RunStatus
from tests.conftest import work
from tests.guardapp import support
from tests.testapp import async_jobs, tasks

pytestmark = pytest.mark.usefixtures("live_db")

ROLES_ON = {**settings.KUMIKO_JOBS, "DB_ROLES": True}
ROLES_OFF = {**settings.KUMIKO_JOBS, "DB_ROLES": False}


@pytest.fixture
def mode(request: pytest.FixtureRequest, tenants: Any) -> dict[str, Any]:
    """The settings of a roles/no-roles case; with roles on, the tenants' roles exist also
    when the suite runs without them (KUMIKO_TEST_DB_ROLES=0)."""
    chosen: dict[str, Any] = request.param
    if chosen["DB_ROLES"] and not settings.KUMIKO_JOBS["DB_ROLES"]:
        with override_settings(KUMIKO_JOBS=chosen):
            call_command("kumiko_jobs", "roles", stdout=StringIO())
    return chosen


@pytest.fixture
def finished(tenants: Any) -> dict[str, Any]:
    """A succeeded task run and a failed one in t2, a succeeded one in t1, and a @job run in t2."""
    with schema_context("t2"):
        theirs = tasks.add.enqueue(40, 2)
        failed = tasks.always_fails.enqueue()
    with schema_context("t1"):
        ours = tasks.add.enqueue(1, 2)
    job = async_jobs.returns.enqueue(tenant="t2", kind="dict")
    work(scheduler_rounds=3)
    return {"theirs": theirs, "failed": failed, "ours": ours, "job": job}


def _row(observer: support.Observer, run_id: str) -> tuple[Any, ...]:
    rows = observer.rows(
        "SELECT schema_name, status, payload, result FROM public.kumiko_jobs_jobrun "
        "WHERE run_id = %s",
        (run_id,),
    )
    assert len(rows) == 1
    return rows[0]


def test_the_other_tenants_result_does_not_exist_from_a_tenants_context(
    finished: dict[str, Any], tenants: dict[str, Any], observer: support.Observer
) -> None:
    theirs = finished["theirs"]
    # It exists, with what an answer would leak (read through the second connection).
    schema, status, payload, result = _row(observer, theirs.id)
    assert (schema, status, payload["args"], result) == ("t2", "succeeded", [40, 2], 42)

    with tenant_context(tenants["t1"]):
        for ask in (
            lambda: default_task_backend.get_result(theirs.id),
            lambda: tasks.add.get_result(theirs.id),
            lambda: async_to_sync(default_task_backend.aget_result)(theirs.id),
            lambda: async_to_sync(tasks.add.aget_result)(theirs.id),
            theirs.refresh,
        ):
            with pytest.raises(TaskResultDoesNotExist) as refused:
                ask()
            # Nothing of the run but its id (whose hex digits may spell "42" by chance).
            said = str(refused.value).replace(theirs.id, "")
            assert "42" not in said and "40" not in said
        # The same answer as for an id no run has.
        with pytest.raises(TaskResultDoesNotExist):
            default_task_backend.get_result("0" * 32)
        # Its own runs it reads.
        assert tasks.add.get_result(finished["ours"].id).return_value == 3

    # Tenant two itself, and the operators, read it.
    with schema_context("t2"):
        assert tasks.add.get_result(theirs.id).return_value == 42
    assert tasks.add.get_result(theirs.id).return_value == 42


def test_a_handle_of_the_other_tenants_run_does_not_exist_from_a_tenants_context(
    finished: dict[str, Any], observer: support.Observer
) -> None:
    job = finished["job"]
    assert _row(observer, job.run_id)[:2] == ("t2", "succeeded")
    handle = RunHandle(run_id=job.run_id, job_name=job.job_name, schema_name="t2")
    with schema_context("t1"), pytest.raises(JobRun.DoesNotExist):
        handle.refresh()
    assert handle.status == RunStatus.QUEUED and handle.result is None  # nothing copied
    with schema_context("t1"), pytest.raises(JobRun.DoesNotExist):
        async_to_sync(handle.arefresh)()
    with schema_context("t2"):
        assert handle.refresh().status == RunStatus.SUCCEEDED
    assert handle.refresh().result == {"total": 3, "items": ["a", "b"], "ok": True}


def test_a_tenant_gets_no_traceback_operators_do(finished: dict[str, Any]) -> None:
    """Django's TaskError carries a traceback; kumiko's admin shows tracebacks and error texts to
    operators only, so a tenant's context gets the exception's class and a pointer."""
    failed = finished["failed"]
    with schema_context("t2"):
        mine = default_task_backend.get_result(failed.id)
    assert mine.status == TaskResultStatus.FAILED
    assert [e.exception_class for e in mine.errors] == [ValueError] * 3
    for error in mine.errors:
        assert "never works" not in error.traceback
        assert "Traceback" not in error.traceback and "File " not in error.traceback
        assert "kept for operators" in error.traceback
    operators = default_task_backend.get_result(failed.id)
    assert all("never works" in e.traceback for e in operators.errors)
    assert all("Traceback (most recent call last)" in e.traceback for e in operators.errors)


def _on_domain(host: str) -> Client:
    return Client(HTTP_HOST=host)


@override_settings(ROOT_URLCONF="tests.testapp.urls")
def test_a_task_status_view_on_tenant_ones_domain_never_shows_tenant_twos_result(
    finished: dict[str, Any], observer: support.Observer
) -> None:
    """An ordinary view that passes the URL's id to ``get_result()``, asked by an anonymous
    visitor of t1's domain for t2's run (issue 22: it returned t2's result)."""
    theirs, ours, failed = finished["theirs"], finished["ours"], finished["failed"]
    assert _row(observer, theirs.id)[3] == 42
    t1 = _on_domain("t1.localhost")
    for run_id in (theirs.id, failed.id, finished["job"].run_id):
        response = t1.get(f"/tasks/{run_id}/")
        assert response.status_code == 404, response.content
        assert b"42" not in response.content and b"never works" not in response.content
        assert t1.get(f"/runs/{run_id}/").status_code == 404

    mine = t1.get(f"/tasks/{ours.id}/")
    assert mine.status_code == 200 and mine.json()["return_value"] == 3
    assert t1.get(f"/runs/{ours.id}/").json()["result"] == 3

    t2 = _on_domain("t2.localhost")
    assert t2.get(f"/tasks/{theirs.id}/").json()["return_value"] == 42
    errors = t2.get(f"/tasks/{failed.id}/").json()["errors"]
    assert [e["class"] for e in errors] == ["builtins.ValueError"] * 3
    assert not any("never works" in e["traceback"] for e in errors)


# --- inside a run: a task reads results by id (both DB_ROLES modes) ------------------------------


@pytest.mark.parametrize("mode", [ROLES_ON, ROLES_OFF], ids=["roles", "no-roles"], indirect=True)
def test_a_task_reads_its_own_tenants_results_during_its_run_and_not_the_others(
    finished: dict[str, Any], mode: dict[str, Any], observer: support.Observer
) -> None:
    """Under DB_ROLES the body's login holds nothing on kumiko's tables (issue 23: "permission
    denied for table kumiko_jobs_jobrun"); kumiko reads for it on the project's connection, with
    the run's tenant fixed from its envelope, so t2's run stays out of reach."""
    theirs, ours = finished["theirs"], finished["ours"]
    assert _row(observer, theirs.id)[3] == 42
    with override_settings(KUMIKO_JOBS=mode):
        with schema_context("t1"):
            own_tenant = tasks.reads_result.enqueue(ours.id)
            other_tenant = tasks.reads_result.enqueue(theirs.id)
            own_run = tasks.reads_own_result.enqueue()
            handle_other = tasks.refreshes_run.enqueue(finished["job"].run_id)
            handle_own = tasks.refreshes_run.enqueue(ours.id)
            async_own = tasks.areads_result.enqueue(ours.id)
            async_other = tasks.areads_result.enqueue(theirs.id)
        work()
    results = {
        name: tasks.reads_result.get_result(r.id)
        for name, r in (("own_tenant", own_tenant), ("other_tenant", other_tenant))
    }
    assert all(r.status == TaskResultStatus.SUCCESSFUL for r in results.values()), [
        r.errors for r in results.values()
    ]
    assert results["own_tenant"].return_value == {
        "found": True,
        "status": "SUCCESSFUL",
        "args": [1, 2],
        "value": 3,
    }
    assert results["other_tenant"].return_value == {"found": False}
    own = tasks.reads_own_result.get_result(own_run.id)
    assert own.status == TaskResultStatus.SUCCESSFUL, own.errors
    assert own.return_value == {"found": True, "status": "RUNNING", "args": []}
    assert tasks.areads_result.get_result(async_own.id).return_value == {
        "found": True,
        "status": "SUCCESSFUL",
    }
    assert tasks.areads_result.get_result(async_other.id).return_value == {"found": False}
    assert tasks.refreshes_run.get_result(handle_other.id).return_value == {"found": False}
    assert tasks.refreshes_run.get_result(handle_own.id).return_value == {
        "found": True,
        "status": "succeeded",
        "result": 3,
    }


ROLES_ONLY = {**ROLES_ON, "DB_GUARD": "log"}


@pytest.mark.parametrize(
    "mode",
    [ROLES_ON, ROLES_OFF, ROLES_ONLY],
    ids=["roles", "no-roles", "roles-only"],
    indirect=True,
)
def test_the_tenants_own_reads_of_the_history_are_still_refused(
    finished: dict[str, Any], mode: dict[str, Any]
) -> None:
    """The read above is kumiko's, on the project's connection with the guard stepped aside:
    the body's own SQL on kumiko's table is still refused, by the classifier in both modes
    (issue 22: before, with DB_ROLES off it counted every tenant's runs) and, with the
    classifier only logging, by PostgreSQL (nothing was granted to the tenant's role)."""
    with override_settings(KUMIKO_JOBS=mode):
        with schema_context("t1"):
            result = tasks.counts_runs_by_sql.enqueue()
        work()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    run = JobRun.objects.get(pk=result.id)
    assert "kumiko_jobs_jobrun" in run.error_message
    if mode.get("DB_GUARD") == "log":
        assert "permission denied" in run.error_message
    else:
        assert run.error_type == "DatabaseAccessDenied"
        assert "kumiko's own table" in run.error_message


@pytest.mark.parametrize("mode", [ROLES_ON, ROLES_OFF], ids=["roles", "no-roles"], indirect=True)
def test_a_task_that_switches_to_the_other_tenants_schema_still_reads_its_own_tenant_only(
    finished: dict[str, Any], mode: dict[str, Any], observer: support.Observer
) -> None:
    """The run's tenant comes from its signed envelope, not from the connection the body can
    switch (``schema_context("t2")`` inside the body): t2's run stays "does not exist" (with
    roles on the read is kumiko's own, on the project's connection in the run's schema; with
    them off, the guard refuses the switched connection and the run fails). Taken from the
    connection instead, the roles case read t2's result (proved by reverting reader_schema)."""
    theirs = finished["theirs"]
    assert _row(observer, theirs.id)[3] == 42
    with override_settings(KUMIKO_JOBS=mode):
        with schema_context("t1"):
            switched = tasks.reads_result_as.enqueue("t2", theirs.id)
        work()
    result = tasks.reads_result_as.get_result(switched.id)
    leaked = result.status == TaskResultStatus.SUCCESSFUL and result.return_value != {
        "found": False
    }
    assert not leaked, result.return_value
    if result.status == TaskResultStatus.FAILED:
        run = JobRun.objects.get(pk=switched.id)
        assert run.error_type == "DatabaseAccessDenied", run.error_message
