"""A later success clears every failure record of its subject (issue 23), through a real worker.

A ``TenantVisibleError`` raised by a job that declares no ``tenant_visible_failure`` records a
failure the tenant sees; before, only jobs declaring it had their failure cleared by a success,
so the tenant saw "failed" until the daily clean-up. Now the finish of every tenant success
deletes its subject's failure, in its one statement (or in the finishing transaction when it
has follow-ups to write). A success clears its own subject in its own tenant only.

Calibrated: with the clearing back under ``definition.tenant_visible_failure`` (records.py),
the two tests of an undeclared job failed (the failure row stayed) and the declared one passed.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings

from kumiko_jobs import TenantVisibleError
from kumiko_jobs.models import JobFailure, JobRun, RunStatus
from tests.conftest import work

pytestmark = pytest.mark.usefixtures("live_db")

JOB_PREFIX = "clears"


def failures() -> set[tuple[str, str]]:
    return set(JobFailure.objects.values_list("schema_name", "subject"))


def _body(ctx: Any, item: int, fail: bool, followup: Any = None) -> None:
    if fail:
        raise TenantVisibleError("testapp.generic")
    if followup is not None:
        ctx.enqueue(followup)


@pytest.fixture
def noop(declare: Any) -> Any:
    def noop(ctx: Any) -> None:
        return None

    return declare(noop)


def _fail_three_subjects(job: Any, tenants: dict[str, Any]) -> None:
    job.enqueue(tenant=tenants["t1"], item=1, fail=True)
    job.enqueue(tenant=tenants["t1"], item=2, fail=True)
    job.enqueue(tenant=tenants["t2"], item=1, fail=True)
    work()
    assert failures() == {("t1", "item=1"), ("t2", "item=1"), ("t1", "item=2")}


def test_a_success_clears_a_tenant_visible_error_of_a_job_that_declares_none(declare, tenants):
    def undeclared(ctx: Any, *, item: int, fail: bool = False) -> None:
        _body(ctx, item, fail)

    job = declare(undeclared, tenant_visible_run=["item"])
    assert job.tenant_visible_failure is None
    _fail_three_subjects(job, tenants)
    job.enqueue(tenant=tenants["t1"], item=1)
    work()
    assert JobRun.objects.filter(job_name=job.name, status=RunStatus.SUCCEEDED).count() == 1
    # Its own subject in its own tenant only: item 2 and t2's item 1 still need their tenants.
    assert failures() == {("t2", "item=1"), ("t1", "item=2")}


def test_a_success_clears_the_failure_of_a_job_that_declares_it(declare, tenants):
    def declared(ctx: Any, *, item: int, fail: bool = False) -> None:
        _body(ctx, item, fail)

    job = declare(
        declared,
        tenant_visible_failure={"message_key": "testapp.generic", "subject_fields": ["item"]},
    )
    _fail_three_subjects(job, tenants)
    job.enqueue(tenant=tenants["t2"], item=1)
    work()
    assert failures() == {("t1", "item=1"), ("t1", "item=2")}


def test_a_success_with_follow_ups_clears_it_in_its_transaction(declare, tenants, noop):
    def with_followup(ctx: Any, *, item: int, fail: bool = False) -> None:
        _body(ctx, item, fail, followup=noop)

    job = declare(with_followup, tenant_visible_run=["item"])
    _fail_three_subjects(job, tenants)
    job.enqueue(tenant=tenants["t1"], item=2)
    work()
    assert JobRun.objects.filter(job_name=noop.name, status=RunStatus.SUCCEEDED).count() == 1
    assert failures() == {("t1", "item=1"), ("t2", "item=1")}


@override_settings(KUMIKO_JOBS={**settings.KUMIKO_JOBS, "DB_ROLES": False})
@pytest.mark.parametrize("declared", [False, True], ids=["undeclared", "declared"])
def test_clearing_costs_no_statement_more(declare, tenants, declared):
    """A tenant's success is still its start and its finish, the clearing inside the finish.
    A job declaring tenant_visible_failure used to finish in a transaction: start, SET
    search_path, INSERT, UPDATE, SELECT, DELETE and the COMMIT (seen on the code before issue
    23). Counted on the test's own connection, which the body shares with DB_ROLES off."""
    from tests.integration.test_run_sql import _kind, recording

    def quiet(ctx: Any, *, item: int, fail: bool = False) -> None:
        _body(ctx, item, fail)

    visible = {"message_key": "testapp.generic", "subject_fields": ["item"]}
    job = declare(quiet, **({"tenant_visible_failure": visible} if declared else {}))
    job.enqueue(tenant=tenants["t1"], item=1, fail=True)
    work()
    assert failures() == {("t1", "item=1" if declared else "")}
    handle = job.enqueue(tenant=tenants["t1"], item=1)
    with recording() as statements:
        work()
    run = JobRun.objects.get(pk=handle.run_id)
    # The body sends nothing, so django-tenants never sets its path: the start, the session
    # reset after every run (issue 22) and the finish.
    assert [_kind(sql) for sql in statements.of(run.rq_job_id)] == ["start", "reset", "finish"]
    assert failures() == set()
