"""Bulk retry and cancel of every run matching a filter, in background batches.

Through the real admin (django-tenants' hosts: ``localhost`` public, ``t1.localhost`` tenant
t1), real PostgreSQL and Redis; the batches are the system job ``kumiko_jobs.bulk_batch``
executed by a real RQ worker (``work``: an in-process kumiko worker in burst mode), which also
runs the retried runs. ``BATCH_SIZE`` is lowered so that an operation takes several batches.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import timedelta
from urllib.parse import urlencode

import pytest
from django.contrib.admin.models import ADDITION, LogEntry
from django.db import connection
from django.test import Client
from django.utils import timezone

from kumiko_jobs import bulk, operations
from kumiko_jobs.models import BulkItem, BulkOperation, BulkState, JobRun, RunStatus
from tests.conftest import work
from tests.integration.seed_runs import plant
from tests.integration.test_dashboard import DATA, client_for, make_user, payload
from tests.testapp import jobs

pytestmark = pytest.mark.usefixtures("live_db")

BASE = "/admin/kumiko_jobs/jobrun/"
RETRY, CANCEL = f"{BASE}bulk/retry/", f"{BASE}bulk/cancel/"
OPERATIONS = "/admin/kumiko_jobs/bulkoperation/"
GROUP = {"status__exact": "failed", "job": jobs.probe.name, "error_type__exact": "RuntimeError"}


@pytest.fixture(autouse=True)
def _small_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bulk, "BATCH_SIZE", 2)


@pytest.fixture(autouse=True)
def _no_operations(live_db: None) -> None:
    # live_db truncates the run tables; the operations are this file's own.
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE kumiko_jobs_bulkoperation, kumiko_jobs_bulkitem")


@pytest.fixture
def operator() -> Client:
    """An operator who may act on runs: view_all_tenants and change_jobrun, not a superuser."""
    user = make_user("public", "ops", ("view_all_tenants", "view_jobrun", "change_jobrun"))
    return client_for("localhost", "public", user)


def confirmation(client: Client, url: str, query: dict[str, str]) -> dict[str, str]:
    """The confirmation page's form, as the operator's browser would post it."""
    page = client.get(f"{url}?{urlencode(query)}")
    assert page.status_code == 200, page.content[:300]
    html = page.content.decode()
    fields = dict(re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)"', html))
    assert {"query", "confirmed", "as_of"} <= set(fields), html[-2000:]
    fields["query"] = fields["query"].replace("&amp;", "&")
    return fields


def retries_of(runs: Iterable[JobRun]) -> list[JobRun]:
    triggers = [f"retry:{r.run_id}" for r in runs]
    return [r for r in JobRun.objects.all() if any(r.trigger.startswith(t) for t in triggers)]


def only_operation() -> BulkOperation:
    (operation,) = BulkOperation.objects.all()
    return operation


# --------------------------------------------------------------------------- the operation


def test_retry_of_a_failure_group_in_batches_with_progress_and_audit(operator: Client) -> None:
    failed = plant("t1", [RunStatus.FAILED] * 5)
    plant("t2", [RunStatus.FAILED] * 2, error="KeyError")  # another group: not retried
    plant("t1", [RunStatus.SUCCEEDED] * 2)
    form = confirmation(operator, RETRY, GROUP)
    assert form["confirmed"] == "5"

    started = operator.post(RETRY, form)
    assert started.status_code == 302
    operation = only_operation()
    assert started["Location"].endswith(f"{OPERATIONS}{operation.pk}/change/")
    assert (operation.kind, operation.state, operation.listed) == ("retry", "running", 5)
    assert operation.requested_by == "ops" and operation.confirmed == 5

    work()
    operation.refresh_from_db()
    assert (operation.state, operation.done, operation.skipped, operation.failed) == (
        BulkState.DONE,
        5,
        0,
        0,
    )
    assert operation.batches == 3  # 2 + 2 + 1
    assert operation.finished_at is not None
    new = retries_of(failed)
    assert len(new) == 5 and {r.status for r in new} == {RunStatus.SUCCEEDED}
    assert {r.schema_name for r in new} == {"t1"}
    assert all(r.trigger.endswith(" by ops") for r in new)
    assert not BulkItem.objects.filter(operation=operation, outcome="").exists()
    # Audited: Django's admin log, by the operator, on the operation.
    (entry,) = LogEntry.objects.filter(object_id=str(operation.pk))
    assert entry.action_flag == ADDITION and entry.user.username == "ops"
    assert "5 confirmed" in entry.change_message and "job=" in entry.change_message
    # Its progress page.
    page = operator.get(f"{OPERATIONS}{operation.pk}/change/").content.decode()
    assert "5 / 5" in operator.get(OPERATIONS).content.decode()
    assert "status__exact=failed" in page


def test_never_more_than_confirmed_even_when_more_match_later(operator: Client) -> None:
    """The page showed 3; two more runs fail (queued before it) and one after it: 3 retried."""
    first = plant("t1", [RunStatus.FAILED] * 3, minutes_ago=10)
    form = confirmation(operator, RETRY, GROUP)
    assert form["confirmed"] == "3"
    later_but_older = plant("t1", [RunStatus.FAILED] * 2, minutes_ago=3)
    operator.post(RETRY, {**form})
    newest = plant("t1", [RunStatus.FAILED], minutes_ago=-1)  # queued after the page
    work()
    operation = only_operation()
    assert operation.listed == 3 and operation.done == 3
    assert len(retries_of([*first, *later_but_older, *newest])) == 3
    assert retries_of(newest) == []
    # A confirmed count the page did not show (more than the filter matches) lists no more
    # than the filter matches either.
    assert BulkItem.objects.filter(operation=operation).count() == 3


def test_runs_queued_after_the_page_are_not_listed_even_under_the_count(operator: Client) -> None:
    plant("t1", [RunStatus.FAILED] * 2, minutes_ago=10)
    form = confirmation(operator, RETRY, GROUP)
    late = plant("t1", [RunStatus.FAILED], minutes_ago=-1)
    operator.post(RETRY, {**form, "confirmed": "3"})  # a tampered count: still bounded by as_of
    work()
    assert only_operation().listed == 2
    assert retries_of(late) == []


def test_runs_that_no_longer_qualify_are_skipped_and_counted(operator: Client) -> None:
    gone, retried, fresh = plant("t1", [RunStatus.FAILED] * 3)
    form = confirmation(operator, RETRY, GROUP)
    operator.post(RETRY, form)
    # Before the batches run: one run is retried by hand, one deleted by retention.
    operations.retry_run(retried, by="someone")
    JobRun.objects.filter(pk=gone.pk).delete()
    work()
    operation = only_operation()
    assert (operation.done, operation.skipped, operation.failed) == (1, 2, 0)
    assert operation.reasons == {"already being retried": 1, "run no longer exists": 1}
    assert len(retries_of([retried])) == 1  # the hand retry only: the bulk one was refused
    assert len(retries_of([fresh])) == 1


def test_cancel_waiting_and_running_runs(operator: Client) -> None:
    """Waiting runs are cancelled at once; a running run gets the running-cancel request; a
    finished one is skipped."""
    waiting = plant("t1", [RunStatus.QUEUED, RunStatus.DEFERRED])
    (running,) = plant("t1", [RunStatus.RUNNING])
    (finished,) = plant("t1", [RunStatus.SUCCEEDED])
    form = confirmation(operator, CANCEL, {"tenant": "t1"})
    assert form["confirmed"] == "4"
    operator.post(CANCEL, form)
    operation = only_operation()
    bulk.run_batch(str(operation.pk))
    bulk.run_batch(str(operation.pk))
    operation.refresh_from_db()
    assert (operation.state, operation.done, operation.skipped) == (BulkState.DONE, 3, 1)
    assert operation.reasons == {"already finished": 1, "running: asked to stop": 1}
    statuses = {r.pk: r for r in JobRun.objects.all()}
    assert {statuses[r.pk].status for r in waiting} == {RunStatus.CANCELLED}
    assert statuses[running.pk].status == RunStatus.RUNNING
    assert statuses[running.pk].cancel_requested_by == "ops"
    assert statuses[finished.pk].status == RunStatus.SUCCEEDED


def test_a_batch_run_twice_acts_once(operator: Client) -> None:
    failed = plant("t1", [RunStatus.FAILED] * 2)
    operator.post(RETRY, confirmation(operator, RETRY, GROUP))
    operation = only_operation()
    assert bulk.run_batch(str(operation.pk)) is False  # both runs, the list is through
    assert bulk.run_batch(str(operation.pk)) is False
    work()  # the batch the start enqueued finds nothing left
    operation.refresh_from_db()
    assert (operation.done, operation.batches, operation.state) == (2, 1, BulkState.DONE)
    assert len(retries_of(failed)) == 2


def test_stop_leaves_the_rest_as_it_was(operator: Client) -> None:
    failed = plant("t1", [RunStatus.FAILED] * 5)
    operator.post(RETRY, confirmation(operator, RETRY, GROUP))
    operation = only_operation()
    assert bulk.run_batch(str(operation.pk)) is True
    response = operator.post(
        OPERATIONS, {"action": "stop_selected", "_selected_action": [str(operation.pk)]}
    )
    assert response.status_code == 302
    work()
    operation.refresh_from_db()
    assert (operation.state, operation.done, operation.stopped_by) == (BulkState.STOPPED, 2, "ops")
    assert len(retries_of(failed)) == 2
    assert LogEntry.objects.filter(object_id=str(operation.pk)).count() == 2  # start, stop


# --------------------------------------------------------------------------- bad input


def test_bad_confirmations_are_refused_and_start_nothing(operator: Client) -> None:
    plant("t1", [RunStatus.FAILED] * 2)
    form = confirmation(operator, RETRY, GROUP)
    for bad in (
        {**form, "confirmed": "0"},
        {**form, "confirmed": str(bulk.MAX_RUNS + 1)},
        {**form, "confirmed": "two"},
        {**form, "as_of": "yesterday"},
        {**form, "as_of": "2026-12-04T01:00:00"},  # no time zone
        {k: v for k, v in form.items() if k != "as_of"},
        {**form, "query": "no_such_field=1"},
        {**form, "query": "job=" + "x" * 2000},
    ):
        response = operator.post(RETRY, bad)
        assert response.status_code == 400, (bad, response.status_code)
        assert response.content, bad
    assert not BulkOperation.objects.exists()
    assert operator.get(f"{BASE}bulk/delete/").status_code == 404


def test_more_than_the_limit_is_refused_on_the_page(
    operator: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bulk, "MAX_RUNS", 2)
    plant("t1", [RunStatus.FAILED] * 3)
    page = operator.get(f"{RETRY}?{urlencode(GROUP)}").content.decode()
    assert "More than 2 runs match" in page and 'name="confirmed"' not in page
    none = operator.get(f"{RETRY}?{urlencode({**GROUP, 'tenant': 't2'})}").content.decode()
    assert "No run matches" in none


# --------------------------------------------------------------------------- who may


def test_nobody_but_an_operator_holding_change_reaches_it() -> None:
    plant("t1", [RunStatus.FAILED] * 2)
    refused = {
        "tenant superuser": client_for(
            "t1.localhost", "t1", make_user("t1", "boss", superuser=True)
        ),
        "tenant staff": client_for(
            "t1.localhost", "t1", make_user("t1", "clerk", ("view_jobrun", "change_jobrun"))
        ),
        "public staff without view_all_tenants": client_for(
            "localhost", "public", make_user("public", "helpdesk", ("view_jobrun", "change_jobrun"))
        ),
        "operator without change": client_for(
            "localhost",
            "public",
            make_user("public", "watcher", ("view_all_tenants", "view_jobrun")),
        ),
    }
    form = {"query": urlencode(GROUP), "confirmed": "2", "as_of": timezone.now().isoformat()}
    for who, client in refused.items():
        for url in (RETRY, CANCEL):
            assert client.get(url).status_code == 403, (who, url)
            assert client.post(url, form).status_code == 403, (who, url)
        runs = client.get(BASE).content.decode()
        assert "bulk/retry" not in runs, who
    for who in ("tenant superuser", "tenant staff", "public staff without view_all_tenants"):
        assert refused[who].get(OPERATIONS).status_code == 403, who
    anonymous = client_for("localhost", "public", None).get(RETRY)
    assert anonymous.status_code == 302 and "/login/" in anonymous["Location"]
    assert not BulkOperation.objects.exists()
    assert JobRun.objects.count() == 2


def test_the_run_list_and_the_dashboard_link_to_it(operator: Client) -> None:
    plant("t1", [RunStatus.FAILED] * 2)
    runs = operator.get(BASE, {"status__exact": "failed", "p": "1"}).content.decode()
    assert f'href="{RETRY}?status__exact=failed"' in runs
    assert f'href="{CANCEL}?status__exact=failed"' in runs
    (group,) = payload(operator.get(DATA))["failures"]
    assert group["retry_link"].startswith(RETRY)
    page = operator.get(group["retry_link"])
    assert 'name="confirmed" value="2"' in page.content.decode()
    watcher = client_for(
        "localhost", "public", make_user("public", "watcher", ("view_all_tenants", "view_jobrun"))
    )
    (group,) = payload(watcher.get(DATA))["failures"]
    assert group["retry_link"] == ""


def test_the_batches_own_runs_are_never_listed(operator: Client) -> None:
    """A cancel of every queued run must not cancel another operation's next batch."""
    failed = plant("t1", [RunStatus.FAILED] * 2)
    waiting = plant("t2", [RunStatus.QUEUED] * 3)
    operator.post(RETRY, confirmation(operator, RETRY, GROUP))  # its first batch is queued
    assert JobRun.objects.filter(job_name=bulk.BATCH_JOB, status=RunStatus.QUEUED).count() == 1
    # Queued after that batch: oldest first, the batch's run would be the first one listed.
    JobRun.objects.filter(pk__in=[w.pk for w in waiting]).update(queued_at=timezone.now())
    form = confirmation(operator, CANCEL, {"status__exact": "queued"})
    assert form["confirmed"] == "3"
    operator.post(CANCEL, form)
    work()
    retry, cancel = sorted(BulkOperation.objects.all(), key=lambda o: o.kind != "retry")
    assert (retry.state, retry.done, cancel.state, cancel.done) == ("done", 2, "done", 3)
    assert len(retries_of(failed)) == 2
    assert {r.status for r in JobRun.objects.filter(pk__in=[w.pk for w in waiting])} == {
        RunStatus.CANCELLED
    }
    assert not JobRun.objects.filter(job_name=bulk.BATCH_JOB, status=RunStatus.CANCELLED).exists()


def test_retention_deletes_the_lists_of_long_ended_operations_only(operator: Client) -> None:
    from kumiko_jobs.history import retention

    plant("t1", [RunStatus.FAILED] * 2)
    operator.post(RETRY, confirmation(operator, RETRY, GROUP))
    operator.post(CANCEL, confirmation(operator, CANCEL, {"tenant": "t1"}))
    old, running = sorted(BulkOperation.objects.all(), key=lambda o: o.kind != "retry")
    long_ago = timezone.now() - timedelta(days=31)
    BulkOperation.objects.filter(pk=old.pk).update(state=BulkState.DONE, finished_at=long_ago)
    deleted = retention.delete_expired()
    assert deleted.bulk_items == 2
    assert not BulkItem.objects.filter(operation=old).exists()
    assert BulkItem.objects.filter(operation=running).count() == 2
    assert BulkOperation.objects.filter(pk=old.pk).exists()  # the record stays
