"""The web surfaces around the guard (issue 17): django-rq's pages, pickle in the web process,
bad admin query strings, and the example project's defaults.

Everything goes through the real middleware stack against the real PostgreSQL and Redis; the
host decides the audience (``localhost``: operators, ``t1.localhost``: tenant t1).
"""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from kumiko_jobs.models import EscapeHatchUse, JobFailure, JobRun, RejectedMessage
from tests.conftest import work
from tests.integration.test_admin import client_for, make_user
from tests.testapp import jobs

pytestmark = pytest.mark.usefixtures("live_db")

# --- bad query strings on every kumiko admin list (issue 17, item 8) ---------------------------

OPERATOR_LISTS = (
    "/admin/kumiko_jobs/jobrun/",
    "/admin/kumiko_jobs/jobfailure/",
    "/admin/kumiko_jobs/rejectedmessage/",
    "/admin/kumiko_jobs/escapehatchuse/",
)
TENANT_LISTS = ("/admin/kumiko_jobs/jobrun/", "/admin/kumiko_jobs/jobfailure/")
HUGE = "x" * 200_000
BAD_QUERIES = (
    {"job": "\x00"},
    {"status__exact": "\x00"},
    {"status__exact": "no-such-status"},
    {"q": "\x00"},
    {"q": "ab\x00cd"},
    {"q": HUGE},
    {"job": HUGE},
    {"tenant": "\x00"},
    {"tenant": HUGE},
    {"grant": "\x00"},
    {"queue": "\x00"},
    {"job_name": "\x00"},
    {"schema_name": "\x00"},
    {"queued_at__gte": "not-a-date"},
    {"queued_at__gte": "\x00"},
    {"queued_at__lt": "2026-13-45"},
    {"queued_at__isnull": "maybe"},
    {"failed_at__gte": "99999-01-01"},
    {"failed_at__lt": "\x00"},
    {"received_at__gte": "yesterday"},
    {"no_such_param": "1"},
    {"\x00": "1"},
    {"o": "\x00"},
    {"o": "999"},
    {"o": "1.-x"},
    {"p": "\x00"},
    {"p": "999999999999"},
    {"p": "-1"},
    {"_to_field": "payload"},
    {"e": "\x00"},
)


def _query_id(query: dict[str, str]) -> str:
    return "&".join(f"{k[:20]!r}={v[:20]!r}" for k, v in query.items())


@pytest.fixture
def some_history(tenants: dict[str, Any]) -> None:
    """A run and a failure in t1 and t2, a rejected message and an escape hatch use, so every
    list has rows to filter."""
    from django.utils import timezone

    jobs.probe.enqueue(tenant="t1", tag="t1-ok")
    jobs.flaky.enqueue(tenant="t2", tag="t2-bad", fail_times=99)
    work(scheduler_rounds=8)
    assert JobFailure.objects.filter(schema_name="t2").exists()
    RejectedMessage.objects.create(rq_job_id="kj-x", queue="default", reason="test", excerpt="{}")
    now = timezone.now()
    EscapeHatchUse.objects.update_or_create(  # not truncated between tests
        job_name="billing.rebuild_prices",
        grant="global_writes",
        schema_name="t1",
        actor="",
        defaults={"reason": "test", "first_seen": now, "last_seen": now},
    )


def _unhandled(client: Client, path: str) -> list[str]:
    """The bad queries ``path`` does not refuse cleanly. NUL characters and huge values get a
    400; other bad input a 400, Django's "?e=1" redirect for a bad lookup, or a page (of
    nothing, for a value that matches nothing); never a 500."""
    client.raise_request_exception = False
    problems = []
    for query in BAD_QUERIES:
        response = client.get(path, query)
        status = response.status_code
        if any("\x00" in t or len(t) > 1000 for t in (*query, *query.values())):
            ok = status == 400  # refused before any query runs
        else:
            ok = status in (200, 400) or (status == 302 and "e=1" in response["Location"])
        if not ok:
            problems.append(f"{_query_id(query)} -> {status}")
    return problems


@pytest.mark.parametrize("path", OPERATOR_LISTS)
def test_operator_lists_refuse_bad_query_strings(some_history, path):
    operator = client_for("localhost", "public", make_user("public", "operator", superuser=True))
    assert operator.get(path).status_code == 200  # calibration: the page itself works
    assert _unhandled(operator, path) == []


@pytest.mark.parametrize("path", TENANT_LISTS)
def test_tenant_lists_refuse_bad_query_strings(some_history, path):
    clerk = client_for(
        "t1.localhost", "t1", make_user("t1", "clerk", perms=("view_jobrun", "view_jobfailure"))
    )
    assert clerk.get(path).status_code == 200
    assert _unhandled(clerk, path) == []


# --- django-rq's pages: operators only (issue 17, item 1) --------------------------------------

RQ = "/django-rq/"
PUBLIC_URLCONF = "example_project.urls_public"
# A value for every converter django-rq's routes use; queue 0 is "default" (sorted by name).
SAMPLE_KWARGS = {
    "queue_index": 0,
    "scheduler_index": 0,
    "connection_index": 0,
    "result_id": "r1",
    "key": "w1",
    "scheduler_name": "s1",
    "cron_job_name": "c1",
    "token": "not_the_token",
}


def rq_urls(job_id: str) -> list[str]:
    """Every django-rq route (from django-rq's own URL list, so none is forgotten)."""
    from django.urls import reverse

    from kumiko_jobs.urls import django_rq_patterns

    urls = set()
    for pattern in django_rq_patterns():
        converters = getattr(pattern.pattern, "converters", {})
        kwargs = {k: job_id if k == "job_id" else SAMPLE_KWARGS[k] for k in converters}
        urls.add(reverse(f"django_rq:{pattern.name}", kwargs=kwargs, urlconf=PUBLIC_URLCONF))
    urls.add(f"{RQ}stats.json/not_the_token/")
    return sorted(urls)


@pytest.fixture
def queued_message(tenants: dict[str, Any]) -> str:
    """A committed t2 run whose message waits in the default queue; its RQ job id."""
    from kumiko_jobs import transport

    jobs.probe.enqueue(tenant="t2", tag="t2-waiting", payload={"secret": "t2-secret"})
    ids = transport.get_queue("default").job_ids
    assert len(ids) == 1
    return str(ids[0])


def assert_message_intact(job_id: str) -> None:
    from kumiko_jobs import transport

    queue = transport.get_queue("default")
    assert queue.job_ids == [job_id]
    assert queue.connection.exists(f"rq:job:{job_id}")


@pytest.fixture(params=["example_project.urls_tenant", "tests.urls_tenant_rq_guarded"])
def tenant_urlconf(request: Any, settings: Any) -> str:
    """The example's tenants' URLconf, and one that (by mistake) includes kumiko's helper."""
    settings.ROOT_URLCONF = request.param
    return str(request.param)


def test_a_tenant_domain_never_serves_django_rq(queued_message, tenant_urlconf):
    boss = client_for("t1.localhost", "t1", make_user("t1", "t1-boss", superuser=True))
    staff = client_for("t1.localhost", "t1", make_user("t1", "t1-staff"))
    for client in (boss, staff):
        for url in [*rq_urls(queued_message), "/admin/django_rq/dashboard/"]:
            assert client.get(url).status_code == 404, url
            assert client.post(url, {"job_ids": [queued_message]}).status_code == 404, url
    assert_message_intact(queued_message)


def test_calibration_unguarded_django_rq_lets_tenant_staff_empty_the_queue(
    queued_message, settings
):
    """What the guard prevents: django-rq's own views admit any staff user, on any domain."""
    from kumiko_jobs import transport
    from kumiko_jobs.checks import check_django_rq_exposure

    settings.ROOT_URLCONF = "tests.urls_tenant_rq_unguarded"
    staff = client_for("t1.localhost", "t1", make_user("t1", "t1-staff"))
    page = staff.get(f"{RQ}queues/0/")
    assert page.status_code == 200 and queued_message in page.content.decode()
    assert staff.post(f"{RQ}queues/0/empty/").status_code == 302
    assert transport.get_queue("default").count == 0
    # ... and the system check names that URLconf.
    errors = [e for e in check_django_rq_exposure() if e.id == "kumiko_jobs.E009"]
    assert len(errors) == 1 and "tests.urls_tenant_rq_unguarded" in errors[0].msg


def test_operators_need_the_manage_queues_permission(queued_message):
    staff = client_for("localhost", "public", make_user("public", "plain-staff"))
    for url in rq_urls(queued_message):
        # A URL carrying a token is judged by the token alone (a wrong one: 401).
        denied = 401 if "not_the_token" in url else 403
        assert staff.get(url).status_code == denied, url
        assert staff.post(url, {"job_ids": [queued_message]}).status_code == denied, url
    # A bearer token does not let the session's is_staff in: only a valid token would.
    bearer = staff.get(f"{RQ}stats.json/", HTTP_AUTHORIZATION="Bearer wrong")
    assert bearer.status_code == 401
    assert_message_intact(queued_message)

    anonymous = Client(HTTP_HOST="localhost")
    response = anonymous.get(f"{RQ}queues/0/")
    assert response.status_code == 302 and "/admin/login/" in response["Location"]


def test_operators_with_the_permission_use_django_rq_on_kumiko_messages(queued_message):
    keeper = client_for(
        "localhost", "public", make_user("public", "queue-keeper", perms=("manage_queues",))
    )
    for page in (
        "",
        "queues/0/",
        "queues/0/details/",
        "queues/0/failed/",
        "queues/0/finished/",
        "queues/0/scheduled/",
        "queues/0/started/",
        "queues/0/deferred/",
        "workers/0/",
        "schedulers/0/",
        f"queues/0/{queued_message}/",
        "stats.json/",
    ):
        assert keeper.get(f"{RQ}{page}").status_code == 200, page
    detail = keeper.get(f"{RQ}queues/0/{queued_message}/").content.decode()
    assert "kumiko_jobs.runner.execute" in detail


def test_the_stats_token_still_works_without_a_session(queued_message, settings):
    settings.RQ_API_TOKEN = "operators_token"
    anonymous = Client(HTTP_HOST="localhost")
    assert anonymous.get(f"{RQ}stats.json/operators_token/").status_code == 200
    ok = anonymous.get(f"{RQ}stats.json/", HTTP_AUTHORIZATION="Bearer operators_token")
    assert ok.status_code == 200
    assert anonymous.get(f"{RQ}stats.json/wrong/").status_code == 401
    # Never on a tenant's domain, token or not.
    settings.ROOT_URLCONF = "tests.urls_tenant_rq_guarded"
    tenant = Client(HTTP_HOST="t1.localhost")
    assert tenant.get(f"{RQ}stats.json/operators_token/").status_code == 404


# --- no pickle in the web process (issue 17, item 2) -------------------------------------------


class _Planted:
    """Unpickling this runs a shell command that creates the marker file."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        import os

        return (os.system, (f"touch {self.marker}",))


PLANTED_ID = "planted-pickle"


def plant_pickle_job(marker: str) -> None:
    """A job hash written by someone with Redis access, listed wherever django-rq looks."""
    import pickle
    import zlib

    from kumiko_jobs import transport

    queue = transport.get_queue("default")
    redis = queue.connection
    payload = pickle.dumps(_Planted(marker))
    redis.hset(
        f"rq:job:{PLANTED_ID}",
        mapping={
            "data": zlib.compress(payload),
            "meta": payload,
            "result": payload,
            "origin": "default",
            "status": "failed",
            "description": "planted",
            "created_at": "2026-11-30T00:00:00.000000Z",
            "enqueued_at": "2026-11-30T00:00:00.000000Z",
        },
    )
    redis.rpush(queue.key, PLANTED_ID)
    for registry in (
        queue.failed_job_registry,
        queue.finished_job_registry,
        queue.started_job_registry,
        queue.deferred_job_registry,
        queue.scheduled_job_registry,
    ):
        redis.zadd(registry.key, {PLANTED_ID: 4_000_000_000})
    redis.zadd(transport.scheduler_for("default").scheduled_jobs_key, {PLANTED_ID: 4_000_000_000})


def test_django_rq_pages_never_unpickle_a_planted_job(tenants, tmp_path, settings):
    marker = tmp_path / "pwned"
    plant_pickle_job(str(marker))
    operator = client_for("localhost", "public", make_user("public", "operator", superuser=True))
    operator.raise_request_exception = False  # a page may refuse the forged job; it must not run it
    for url in rq_urls(PLANTED_ID):
        operator.get(url)  # 200 for lists; the job's own page refuses it (a 500 in django-rq)
        assert not marker.exists(), url
    operator.post(
        f"{RQ}queues/confirm-action/0/", {"action": "delete", "_selected_action": [PLANTED_ID]}
    )
    assert not marker.exists()

    # Calibration: the same pages with RQ_QUEUES as the README had it (no SERIALIZER) run it.
    settings.RQ_QUEUES = {
        name: {k: v for k, v in config.items() if k != "SERIALIZER"}
        for name, config in settings.RQ_QUEUES.items()
    }
    operator.get(f"{RQ}queues/0/{PLANTED_ID}/")
    assert marker.exists()


def test_queue_serializer_check_names_the_fix(settings):
    from kumiko_jobs.checks import check_queue_serializers

    assert check_queue_serializers() == []  # the example's (and tests') settings
    json_default = settings.RQ_QUEUES["default"]
    settings.RQ_QUEUES = {
        "default": {**json_default, "SERIALIZER": "rq.serializers.DefaultSerializer"},  # pickle
        # "low" is used by a Django task lane (settings.TASKS) and a test job, so keep it JSON.
        "low": json_default,
        "spare": {k: v for k, v in json_default.items() if k != "SERIALIZER"},  # unused by jobs
        "elsewhere": json_default,
    }
    found = {(m.id, m.msg.split("'")[1]): m for m in check_queue_serializers()}
    assert set(found) == {("kumiko_jobs.E010", "default"), ("kumiko_jobs.W002", "spare")}
    hint = found[("kumiko_jobs.E010", "default")].hint
    assert hint == 'Add "SERIALIZER": "rq.serializers.JSONSerializer" to RQ_QUEUES[\'default\'].'


# --- emptying queues loses no committed run, deleting cron entries no schedule -----------------


@pytest.fixture
def queue_keeper() -> Client:
    return client_for(
        "localhost", "public", make_user("public", "queue-keeper", perms=("manage_queues",))
    )


@pytest.mark.parametrize("how", ["empty the queue", "delete the message"])
def test_the_relay_restores_messages_removed_through_django_rq(queue_keeper, queued_message, how):
    from kumiko_jobs import transport
    from kumiko_jobs.worker.relay import relay_pending
    from tests.conftest import probes

    url = (
        f"{RQ}queues/0/empty/"
        if how == "empty the queue"
        else f"{RQ}queues/0/{queued_message}/delete/"
    )
    assert queue_keeper.post(url).status_code == 302
    assert transport.get_queue("default").count == 0
    assert not transport.get_queue("default").connection.exists(f"rq:job:{queued_message}")
    work()
    assert probes("t2") == []  # gone from Redis: nothing ran
    (run,) = JobRun.objects.all()
    assert run.status == "queued"  # ... but the committed run still waits

    assert relay_pending(grace=0).pushed == 1
    work()
    assert [p.tag for p in probes("t2")] == ["t2-waiting"]
    run.refresh_from_db()
    assert run.status == "succeeded"


def test_the_scheduler_restores_cron_entries_deleted_through_django_rq(queue_keeper, tenants):
    """rq-scheduler syncs kumiko's cron entries only when it starts; every later round of its
    loop (``enqueue_jobs``, under its lock) now puts back what was deleted meanwhile."""
    from kumiko_jobs import transport
    from kumiko_jobs.enqueueing.schedules import sync_schedules

    sync_schedules()
    before = transport.cron_entries()
    assert "kj-cron-kumiko_jobs_sweep_abandoned" in before  # housekeeping too
    deleted_by_page, cancelled = sorted(before)[0], sorted(before)[1:]
    response = queue_keeper.post(f"{RQ}queues/0/{deleted_by_page}/delete/")
    assert response.status_code == 302
    scheduler = transport.scheduler_for("default")
    for sid in cancelled:
        scheduler.cancel(sid)  # what "delete" on the scheduler's own registry amounts to
    assert transport.cron_entries() == {}
    assert transport.missing_cron_entries(sorted(before)) == sorted(before)

    scheduler.enqueue_jobs()  # one round of the running rqscheduler's loop

    assert transport.cron_entries() == before
    assert transport.missing_cron_entries(sorted(before)) == []
    # Restoring is idempotent: a second round changes nothing.
    times = dict(scheduler.get_jobs(with_times=True))
    scheduler.enqueue_jobs()
    assert dict(scheduler.get_jobs(with_times=True)).keys() == times.keys()


def test_exposure_check_passes_the_example_and_fails_the_admin_link(settings):
    import gc

    from django.apps import apps
    from django.contrib import admin

    from kumiko_jobs.checks import check_django_rq_exposure

    assert check_django_rq_exposure() == []  # the example: admin link off, helper in urls_public
    # What RQ_SHOW_ADMIN_LINK=True does: django-rq's Dashboard on an admin site.
    site = admin.AdminSite(name="with_rq_link")
    site.register(apps.get_model("django_rq", "Dashboard"))
    try:
        (error,) = check_django_rq_exposure()
        assert error.id == "kumiko_jobs.E008" and "'with_rq_link'" in error.msg
        assert "RQ_SHOW_ADMIN_LINK = False" in error.hint
    finally:
        del site
        gc.collect()
    settings.PUBLIC_SCHEMA_URLCONF = "tests.urls_tenant_rq_guarded"  # guarded: still fine
    assert check_django_rq_exposure() == []


# --- the example project: safe by default (issue 17, item 8) -----------------------------------

SYNC = "/invoices/{}/sync/"


@pytest.fixture
def invoice_id(tenants: dict[str, Any]) -> int:
    from decimal import Decimal

    from django_tenants.utils import schema_context

    from example_project.billing.models import Invoice

    with schema_context("t1"):
        return int(Invoice.objects.create(number="INV-9", amount=Decimal("1.00")).pk)


def test_sync_view_changes_state_only_by_post_from_signed_in_users(invoice_id):
    url = SYNC.format(invoice_id)
    anonymous = Client(HTTP_HOST="t1.localhost")
    assert anonymous.get(url).status_code == 405
    assert anonymous.post(url).status_code == 403
    user = make_user("t1", "clerk")
    signed_in = client_for("t1.localhost", "t1", user)
    assert signed_in.get(url).status_code == 405
    # Another tenant's session is no session here (users live in the tenant's schema).
    assert (
        client_for("t2.localhost", "t2", make_user("t2", "clerk"))
        .post(url, HTTP_HOST="t1.localhost")
        .status_code
        == 403
    )
    assert not JobRun.objects.exists()

    # CSRF is checked: no token, no enqueue; with the token, a run.
    strict = Client(HTTP_HOST="t1.localhost", enforce_csrf_checks=True)
    from django_tenants.utils import schema_context

    with schema_context("t1"):
        strict.force_login(user)
    assert strict.post(url).status_code == 403
    assert not JobRun.objects.exists()
    token = "k" * 32
    strict.cookies["csrftoken"] = token
    response = strict.post(url, HTTP_X_CSRFTOKEN=token)
    assert response.status_code == 200
    run = JobRun.objects.get()
    assert (run.schema_name, run.job_name) == ("t1", "billing.sync_invoice")
    assert str(run.triggered_by) == str(user.pk)


@pytest.mark.parametrize(("env", "debug"), [({}, False), ({"KUMIKO_EXAMPLE_DEBUG": "1"}, True)])
def test_example_debug_is_off_unless_asked(env, debug):
    import os
    import subprocess
    import sys

    from tests.conftest import ROOT

    clean = {
        k: v for k, v in os.environ.items() if k not in ("KUMIKO_EXAMPLE_DEBUG", "DJANGO_DEBUG")
    }
    out = subprocess.run(
        [sys.executable, "-c", "import example_project.settings as s; print(s.DEBUG)"],
        cwd=ROOT,
        env={**clean, **env},
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == str(debug)


def test_a_cron_entry_outlives_its_own_tick(tenants):
    """Each tick runs the entry's own RQ job; its hash must not expire afterwards (it did, after
    RESULT_TTL seconds, and rq-scheduler then dropped the entry at the next tick)."""
    from kumiko_jobs import transport
    from kumiko_jobs.enqueueing.schedules import sync_schedules

    sync_schedules()
    sid = "kj-cron-kumiko_jobs_delete_expired"  # daily: its next tick is hours away
    scheduler = transport.scheduler_for("default")
    redis = scheduler.connection
    redis.zadd(scheduler.scheduled_jobs_key, {sid: 1})  # due now
    assert transport.move_due_scheduled_jobs("default") == 1
    work()
    assert JobRun.objects.filter(job_name="kumiko_jobs.delete_expired").count() == 1
    assert redis.ttl(f"rq:job:{sid}") == -1  # no expiry
    assert transport.missing_cron_entries([sid]) == []
    assert redis.zscore(scheduler.scheduled_jobs_key, sid) > 1  # rescheduled for its next tick
