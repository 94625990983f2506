"""The operations dashboard: the operators' page, a tenant's console, the metrics page.

Through the real admin (middleware, login, django-tenants' hosts: ``localhost`` is the public
schema, ``t1.localhost`` tenant t1) on real PostgreSQL and Redis, with runs executed by a real
RQ worker; the isolation tests plant rows in two tenants' history and check that one tenant's
console never shows the other's. Denied paths are asked of every page and JSON endpoint.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable
from datetime import timedelta
from typing import Any
from urllib.parse import urlencode

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.contrib.contenttypes.models import ContentType
from django.core.cache import cache
from django.test import Client
from django.utils import timezone
from django_tenants.utils import schema_context

from kumiko_jobs import transport
from kumiko_jobs.models import JobRun, RunStatus
from kumiko_jobs.worker import Worker
from tests.conftest import work
from tests.testapp import jobs

pytestmark = pytest.mark.usefixtures("live_db")

PASSWORD = "correct horse battery staple"
BASE = "/admin/kumiko_jobs/jobrun/"
DASHBOARD, DATA, METRICS = (
    f"{BASE}dashboard/",
    f"{BASE}dashboard/data/",
    f"{BASE}dashboard/metrics/",
)
CONSOLE, CONSOLE_DATA = f"{BASE}console/", f"{BASE}console/data/"
OPERATOR_URLS = (DASHBOARD, DATA, METRICS)
CONSOLE_URLS = (CONSOLE, CONSOLE_DATA)
# Job names planted in one tenant only: the other tenant's console must never show them.
T1_JOB, T2_JOB = "acme.t1_private_report", "globex.t2_private_payroll"


def view_all_tenants() -> Permission:
    """The operators' permission (another branch adds it by migration; made here if missing)."""
    from kumiko_jobs.models import JobRun as Run

    permission, _ = Permission.objects.get_or_create(
        codename="view_all_tenants",
        content_type=ContentType.objects.get_for_model(Run),
        defaults={"name": "Can view every tenant's runs"},
    )
    return permission


def make_user(schema: str, username: str, perms: Iterable[str] = (), **flags: bool) -> Any:
    """A staff user in ``schema``'s own auth tables, holding exactly ``perms`` (codenames)."""
    User = get_user_model()
    with schema_context(schema):
        user = User.objects.filter(username=username).first() or User(username=username)
        user.is_staff = flags.get("staff", True)
        user.is_superuser = flags.get("superuser", False)
        user.set_password(PASSWORD)
        user.save()
        if "view_all_tenants" in perms:
            view_all_tenants()
        found = list(
            Permission.objects.filter(content_type__app_label="kumiko_jobs", codename__in=perms)
        )
        assert len(found) == len(list(perms)), f"missing permissions in {schema}: {perms}"
        user.user_permissions.set(found)
    return user


def client_for(host: str, schema: str, user: Any | None) -> Client:
    client = Client(HTTP_HOST=host)
    if user is not None:
        with schema_context(schema):
            client.force_login(user)
    return client


@pytest.fixture(autouse=True)
def _fresh_cache() -> None:
    # The day and week charts are cached; each test plants its own history.
    cache.clear()


@pytest.fixture
def operator() -> Client:
    """A public-schema staff user holding view_all_tenants and view_jobrun, not a superuser."""
    return client_for(
        "localhost", "public", make_user("public", "ops", ("view_all_tenants", "view_jobrun"))
    )


@pytest.fixture
def clerk() -> Client:
    """A t1 staff user who may view t1's runs."""
    return client_for("t1.localhost", "t1", make_user("t1", "clerk", ("view_jobrun",)))


def plant(schema: str, job: str, statuses: Iterable[str], *, minutes_ago: float = 5) -> None:
    """History rows as the runner writes them, finished ``minutes_ago`` (wait 2 s, 30 ms)."""
    now = timezone.now() - timedelta(minutes=minutes_ago)
    JobRun.objects.bulk_create(
        JobRun(
            run_id=uuid.uuid4(),
            job_name=job,
            schema_name=schema,
            status=status,
            queue="default",
            attempts=1,
            queued_at=now - timedelta(seconds=2),
            started_at=now,
            finished_at=now if status in (RunStatus.SUCCEEDED, RunStatus.FAILED) else None,
            duration_ms=30.0,
            error_type="RuntimeError" if status == RunStatus.FAILED else "",
        )
        for status in statuses
    )


def payload(response: Any) -> dict[str, Any]:
    assert response.status_code == 200, response.content[:500]
    return json.loads(response.content)


def total(points: list[dict[str, Any]], field: str) -> int:
    return sum(point[field] for point in points)


# --------------------------------------------------------------------------- operators


def test_operator_numbers_match_the_history(operator: Client) -> None:
    """Runs executed by a real worker: the series count what the history holds, by outcome."""
    for n in range(3):
        jobs.probe.enqueue(tenant="t1", tag=f"ok-{n}")
    jobs.flaky.enqueue(tenant="t2", tag="bad", fail_times=99)
    work(scheduler_rounds=8)
    assert operator.get(DASHBOARD).status_code == 200
    data = payload(operator.get(DATA))
    points = data["series"]["points"]
    assert len(points) == 60  # one a minute over the hour
    runs = JobRun.objects.all()
    assert total(points, "succeeded") == runs.filter(status=RunStatus.SUCCEEDED).count() == 3
    assert total(points, "failed") == runs.filter(status=RunStatus.FAILED).count() == 1
    assert total(points, "started") == runs.exclude(started_at=None).count() == 4
    assert total(points, "retried") == runs.filter(attempts__gt=1).count()
    durations = [p["duration_ms"] for p in points if p["duration_ms"]]
    assert durations and all(len(d) == 3 and d[0] <= d[1] <= d[2] for d in durations)

    only_t2 = payload(operator.get(DATA, {"tenant": "t2"}))["series"]["points"]
    assert total(only_t2, "succeeded") == 0 and total(only_t2, "failed") == 1
    by_job = payload(operator.get(DATA, {"job": jobs.probe.name, "window": "week"}))
    assert total(by_job["series"]["points"], "succeeded") == 3
    assert len(by_job["series"]["points"]) == 168


def test_failures_grouped_and_linked_to_the_filtered_run_list(operator: Client) -> None:
    plant("t1", T1_JOB, [RunStatus.FAILED] * 4 + [RunStatus.SUCCEEDED])
    plant("t2", T2_JOB, [RunStatus.FAILED] * 2)
    groups = payload(operator.get(DATA))["failures"]
    assert [(g["job"], g["error_type"], g["count"]) for g in groups] == [
        (T1_JOB, "RuntimeError", 4),
        (T2_JOB, "RuntimeError", 2),
    ]
    listed = operator.get(groups[0]["link"])
    assert listed.status_code == 200
    rows = listed.context["cl"].result_list
    assert {(r.job_name, r.status) for r in rows} == {(T1_JOB, RunStatus.FAILED)}
    assert len(rows) == 4


def test_queue_depth_backlog_and_metrics(operator: Client) -> None:
    """Messages really pushed to Redis and not yet worked: the queue's depth, the tenants'
    backlog, and the Prometheus page, labelled by queue only."""
    for n in range(3):
        jobs.probe.enqueue(tenant="t1", tag=f"wait-{n}")
    jobs.probe.enqueue(tenant="t2", tag="wait-t2")
    data = payload(operator.get(DATA))
    depth = {q["queue"]: q["waiting"] for q in data["queues"]}
    assert depth["default"] == 4 == transport.queue_length("default")
    assert [(t["tenant"], t["waiting"]) for t in data["backlog"]["tenants"]] == [
        ("t1", 3),
        ("t2", 1),
    ]

    metrics = operator.get(METRICS)
    assert metrics.status_code == 200
    assert metrics["Content-Type"].startswith("text/plain; version=0.0.4")
    text = metrics.content.decode()
    assert 'kumiko_jobs_queue_depth{queue="default"} 4' in text
    assert 'kumiko_jobs_backlog_per_worker{queue="default"} 4' in text  # no worker listens
    assert "kumiko_jobs_runs_running 0" in text
    assert "t1" not in text and "tenant" not in text


def test_pauses_shown_with_their_controls_for_who_may_use_them(operator: Client) -> None:
    """The pauses in force are listed; an operator who may add and delete pauses gets the
    pauses' add form (each queue, failing job and backlogged tenant links to it, filled in) and
    each pause's resume page, which pause and resume for real; one who may not gets neither."""
    from kumiko_jobs.models import FlowPause
    from kumiko_jobs.worker import pauses

    pauses.pause(tenant="t2", by="ops")
    data = payload(operator.get(DATA))
    assert [(p["schema_name"], p["paused_by"], p["resume_link"]) for p in data["pauses"]] == [
        ("t2", "ops", "")
    ]
    assert data["pause_url"] == ""

    actor = client_for(
        "localhost",
        "public",
        make_user(
            "public",
            "pauser",
            ("view_all_tenants", "view_jobrun", "add_flowpause", "delete_flowpause"),
        ),
    )
    data = payload(actor.get(DATA))
    (shown,) = data["pauses"]
    pause_id = FlowPause.objects.get(schema_name="t2").pk
    assert shown["resume_link"] == f"/admin/kumiko_jobs/flowpause/{pause_id}/delete/"
    assert data["pause_url"] == "/admin/kumiko_jobs/flowpause/add/"
    form = actor.get(data["pause_url"], {"queue": "default"})
    assert form.status_code == 200
    assert b'value="default"' in form.content
    added = actor.post(data["pause_url"], {"queue": "default", "job_name": "", "schema_name": ""})
    assert added.status_code == 302, added.content[:500]
    assert FlowPause.objects.filter(queue="default").exists()
    resumed = actor.post(shown["resume_link"], {"post": "yes"})
    assert resumed.status_code == 302
    assert not FlowPause.objects.filter(schema_name="t2").exists()
    assert [p["queue"] for p in payload(actor.get(DATA))["pauses"]] == ["default"]


def test_workers_listed_with_their_heartbeat(operator: Client, redis_conn: Any) -> None:
    """A real kumiko worker registered in Redis (as ``rqworker`` does at start) and beating."""
    queue = transport.get_queue("default")
    worker = Worker([queue], connection=queue.connection, name="dash-worker")
    worker.register_birth()
    try:
        transport.beat(redis_conn, worker.name, "", 30)
        jobs.probe.enqueue(tenant="t1", tag="for-the-worker")
        data = payload(operator.get(DATA))
        listed = {w["name"]: w for w in data["workers"]["listed"]}
        assert data["workers"]["total"] == 1
        assert listed["dash-worker"]["kumiko"] is True
        assert listed["dash-worker"]["queues"] == ["default"]
        assert listed["dash-worker"]["heartbeat_ago_s"] is not None
        text = operator.get(METRICS).content.decode()
        assert 'kumiko_jobs_queue_workers{queue="default"} 1' in text
        assert 'kumiko_jobs_backlog_per_worker{queue="default"} 1' in text
    finally:
        worker.register_death()
        transport.goodbye(redis_conn, worker.name)


def test_bad_filters_are_refused_naming_the_fix(operator: Client) -> None:
    for params, words in (
        ({"window": "year"}, "hour, day, week"),
        ({"queue": "nosuch"}, "RQ_QUEUES"),
        ({"job": "x" * 300}, "at most 200"),
        ({"tenant": "t1\x00"}, "without NUL"),
    ):
        response = operator.get(DATA, params)
        assert response.status_code == 400
        assert words in json.loads(response.content)["error"]


# --------------------------------------------------------------------------- who may see it


def test_operators_pages_refused_to_everyone_else() -> None:
    """A tenant's staff (even a tenant superuser), a public staff user without view_all_tenants
    (with every model permission), and anonymous users: no page, no JSON, no metrics."""
    refused = {
        "tenant superuser": client_for(
            "t1.localhost", "t1", make_user("t1", "boss", superuser=True)
        ),
        "tenant staff": client_for(
            "t1.localhost", "t1", make_user("t1", "clerk2", ("view_jobrun",))
        ),
        "public staff without the permission": client_for(
            "localhost",
            "public",
            make_user("public", "helpdesk", ("view_jobrun", "change_jobrun", "manage_queues")),
        ),
    }
    plant("t1", T1_JOB, [RunStatus.FAILED])
    for who, client in refused.items():
        for url in OPERATOR_URLS:
            response = client.get(url)
            assert response.status_code == 403, (who, url, response.status_code)
            assert T1_JOB.encode() not in response.content
    for url in (*OPERATOR_URLS, *CONSOLE_URLS):
        anonymous = client_for("localhost", "public", None).get(url)
        assert anonymous.status_code == 302 and "/login/" in anonymous["Location"], url


def test_a_superuser_of_the_public_schema_is_an_operator() -> None:
    admin = client_for("localhost", "public", make_user("public", "root", superuser=True))
    assert admin.get(DASHBOARD).status_code == 200
    assert admin.get(DATA).status_code == 200


# --------------------------------------------------------------------------- a tenant's console


def test_a_tenants_console_shows_only_its_own_numbers(clerk: Client) -> None:
    """Planted in t1 and t2: t1's console counts t1's runs and names no job of t2's, in its HTML
    or its JSON, whatever parameters it is sent. (Without the console's schema condition in
    history/stats.py the t2 job and counts appear here: checked by removing it.)"""
    plant("t1", T1_JOB, [RunStatus.SUCCEEDED] * 3 + [RunStatus.FAILED])
    plant("t2", T2_JOB, [RunStatus.FAILED] * 5)
    page = clerk.get(CONSOLE)
    assert page.status_code == 200
    for params in ({}, {"tenant": "t2"}, {"schema_name": "t2"}, {"job": T2_JOB}, {"days": "30"}):
        data = payload(clerk.get(CONSOLE_DATA, params))
        # The filters are echoed back as sent; everything else is t1's numbers.
        data.pop("filters")
        assert T2_JOB not in json.dumps(data), params
        assert total(data["days"], "failed") <= 1, params
    data = payload(clerk.get(CONSOLE_DATA))
    assert total(data["days"], "runs") == 4
    assert total(data["days"], "succeeded") == 3
    # The failed count links to the tenant's own failed runs of that job (where retry is).
    failed = f"{BASE}?{urlencode({'job': T1_JOB, 'status__exact': 'failed'})}"
    assert data["jobs"] == [
        {"job": T1_JOB, "finished": 4, "failed": 1, "rate": 0.25, "failed_link": failed}
    ]
    assert T2_JOB.encode() not in page.content


def test_console_refused_outside_its_audience() -> None:
    """No console on the operators' domain (operators have the dashboard), none for a tenant's
    staff user without the run list's view permission."""
    plant("t1", T1_JOB, [RunStatus.FAILED])
    no_perm = client_for("t1.localhost", "t1", make_user("t1", "intern", ()))
    operator = client_for("localhost", "public", make_user("public", "ops2", ("view_all_tenants",)))
    for client in (no_perm, operator):
        for url in CONSOLE_URLS:
            response = client.get(url)
            assert response.status_code == 403, url
            assert T1_JOB.encode() not in response.content


def test_console_bad_days_refused(clerk: Client) -> None:
    for days in ("0", "31", "many"):
        response = clerk.get(CONSOLE_DATA, {"days": days})
        assert response.status_code == 400
        assert "1 to 30" in json.loads(response.content)["error"]


def test_static_files_ship_with_the_app() -> None:
    """The charts are the app's own static files (no CDN): found by Django's finders."""
    from django.contrib.staticfiles import finders

    for name in ("charts.js", "dashboard.js", "dashboard.css"):
        assert finders.find(f"kumiko_jobs/{name}"), name


def test_run_list_links_to_what_its_user_may_open(operator: Client, clerk: Client) -> None:
    """The run list's tools: the dashboard for an operator, the console for a tenant's user,
    neither for public staff without view_all_tenants (whom the run list itself refuses)."""
    assert DASHBOARD.encode() in operator.get(BASE).content
    tenant_list = clerk.get(BASE)
    assert CONSOLE.encode() in tenant_list.content and DASHBOARD.encode() not in tenant_list.content
    helpdesk = client_for("localhost", "public", make_user("public", "desk", ("view_jobrun",)))
    page = helpdesk.get(BASE)
    assert page.status_code == 403
    assert DASHBOARD.encode() not in page.content and CONSOLE.encode() not in page.content


def test_redis_unreachable_the_history_still_shows_and_metrics_say_503(operator: Client) -> None:
    """Every queue pointed at a port where no Redis listens: the dashboard's JSON keeps the
    history's numbers and says why queues and workers are missing; the metrics page answers 503
    (a scraper must not read an outage as empty queues)."""
    from django.conf import settings
    from django.test import override_settings

    plant("t1", T1_JOB, [RunStatus.SUCCEEDED] * 2)
    nowhere = {
        name: {**config, "URL": "redis://127.0.0.1:1/0"}
        for name, config in settings.RQ_QUEUES.items()
    }
    with override_settings(RQ_QUEUES=nowhere):
        data = payload(operator.get(DATA))
        metrics = operator.get(METRICS)
    assert total(data["series"]["points"], "succeeded") == 2
    assert data["redis_error"] and data["queues"] == [] and data["workers"]["listed"] == []
    assert metrics.status_code == 503
    assert b"Redis unavailable" in metrics.content


def test_settled_points_are_kept_and_summed_with_fresh_ones(operator: Client) -> None:
    """A refresh reads only the points that may still change: a point that ended minutes ago
    comes from the cache (a row planted there afterwards is not read: that is the saving, and
    why a point is kept only once settled), summed with the current point's, read fresh. The
    failure groups are not kept with the points: they are merged whole by the database (the
    rollup's buckets, none here, and the raw history after them), so they count the late row."""
    plant("t1", T1_JOB, [RunStatus.FAILED] * 2, minutes_ago=5)
    first = payload(operator.get(DATA))
    assert [(g["job"], g["count"]) for g in first["failures"]] == [(T1_JOB, 2)]
    assert total(first["series"]["points"], "failed") == 2
    plant("t1", T1_JOB, [RunStatus.FAILED], minutes_ago=0)
    plant("t1", T1_JOB, [RunStatus.FAILED], minutes_ago=5)  # behind the kept point
    second = payload(operator.get(DATA))
    assert [(g["job"], g["count"]) for g in second["failures"]] == [(T1_JOB, 4)]
    assert total(second["series"]["points"], "failed") == 3
    cache.clear()
    assert total(payload(operator.get(DATA))["series"]["points"], "failed") == 4


def test_a_tenants_session_opens_no_other_tenants_console(clerk: Client) -> None:
    """t1's logged-in client asking t2's domain: t2 does not know the session (auth lives in
    each schema), so the console and its JSON send it to t2's login, and show nothing of t2."""
    plant("t2", T2_JOB, [RunStatus.FAILED] * 2)
    for url in CONSOLE_URLS:
        response = clerk.get(url, HTTP_HOST="t2.localhost")
        assert response.status_code == 302 and "/login/" in response["Location"], url
        assert T2_JOB.encode() not in response.content
