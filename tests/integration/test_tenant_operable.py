"""The runs a tenant's member may not retry or cancel although it holds ``operate_tenant_runs``
(admin/tenant_acts.py): runs of a job declared ``@job(tenant_operable=False)``, runs of a job no
longer registered, the retry of a cancelled run no member of the tenant cancelled, and a run an
operator started (by hand, or as an operator's retry). Operators still act on them.

Through the real admin (``t1.localhost`` a tenant's domain, ``localhost`` the operators'), real
PostgreSQL and Redis; the retries that go through are run by a real RQ worker (``work``: a
kumiko worker in burst mode) in the tenant's schema. Every refusal path: the list's actions
(alone and beside a run the member may act on), the run page's button (not shown, the sentence
why instead) and a POST to its ``act/<kind>/`` URL; "select all" is refused to members whatever
the runs (test_tenant_operate.py).

Calibrated (2026-12-06): with ``tenant_acts.refusal`` answering None, every test here but the
operators' fails (the member's retries and cancels go through); without its unregistered-job
check, its tenant_operable check or its who-cancelled check, exactly the test of that check
fails; with the run page's template showing refused buttons, the three members' tests fail.
With ``RunActions.action_checkbox`` drawing every box again (2026-12-07), the checkbox test
fails.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django_tenants.utils import schema_context

from kumiko_jobs.models import JobRun, RunStatus
from tests.conftest import work
from tests.integration.seed_runs import plant
from tests.integration.test_dashboard import client_for, make_user
from tests.testapp import jobs
from tests.testapp.models import Probe

pytestmark = pytest.mark.usefixtures("live_db")

RUNS = "/admin/kumiko_jobs/jobrun/"
OPERATE = ("view_jobrun", "operate_tenant_runs")
OPERATOR = ("view_all_tenants", "view_jobrun", "change_jobrun")
GONE = "testapp.no_longer_declared"


@pytest.fixture(autouse=True)
def _no_operations(live_db: None) -> None:
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE kumiko_jobs_bulkoperation, kumiko_jobs_bulkitem")


def rows() -> dict[Any, tuple[Any, ...]]:
    return {
        pk: tuple(rest)
        for pk, *rest in JobRun.objects.values_list(
            "pk", "status", "cancel_requested_at", "cancel_requested_by"
        )
    }


def plant_of(job_name: str, schema: str, statuses: list[str]) -> list[JobRun]:
    """``plant``'s runs, of ``job_name`` (its arguments are ``probe``'s: a tag)."""
    runs = plant(schema, statuses)
    JobRun.objects.filter(pk__in=[r.pk for r in runs]).update(job_name=job_name)
    for run in runs:
        run.refresh_from_db()
    return runs


def act(client: Client, action: str, *runs: JobRun) -> str:
    data = {"action": action, "index": 0, "_selected_action": [str(r.pk) for r in runs]}
    return client.post(RUNS, data, follow=True).content.decode()


def member() -> Client:
    return client_for("t1.localhost", "t1", make_user("t1", "t1-operator", OPERATE))


def operator() -> Client:
    return client_for("localhost", "public", make_user("public", "ops", OPERATOR))


def retries_of(run: JobRun) -> list[JobRun]:
    return list(JobRun.objects.filter(trigger__startswith=f"retry:{run.run_id}"))


def assert_refused_on_the_page(client: Client, run: JobRun, kind: str, sentence: str) -> None:
    """The page shows the sentence instead of the button, and a POST to the button's URL goes
    back to the page, which says the run was skipped and why."""
    page = client.get(f"{RUNS}{run.pk}/change/").content.decode()
    assert page.count(sentence) == 1, sentence
    assert f"{RUNS}{run.pk}/act/{kind}/" not in page
    response = client.post(f"{RUNS}{run.pk}/act/{kind}/", follow=True)
    assert response.redirect_chain == [(f"{RUNS}{run.pk}/change/", 302)]


def test_a_member_may_not_retry_or_cancel_runs_of_an_operators_only_job() -> None:
    """``tenant_operable=False``: the list's actions skip its runs and say why (beside a run of
    another job, which is acted on), the run page shows the sentence instead of the button, and
    a POST to the button's URL changes nothing."""
    failed, queued, running = plant_of(
        jobs.operators_only.name, "t1", [RunStatus.FAILED, RunStatus.QUEUED, RunStatus.RUNNING]
    )
    mine_failed, mine_queued = plant("t1", [RunStatus.FAILED, RunStatus.QUEUED])
    before = rows()
    client = member()
    reason = "skipped: only operators retry or cancel this job&#x27;s runs"

    assert f"0 runs retried, 1 {reason}." in act(client, "retry_selected", failed)
    assert f"0 runs cancelled, 2 {reason}." in act(client, "cancel_selected", queued, running)
    sentence = "Only the operators retry or cancel the runs of this job."
    assert_refused_on_the_page(client, failed, "retry", sentence)
    assert_refused_on_the_page(client, queued, "cancel", sentence)
    assert_refused_on_the_page(client, running, "cancel", sentence)
    assert rows() == before and not retries_of(failed)

    assert f"1 run retried, 1 {reason}." in act(client, "retry_selected", failed, mine_failed)
    assert f"1 run cancelled, 1 {reason}." in act(client, "cancel_selected", queued, mine_queued)
    after = rows()
    assert [after[r.pk] for r in (failed, queued, running)] == [
        before[r.pk] for r in (failed, queued, running)
    ]
    assert after[mine_queued.pk][0] == RunStatus.CANCELLED
    assert not retries_of(failed) and len(retries_of(mine_failed)) == 1


def test_operators_still_retry_and_cancel_them_and_a_worker_runs_the_retry() -> None:
    failed, queued = plant_of(jobs.operators_only.name, "t1", [RunStatus.FAILED, RunStatus.QUEUED])
    client = operator()
    page = client.get(f"{RUNS}{failed.pk}/change/").content.decode()
    assert f"{RUNS}{failed.pk}/act/retry/" in page and "kj-run-refused" not in page
    assert "1 run retried." in act(client, "retry_selected", failed)
    assert client.post(f"{RUNS}{queued.pk}/act/cancel/").status_code == 302
    queued.refresh_from_db()
    assert (queued.status, queued.cancel_requested_by) == (RunStatus.CANCELLED, "ops")

    work()
    (retry,) = retries_of(failed)
    assert retry.status == RunStatus.SUCCEEDED, retry.error_message
    with schema_context("t1"):
        seen = Probe.objects.filter(tag=failed.payload["tag"]).values_list("schema_seen", flat=True)
        assert list(seen) == ["t1"]


def test_runs_of_a_job_no_longer_registered_are_the_operators() -> None:
    """Fail closed: nothing says the job let tenants act on its runs. Operators cancel them
    (a retry would find no job to enqueue, for them as for anyone)."""
    failed, queued = plant_of(GONE, "t1", [RunStatus.FAILED, RunStatus.QUEUED])
    before = rows()
    client = member()
    assert "0 runs retried, 1 skipped: job no longer registered." in act(
        client, "retry_selected", failed
    )
    assert "0 runs cancelled, 1 skipped: job no longer registered." in act(
        client, "cancel_selected", queued
    )
    sentence = "This run&#x27;s job is no longer registered, so only the operators may retry or"
    assert_refused_on_the_page(client, failed, "retry", sentence)
    assert_refused_on_the_page(client, queued, "cancel", sentence)
    assert rows() == before and not retries_of(failed)

    assert "1 run cancelled." in act(operator(), "cancel_selected", queued)


def test_a_members_run_list_has_no_checkbox_on_the_runs_of_jobs_it_may_never_act_on() -> None:
    """``RunActions.action_checkbox``: no box on a member's list for the runs of an operators-only
    job or of a job no longer registered (listed all the same); its other runs keep theirs, a
    cancelled one too (whether the member may retry it depends on who cancelled, which the list
    does not read). The operators' list has a box on every run."""
    (only,) = plant_of(jobs.operators_only.name, "t1", [RunStatus.FAILED])
    (gone,) = plant_of(GONE, "t1", [RunStatus.QUEUED])
    mine, cancelled = plant("t1", [RunStatus.FAILED, RunStatus.CANCELLED])
    planted = (only, gone, mine, cancelled)

    def boxed(client: Client) -> set[Any]:
        page = client.get(RUNS).content.decode()
        assert all(f"{RUNS}{r.pk}/change/" in page for r in planted)
        return {r.pk for r in planted if f'name="_selected_action" value="{r.pk}"' in page}

    assert boxed(member()) == {mine.pk, cancelled.pk}
    assert boxed(operator()) == {r.pk for r in planted}


def test_a_member_retries_a_cancelled_run_only_when_its_tenant_cancelled_it() -> None:
    """The member cancels a queued run, then retries it, and a worker runs the retry. A run an
    operator cancelled, one a newer enqueue replaced (no author), and one whose author names
    another tenant stay cancelled: skipped, with the reason, on the list and the run page."""
    own, by_operator, replaced, elsewhere = plant(
        "t1", [RunStatus.QUEUED, RunStatus.QUEUED, RunStatus.CANCELLED, RunStatus.CANCELLED]
    )
    JobRun.objects.filter(pk=elsewhere.pk).update(cancel_requested_by="t1-operator (tenant t2)")
    client = member()
    assert client.post(f"{RUNS}{own.pk}/act/cancel/").status_code == 302
    assert "1 run cancelled." in act(operator(), "cancel_selected", by_operator)
    before = rows()
    assert before[own.pk][::2] == (RunStatus.CANCELLED, "t1-operator (tenant t1)")
    assert before[by_operator.pk][::2] == (RunStatus.CANCELLED, "ops")

    reason = "skipped: not cancelled by a member of this tenant"
    page = act(client, "retry_selected", by_operator, replaced, elsewhere)
    assert f"0 runs retried, 3 {reason}." in page
    sentence = "This run was not cancelled by a member of this tenant, so only the operators"
    for run in (by_operator, replaced, elsewhere):
        assert_refused_on_the_page(client, run, "retry", sentence)
    assert rows() == before
    assert not JobRun.objects.filter(trigger__startswith="retry:").exists()

    page = client.get(f"{RUNS}{own.pk}/change/").content.decode()
    assert f"{RUNS}{own.pk}/act/retry/" in page and "kj-run-refused" not in page
    assert f"1 run retried, 1 {reason}." in act(client, "retry_selected", own, by_operator)
    (retry,) = JobRun.objects.filter(trigger__startswith="retry:")
    assert retry.trigger == f"retry:{own.run_id} by t1-operator (tenant t1)"
    work()
    retry.refresh_from_db()
    assert retry.status == RunStatus.SUCCEEDED, retry.error_message
    with schema_context("t1"):
        assert Probe.objects.filter(tag=own.payload["tag"]).count() == 1

    # The operator retries the run it cancelled: the rule is the members', not the operators'.
    assert "1 run retried." in act(operator(), "retry_selected", by_operator)


def test_a_member_may_not_cancel_or_retry_what_an_operator_started() -> None:
    """An operator's run by hand (the "Run a job" page's ``enqueue_manual``) and an operator's
    retry stand until an operator acts on them, as an operator's cancel does; the member's own
    retry stays the member's to cancel."""
    from kumiko_jobs import operations

    ops_user = make_user("public", "ops", OPERATOR)
    manual = JobRun.objects.get(
        pk=operations.enqueue_manual(
            "billing.sync_invoice", "t1", {"invoice_id": 7}, by=ops_user
        ).run_id
    )
    failed, own_failed = plant("t1", [RunStatus.FAILED, RunStatus.FAILED])
    assert "1 run retried." in act(operator(), "retry_selected", failed)
    (by_operator,) = retries_of(failed)
    client = member()
    assert "1 run retried." in act(client, "retry_selected", own_failed)
    (own,) = retries_of(own_failed)
    before = rows()

    reason = "skipped: started by an operator"
    page = act(client, "cancel_selected", manual, by_operator, own)
    assert f"1 run cancelled, 2 {reason}." in page
    sentence = "An operator started this run, so only the operators may retry or cancel it."
    for run in (manual, by_operator):
        assert_refused_on_the_page(client, run, "cancel", sentence)
        assert rows()[run.pk] == before[run.pk]
    assert rows()[own.pk][0] == RunStatus.CANCELLED

    # Cancelled by the operator, the operator's run is not the member's to retry either.
    assert "2 runs cancelled." in act(operator(), "cancel_selected", manual, by_operator)
    assert f"0 runs retried, 2 {reason}." in act(client, "retry_selected", manual, by_operator)
    assert_refused_on_the_page(client, manual, "retry", sentence)
    assert not retries_of(manual) and not retries_of(by_operator)
    assert "1 run retried." in act(operator(), "retry_selected", manual)
