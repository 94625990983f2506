"""A tenant's own retry and cancel (issue 26): members of a tenant holding
``kumiko_jobs.operate_tenant_runs`` act on that tenant's runs, on its domain, and on nothing else.

Through the real admin (django-tenants' hosts: ``localhost`` public, ``t1.localhost`` and
``t2.localhost`` the tenants), real PostgreSQL and Redis; the retried run is executed by a real
RQ worker (``work``: a kumiko worker in burst mode) in its tenant's schema. Every page and
action of both audiences, in both auth layouts, is walked by tests/integration/audiences.py
(test_admin_audiences.py, tests/shared_auth/); this file follows one member's acts through to
the worker, and the routes' own refusals.

Calibrated: with ``admin.actions.scoped`` returning every run and the audience's queryset not
limited to the domain's schema on POST, a t1 member's POST of t2's run ids retries and cancels
t2's runs (``test_another_tenants_run_ids_posted_to_this_domain_change_nothing`` fails).
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterable
from typing import Any

import pytest
from django.core.cache import cache
from django.db import connection
from django.test import Client
from django.utils import timezone
from django_tenants.utils import schema_context

from kumiko_jobs.models import BulkOperation, JobRun, RunStatus
from kumiko_jobs.transport.keys import CANCEL_KEY
from tests.conftest import work
from tests.integration.seed_runs import plant
from tests.integration.test_dashboard import client_for, make_user
from tests.testapp.models import Probe

pytestmark = pytest.mark.usefixtures("live_db")

RUNS = "/admin/kumiko_jobs/jobrun/"
CONSOLE_DATA = f"{RUNS}console/data/"
BULK = (f"{RUNS}bulk/retry/", f"{RUNS}bulk/cancel/")
OPERATE = ("view_jobrun", "operate_tenant_runs")


@pytest.fixture(autouse=True)
def _no_operations(live_db: None) -> None:
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE kumiko_jobs_bulkoperation, kumiko_jobs_bulkitem")


def rows() -> dict[Any, tuple[str, Any]]:
    return {
        pk: (s, at)
        for pk, s, at in JobRun.objects.values_list("pk", "status", "cancel_requested_at")
    }


def act(client: Client, action: str, *runs: JobRun) -> Any:
    data = {"action": action, "index": 0, "_selected_action": [str(r.pk) for r in runs]}
    return client.post(RUNS, data, follow=True)


def member(schema: str, username: str, perms: Iterable[str] = OPERATE) -> Client:
    return client_for(f"{schema}.localhost", schema, make_user(schema, username, perms))


def test_a_member_retries_and_cancels_its_tenants_runs_and_a_worker_runs_the_retry() -> None:
    """The list's retry on t1's failed run, the run page's cancel on t1's queued run: the rows
    change, each act names who asked, and a burst worker runs the retry in t1's schema."""
    failed, queued = plant("t1", [RunStatus.FAILED, RunStatus.QUEUED])
    others = plant("t2", [RunStatus.FAILED, RunStatus.QUEUED])
    before_t2 = {pk: v for pk, v in rows().items() if pk in {r.pk for r in others}}
    client = member("t1", "t1-operator")

    listed = client.get(RUNS).content.decode()
    assert 'value="retry_selected"' in listed and 'value="cancel_selected"' in listed
    response = act(client, "retry_selected", failed)
    assert "1 run retried." in response.content.decode()
    (retry,) = JobRun.objects.filter(trigger__startswith=f"retry:{failed.run_id}")
    assert retry.schema_name == "t1" and retry.status == RunStatus.QUEUED
    assert retry.trigger == f"retry:{failed.run_id} by t1-operator (tenant t1)"
    assert retry.payload == failed.payload

    page = client.get(f"{RUNS}{queued.pk}/change/").content.decode()
    assert f"{RUNS}{queued.pk}/act/cancel/" in page
    assert f"{RUNS}{queued.pk}/act/retry/" not in page  # not failed: nothing to retry
    response = client.post(f"{RUNS}{queued.pk}/act/cancel/")
    assert response.status_code == 302
    assert response["Location"] == f"{RUNS}{queued.pk}/change/"
    queued.refresh_from_db()
    assert queued.status == RunStatus.CANCELLED
    assert queued.cancel_requested_by == "t1-operator (tenant t1)"
    assert queued.error_message == "Cancelled by t1-operator (tenant t1)."

    work()
    retry.refresh_from_db()
    assert retry.status == RunStatus.SUCCEEDED, retry.error_message
    tag = failed.payload["tag"]
    with schema_context("t1"):
        assert list(Probe.objects.filter(tag=tag).values_list("schema_seen", flat=True)) == ["t1"]
    with schema_context("t2"):
        assert not Probe.objects.filter(tag=tag).exists()
    assert {pk: v for pk, v in rows().items() if pk in before_t2} == before_t2


def test_a_running_run_is_asked_to_stop_and_the_worker_told_who(redis_conn: Any) -> None:
    (running,) = plant("t1", [RunStatus.RUNNING])
    response = act(member("t1", "t1-operator"), "cancel_selected", running)
    assert "1 running run asked to stop" in response.content.decode()
    running.refresh_from_db()
    assert running.status == RunStatus.RUNNING  # the worker ends it
    assert running.cancel_requested_by == "t1-operator (tenant t1)"
    flag = redis_conn.get(CANCEL_KEY + uuid.UUID(str(running.pk)).hex)
    assert flag in (b"t1-operator (tenant t1)", "t1-operator (tenant t1)")


def test_another_tenants_run_ids_posted_to_this_domain_change_nothing() -> None:
    """t1's member posts t2's run ids to t1's domain: in the list's actions (alone and beside
    one of t1's) and to t2's run pages. t2's runs stay as they were; t1's one is acted on."""
    mine_failed, mine_queued = plant("t1", [RunStatus.FAILED, RunStatus.QUEUED])
    t2_failed, t2_queued = plant("t2", [RunStatus.FAILED, RunStatus.QUEUED])
    before = rows()
    client = member("t1", "t1-operator")
    act(client, "retry_selected", t2_failed)
    act(client, "cancel_selected", t2_queued)
    for run, kind in ((t2_failed, "retry"), (t2_queued, "cancel")):
        assert client.post(f"{RUNS}{run.pk}/act/{kind}/").status_code == 404
    assert rows() == before
    act(client, "retry_selected", t2_failed, mine_failed)
    act(client, "cancel_selected", t2_queued, mine_queued)
    after = rows()
    assert after[t2_failed.pk] == before[t2_failed.pk]
    assert after[t2_queued.pk] == before[t2_queued.pk]
    assert after[mine_queued.pk][0] == RunStatus.CANCELLED
    retried = JobRun.objects.filter(trigger__startswith="retry:").values_list(
        "schema_name", "trigger"
    )
    assert [(s, t.split(" by ")[0]) for s, t in retried] == [("t1", f"retry:{mine_failed.run_id}")]


def test_who_may_not_act_changes_nothing() -> None:
    """A member without the permission (with change_jobrun and add_jobrun), t2's member with it
    on t1's domain, a t1 member with it on the operators' domain: no action offered, nothing
    acted on, the run page's buttons refused or unknown."""
    failed, queued = plant("t1", [RunStatus.FAILED, RunStatus.QUEUED])
    plain = member("t1", "t1-clerk", ("view_jobrun", "change_jobrun", "add_jobrun"))
    stranger = member("t2", "t2-operator")
    stranger.defaults["HTTP_HOST"] = "t1.localhost"
    elsewhere = member("t1", "t1-operator")
    elsewhere.defaults["HTTP_HOST"] = "localhost"
    before = rows()
    assert 'value="retry_selected"' not in plain.get(RUNS).content.decode()
    assert "/act/" not in plain.get(f"{RUNS}{failed.pk}/change/").content.decode()
    for client, refused in ((plain, (403,)), (stranger, (302,)), (elsewhere, (302, 403))):
        act(client, "retry_selected", failed)
        act(client, "cancel_selected", queued)
        for run, kind in ((failed, "retry"), (queued, "cancel")):
            status = client.post(f"{RUNS}{run.pk}/act/{kind}/").status_code
            assert status in refused, (client.defaults["HTTP_HOST"], status)
    assert rows() == before


def test_the_run_pages_buttons_take_a_post_of_a_known_act() -> None:
    (failed,) = plant("t1", [RunStatus.FAILED])
    client = member("t1", "t1-operator")
    assert client.get(f"{RUNS}{failed.pk}/act/retry/").status_code == 405
    assert client.post(f"{RUNS}{failed.pk}/act/delete/").status_code == 404
    assert client.post(f"{RUNS}{uuid.uuid4()}/act/retry/").status_code == 404
    assert not JobRun.objects.filter(trigger__startswith="retry:").exists()
    # Twice: the second is refused as already being retried (operations.retry_run's lock).
    for _ in range(2):
        client.post(f"{RUNS}{failed.pk}/act/retry/")
    assert JobRun.objects.filter(trigger__startswith=f"retry:{failed.run_id}").count() == 1
    page = client.get(f"{RUNS}{failed.pk}/change/", follow=True).content.decode()
    assert "already being retried" in page


def test_bulk_controls_stay_the_operators() -> None:
    """The member who may retry its runs one by one gets no bulk retry or cancel, and no
    "select all" of the list's actions (every run the filter matches)."""
    failed = plant("t1", [RunStatus.FAILED] * 2)
    client = member("t1", "t1-operator")
    # Django's action form reads any value but "", "0" and "false" as "select all".
    for action, across in itertools.product(
        ("retry_selected", "cancel_selected"), ("1", "2", "true", "True", "on")
    ):
        data = {"action": action, "index": 0, "select_across": across}
        data["_selected_action"] = [str(failed[0].pk)]
        page = client.post(RUNS, data, follow=True).content.decode()
        assert "acting on every run the filter matches is for operators" in page, across
    assert "bulk/retry" not in client.get(RUNS).content.decode()
    for url in BULK:
        assert client.get(f"{url}?status__exact=failed").status_code == 403
        form = {
            "query": "status__exact=failed",
            "confirmed": "2",
            "as_of": timezone.now().isoformat(),
        }
        assert client.post(url, form).status_code == 403
    assert not BulkOperation.objects.exists()
    assert JobRun.objects.count() == 2


def test_the_console_links_a_jobs_failures_to_the_tenants_failed_runs() -> None:
    cache.clear()  # the console's numbers are kept a minute
    plant("t1", [RunStatus.FAILED])
    plant("t2", [RunStatus.FAILED] * 3)
    client = member("t1", "t1-operator")
    response = client.get(CONSOLE_DATA)
    assert response.status_code == 200
    (row,) = response.json()["jobs"]
    assert row["failed"] == 1
    listed = client.get(row["failed_link"])
    assert [r.schema_name for r in listed.context["cl"].result_list] == ["t1"]


def test_forged_requests_reach_no_run_outside_the_members_tenant() -> None:
    """An attacker's pass (issue 26's routes) that the tests above leave out: a POST without the
    CSRF token (Django's test client skips the check unless asked), run ids of system runs
    (schema ''), and the list's query string naming another tenant or every schema, with and
    without "select all". Nothing but the member's own run is ever acted on."""
    system_failed, system_queued = plant("", [RunStatus.FAILED, RunStatus.QUEUED])
    t2_failed, t2_queued = plant("t2", [RunStatus.FAILED, RunStatus.QUEUED])
    (mine,) = plant("t1", [RunStatus.FAILED])
    before = rows()
    user = make_user("t1", "t1-operator", OPERATE)

    forged = Client(HTTP_HOST="t1.localhost", enforce_csrf_checks=True)
    with schema_context("t1"):
        forged.force_login(user)
    assert forged.post(f"{RUNS}{mine.pk}/act/retry/").status_code == 403
    data = {"action": "retry_selected", "index": 0, "_selected_action": [str(mine.pk)]}
    assert forged.post(RUNS, data).status_code == 403
    assert rows() == before and not JobRun.objects.filter(trigger__startswith="retry:").exists()

    client = member("t1", "t1-operator")
    for run, kind in ((system_failed, "retry"), (system_queued, "cancel")):
        assert client.post(f"{RUNS}{run.pk}/act/{kind}/").status_code == 404
    act(client, "retry_selected", system_failed)
    act(client, "cancel_selected", system_queued)
    for query in ("?schema_name=t2", "?schema_name__exact=t2", "?schema_name__in=t1,t2,", "?q=t2"):
        for action, runs in (
            ("retry_selected", [t2_failed, system_failed]),
            ("cancel_selected", [t2_queued, system_queued]),
        ):
            for across in ("0", "1"):
                data = {
                    "action": action,
                    "index": 0,
                    "select_across": across,
                    "_selected_action": [str(r.pk) for r in runs],
                }
                client.post(f"{RUNS}{query}", data, follow=True)
    assert rows() == before
    assert not JobRun.objects.filter(trigger__startswith="retry:").exists()
