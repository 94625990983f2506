"""Operator actions are idempotent under concurrency, settled in PostgreSQL (issue 22).

Two simultaneous retries of a failed run (two operators, two POSTs, two bulk actions) created
two runs: the check for a pending retry was a SELECT followed by an INSERT. Now the source
run's row is locked before the check; "Run a job" derives the run's id from the form's request
id, so a second submission fails on the primary key.

Two real threads, each with its own PostgreSQL connection (Django's are per thread), real
Redis, the real admin through Django's test client. The window is made wide without mocking
anything: a ``pre_save`` receiver on ``JobRun`` makes each contender wait at a barrier just
before its INSERT, so without the fix both have passed their checks when either inserts. With
the fix the second contender never gets there while the first holds the lock: the barrier
times out (a bound on waiting, not an assertion) and the first goes on alone.

Seen failing with the fix reverted (operations.py's lock and request id, run_job.py's field):
two runs from two retries, from two bulk actions and from two submissions of one form.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import connection
from django.db.models.signals import pre_save

from kumiko_jobs import operations
from kumiko_jobs.core.exceptions import OperationRefused
from kumiko_jobs.models import JobRun, RunStatus
from tests.conftest import work
from tests.integration.test_admin import RUN_JOB, RUNS, client_for, make_user
from tests.testapp import jobs

pytestmark = pytest.mark.usefixtures("live_db")

CONTENDER = "contender"
# How long a contender waits at the barrier for the other; with the fix the other is blocked
# in PostgreSQL (or refused) and never comes, and this is how long the first one waits alone.
BARRIER_WAIT = 3.0


@pytest.fixture
def barrier_before_insert() -> Iterator[threading.Barrier]:
    """Each contender thread waits here just before it inserts a run row."""
    barrier = threading.Barrier(2)

    def wait(sender: Any, **kwargs: Any) -> None:
        if threading.current_thread().name.startswith(CONTENDER):
            # Broken when the other contender never comes (blocked in PostgreSQL, or refused).
            with contextlib.suppress(threading.BrokenBarrierError):
                barrier.wait(timeout=BARRIER_WAIT)

    pre_save.connect(wait, sender=JobRun, dispatch_uid="test-barrier-before-insert")
    yield barrier
    pre_save.disconnect(sender=JobRun, dispatch_uid="test-barrier-before-insert")


def at_once(*calls: Callable[[], Any]) -> list[Any]:
    """Run ``calls`` in threads started together; each result, or the exception it raised."""
    start = threading.Barrier(len(calls))
    results: list[Any] = [None] * len(calls)

    def contend(i: int, call: Callable[[], Any]) -> None:
        start.wait()
        try:
            results[i] = call()
        except Exception as exc:
            results[i] = exc
        finally:
            connection.close()  # this thread's own connection

    threads = [
        threading.Thread(target=contend, args=(i, c), name=f"{CONTENDER}-{i}")
        for i, c in enumerate(calls)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not any(t.is_alive() for t in threads)
    return results


@pytest.fixture
def failed_run(tenants: dict[str, Any]) -> JobRun:
    handle = jobs.flaky.enqueue(tenant="t1", tag="retry-me", fail_times=99)
    work()
    run = JobRun.objects.get(pk=handle.run_id)
    assert run.status == RunStatus.FAILED
    return run


def retries_of(run: JobRun) -> list[JobRun]:
    return list(JobRun.objects.filter(trigger__startswith=f"retry:{run.run_id}"))


def test_two_simultaneous_retries_start_one_run(failed_run, barrier_before_insert):
    results = at_once(
        lambda: operations.retry_run(JobRun.objects.get(pk=failed_run.pk), by="ops-a"),
        lambda: operations.retry_run(JobRun.objects.get(pk=failed_run.pk), by="ops-b"),
    )
    assert len(retries_of(failed_run)) == 1
    refused = [r for r in results if isinstance(r, OperationRefused)]
    assert len(refused) == 1 and "already being retried" in str(refused[0])


def test_two_simultaneous_bulk_retries_in_the_admin_start_one_run(
    failed_run, barrier_before_insert
):
    user = make_user("public", "operator", superuser=True)
    first, second = (client_for("localhost", "public", user) for _ in range(2))
    data = {"action": "retry_selected", "_selected_action": [str(failed_run.pk)]}
    responses = at_once(lambda: first.post(RUNS, data), lambda: second.post(RUNS, data))
    assert [r.status_code for r in responses] == [302, 302]
    assert len(retries_of(failed_run)) == 1


def test_a_retry_after_the_first_finished_is_still_allowed(failed_run):
    """The lock does not make a run retryable once only: a retry that has itself failed leaves
    the original retryable again (the rule is "no retry pending")."""
    first = operations.retry_run(failed_run)
    work()
    assert JobRun.objects.get(pk=first.run_id).status == RunStatus.FAILED
    operations.retry_run(JobRun.objects.get(pk=failed_run.pk))
    assert len(retries_of(failed_run)) == 2


def test_a_retry_of_a_run_deleted_meanwhile_is_refused(failed_run):
    JobRun.objects.filter(pk=failed_run.pk).delete()
    with pytest.raises(OperationRefused, match="no longer exists"):
        operations.retry_run(failed_run)
    assert retries_of(failed_run) == []


@pytest.fixture
def run_job_form(tenants: dict[str, Any]) -> tuple[Any, dict[str, str]]:
    """An operator's client and the "Run a job" form's data as the page rendered it."""
    operator = client_for("localhost", "public", make_user("public", "operator", superuser=True))
    page = operator.get(RUN_JOB)
    # (.get: with the fix reverted the form has no such field, and the tests below fail.)
    field = page.context["form"].fields.get("request")
    request_id = field.initial if field is not None else "9b0c5f4e-0000-4000-8000-000000000000"
    data = {
        "job": "billing.sync_invoice",
        "tenant": "t1",
        "arguments": '{"invoice_id": 7}',
        "request": str(request_id),
    }
    return operator, data


def test_the_same_run_a_job_form_submitted_twice_queues_once(run_job_form):
    operator, data = run_job_form
    assert operator.post(RUN_JOB, data).status_code == 302
    again = operator.post(RUN_JOB, data)
    assert again.status_code == 200
    assert "This request was already submitted" in again.content.decode()
    assert JobRun.objects.count() == 1


def test_the_same_run_a_job_form_submitted_twice_at_once_queues_once(
    run_job_form, barrier_before_insert
):
    operator, data = run_job_form
    responses = at_once(lambda: operator.post(RUN_JOB, data), lambda: operator.post(RUN_JOB, data))
    assert sorted(r.status_code for r in responses) == [200, 302]
    assert JobRun.objects.count() == 1


def test_two_forms_are_two_requests(run_job_form):
    """Calibration: the request id tells two forms apart; it does not make a job run once."""
    operator, data = run_job_form
    assert operator.post(RUN_JOB, data).status_code == 302
    assert operator.post(RUN_JOB, {**data, "request": ""}).status_code == 302
    assert JobRun.objects.count() == 2


def test_two_simultaneous_cancels_cancel_once(tenants):
    """Cancel was already one conditional UPDATE (kept here so that it stays so): one of two
    simultaneous cancels of a waiting run cancels it, the other finds it finished."""
    handle = jobs.probe.enqueue(tenant="t1", tag="cancel-me")
    results = at_once(
        lambda: operations.cancel_run(JobRun.objects.get(pk=handle.run_id), by="ops-a"),
        lambda: operations.cancel_run(JobRun.objects.get(pk=handle.run_id), by="ops-b"),
    )
    assert sorted(results) == ["", operations.CANCELLED]
    run = JobRun.objects.get(pk=handle.run_id)
    assert run.status == RunStatus.CANCELLED and run.cancel_requested_by in ("ops-a", "ops-b")
