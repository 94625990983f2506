"""The run history in the admin: operators see everything, a tenant only its own, in its words.

Requests go through the real middleware stack with the host deciding the audience:
``localhost`` is the public schema (operators), ``t1.localhost`` is tenant t1. Runs come from
real jobs executed by a real RQ worker.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from decimal import Decimal
from types import SimpleNamespace
from typing import Any

import pytest
from django.contrib.admin import DateFieldListFilter
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import Client
from django_tenants.utils import schema_context

from kumiko_jobs import InvalidJob, operations, transport
from kumiko_jobs.models import JobFailure, JobRun, RunStatus
from kumiko_jobs.transport import keys as transport_keys
from tests.conftest import probes, work
from tests.testapp import jobs

pytestmark = pytest.mark.usefixtures("live_db")

PASSWORD = "correct horse battery staple"
RUNS = "/admin/kumiko_jobs/jobrun/"
FAILURES = "/admin/kumiko_jobs/jobfailure/"
RUN_JOB = "/admin/kumiko_jobs/jobrun/run-job/"
# Strings that only operators may ever see.
T1_SECRET = "s3cr3t-t1"
T2_SECRET = "s3cr3t-t2"
ERROR_TEXT = "boom on attempt"


def make_user(
    schema: str, username: str, *, superuser: bool = False, perms: Iterable[str] = ()
) -> Any:
    """A staff user in ``schema``'s own auth tables (auth is a tenant app).

    Auth tables are not truncated between tests, hence update-or-create.
    """
    User = get_user_model()
    with schema_context(schema):
        user = User.objects.filter(username=username).first() or User(username=username)
        user.is_staff = True
        user.is_superuser = superuser
        user.set_password(PASSWORD)
        user.save()
        codenames = list(perms)
        found = list(
            Permission.objects.filter(content_type__app_label="kumiko_jobs", codename__in=codenames)
        )
        assert len(found) == len(codenames), f"missing permissions in {schema}: {codenames}"
        user.user_permissions.set(found)
    return user


def client_for(host: str, schema: str, user: Any) -> Client:
    client = Client(HTTP_HOST=host)
    # The session lives in the schema the request will use (sessions is a tenant app too).
    with schema_context(schema):
        client.force_login(user)
    return client


@pytest.fixture
def operator_user() -> Any:
    """A superuser of the public schema: the operators' own auth tables."""
    return make_user("public", "operator", superuser=True)


@pytest.fixture
def operator(operator_user: Any) -> Client:
    return client_for("localhost", "public", operator_user)


@pytest.fixture
def clerk() -> Client:
    """A t1 staff user who may view runs and failures, nothing else."""
    user = make_user("t1", "clerk", perms=("view_jobrun", "view_jobfailure"))
    return client_for("t1.localhost", "t1", user)


@pytest.fixture
def history(tenants: dict[str, Any]) -> SimpleNamespace:
    """Succeeded, failed (tenant-visible), retried-with-logs and still-queued runs in t1/t2."""
    from example_project.billing.models import Invoice

    with schema_context("t1"):
        invoice = Invoice.objects.create(number="INV-1", amount=Decimal("12.50"))
    h = SimpleNamespace(
        t1_ok=jobs.probe.enqueue(tenant="t1", tag="t1-ok", payload={"secret": T1_SECRET}),
        t2_ok=jobs.probe.enqueue(tenant="t2", tag="t2-ok", payload={"secret": T2_SECRET}),
        t1_bad=jobs.flaky.enqueue(tenant="t1", tag="t1-bad", fail_times=99),
        t2_bad=jobs.flaky.enqueue(tenant="t2", tag="t2-bad", fail_times=99),
        t1_sync=jobs_by_name("billing.sync_invoice").enqueue(
            tenant="t1", invoice_id=invoice.pk, fail_times=1
        ),
    )
    work(scheduler_rounds=8)
    h.t2_waiting = jobs.probe.enqueue(tenant="t2", tag="t2-waiting", payload={"secret": T2_SECRET})
    statuses = {
        name: JobRun.objects.get(pk=handle.run_id).status for name, handle in vars(h).items()
    }
    assert statuses == {
        "t1_ok": RunStatus.SUCCEEDED,
        "t2_ok": RunStatus.SUCCEEDED,
        "t1_bad": RunStatus.FAILED,
        "t2_bad": RunStatus.FAILED,
        "t1_sync": RunStatus.SUCCEEDED,
        "t2_waiting": RunStatus.QUEUED,
    }
    return h


def jobs_by_name(name: str) -> Any:
    from kumiko_jobs.definition.registry import registry

    return registry.get(name)


def listed(response: Any) -> set[str]:
    """Run ids (hex) on a changelist page."""
    assert response.status_code == 200, response.content[:500]
    return {uuid.UUID(str(obj.pk)).hex for obj in response.context["cl"].result_list}


def ids(*handles: Any) -> set[str]:
    return {uuid.UUID(h.run_id).hex for h in handles}


def change_url(handle: Any) -> str:
    return f"{RUNS}{uuid.UUID(handle.run_id)}/change/"


def text(response: Any) -> str:
    return response.content.decode()


# --- rendering helpers (no database) ----------------------------------------------------------


# No django_db mark needed: live_db (this module's pytestmark) creates the test database
# through django_db_setup, and refuses to empty any database that is not a test database
# (refuse_unless_test_database, tests/conftest.py).
@pytest.mark.parametrize(
    ("ms", "shown"),
    [
        (None, "—"),
        (12.4, "12 ms"),
        (1530.0, "1.5 s"),
        (125_000.0, "2 min 5 s"),
        (7_380_000.0, "2 h 3 min"),
    ],
)
def test_durations_read_like_durations(ms, shown):
    from kumiko_jobs.admin.render import human_duration

    assert human_duration(ms) == shown


# --- operator --------------------------------------------------------------------------------


def test_operator_lists_runs_of_every_tenant(operator, history):
    response = operator.get(RUNS)
    assert listed(response) == ids(*vars(history).values())
    html = text(response)
    assert "Run a job…" in html
    assert 'class="kj-status kj-status-failed"' in html
    assert "3/3" in html  # attempts/max of the failed flaky runs


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("tenant=t2", ("t2_ok", "t2_bad", "t2_waiting")),
        ("status__exact=failed", ("t1_bad", "t2_bad")),
        ("job=billing.sync_invoice", ("t1_sync",)),
        ("tenant=t1&status__exact=succeeded", ("t1_ok", "t1_sync")),
        ("q=t2-ok", ("t2_ok",)),
        # As the date filter's links give them: with the time zone (a naive time warns).
        (
            "queued_at__gte=2000-01-01T00:00:00%2B00:00&queued_at__lt=2000-01-02T00:00:00%2B00:00",
            (),
        ),
    ],
)
def test_operator_filters_and_search(operator, history, query, expected):
    assert listed(operator.get(f"{RUNS}?{query}")) == ids(*(getattr(history, n) for n in expected))


def test_operator_finds_a_run_by_id_with_or_without_dashes(operator, history):
    run_id = history.t1_bad.run_id
    assert listed(operator.get(RUNS, {"q": run_id})) == ids(history.t1_bad)
    assert listed(operator.get(RUNS, {"q": str(uuid.UUID(run_id))})) == ids(history.t1_bad)


def test_operator_detail_shows_payload_error_attempts_and_logs(operator, history):
    html = text(operator.get(change_url(history.t1_ok)))
    assert T1_SECRET in html and "tag=t1-ok" in html

    html = text(operator.get(change_url(history.t1_bad)))
    assert "Traceback (most recent call last)" in html
    assert "RuntimeError: boom on attempt 3" in html
    assert html.count("boom on attempt") >= 3  # one per attempt, plus the run's error
    assert "The test job kept failing and has given up." in html  # what the tenant reads

    html = text(operator.get(change_url(history.t1_sync)))
    assert 'class="kj-log"' in html
    assert "provider timed out" in html and "WARNING" in html
    assert "synced" in html and "INV-1" in html


def test_retry_action_starts_a_new_run_with_the_same_arguments(operator, operator_user, history):
    queued_before = transport.queue_length("default")
    response = operator.post(
        RUNS,
        {
            "action": "retry_selected",
            "index": 0,
            "_selected_action": [history.t1_bad.run_id, history.t1_ok.run_id],
        },
        follow=True,
    )
    assert "1 run retried, 1 skipped: not failed or cancelled." in text(response)
    old = JobRun.objects.get(pk=history.t1_bad.run_id)
    new = JobRun.objects.get(trigger__startswith=f"retry:{old.run_id}")
    assert new.trigger == f"retry:{old.run_id} by operator"
    assert new.triggered_by == str(operator_user.pk)  # from the admin request
    assert (new.job_name, new.schema_name, new.payload, new.status) == (
        old.job_name,
        old.schema_name,
        old.payload,
        RunStatus.QUEUED,
    )
    assert old.status == RunStatus.FAILED  # history is not rewritten
    assert transport.queue_length("default") == queued_before + 1

    response = operator.post(
        RUNS,
        {"action": "retry_selected", "index": 0, "_selected_action": [old.run_id]},
        follow=True,
    )
    assert "0 runs retried, 1 skipped: already being retried." in text(response)

    work(scheduler_rounds=3)
    assert JobRun.objects.get(pk=new.pk).attempts == 3  # it really ran (and failed again)


def test_cancel_action_cancels_only_queued_runs(operator, history):
    response = operator.post(
        RUNS,
        {
            "action": "cancel_selected",
            "index": 0,
            "_selected_action": [history.t2_waiting.run_id, history.t2_ok.run_id],
        },
        follow=True,
    )
    assert "1 run cancelled, 1 skipped: already finished." in text(response)
    assert JobRun.objects.get(pk=history.t2_waiting.run_id).status == RunStatus.CANCELLED
    assert JobRun.objects.get(pk=history.t2_ok.run_id).status == RunStatus.SUCCEEDED

    work()  # the message is still in Redis; the runner drops it
    assert JobRun.objects.get(pk=history.t2_waiting.run_id).status == RunStatus.CANCELLED
    assert [p.tag for p in probes("t2")] == ["t2-ok", "t2-bad", "t2-bad", "t2-bad"]


def test_run_a_manual_job_from_the_form(operator, operator_user, tenants):
    page = text(operator.get(RUN_JOB))
    assert "billing.sync_invoice" in page and "invoice_id: int" in page
    assert 'value="testapp.probe"' not in page  # not declared manual=True

    response = operator.post(
        RUN_JOB, {"job": "billing.sync_invoice", "tenant": "t1", "arguments": '{"invoice_id": 7}'}
    )
    run = JobRun.objects.get()
    assert response.status_code == 302 and response["Location"] == f"{RUNS}{run.run_id}/change/"
    assert (run.job_name, run.schema_name, run.payload) == (
        "billing.sync_invoice",
        "t1",
        {"invoice_id": 7},
    )
    assert run.trigger == "manual by operator" and run.triggered_by == str(operator_user.pk)
    assert transport.queue_length("default") == 1


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (
            {"job": "billing.sync_invoice", "tenant": "t1", "arguments": '{"invoice_id": '},
            "Not valid JSON",
        ),
        (
            {"job": "billing.sync_invoice", "tenant": "t1", "arguments": "[7]"},
            "must be a JSON object",
        ),
        (
            {
                "job": "billing.sync_invoice",
                "tenant": "t1",
                "arguments": '{"invoice_id": 7, "invoce": 7}',
            },
            "unexpected keyword argument",
        ),
        ({"job": "billing.sync_invoice", "tenant": "t1", "arguments": "{}"}, "missing a required"),
        (
            {"job": "billing.sync_invoice", "tenant": "", "arguments": '{"invoice_id": 7}'},
            "Choose the tenant",
        ),
        (
            {"job": "billing.sync_invoice", "tenant": "public", "arguments": '{"invoice_id": 7}'},
            "Select a valid choice",
        ),
        (
            {"job": "testapp.probe", "tenant": "t1", "arguments": '{"tag": "x"}'},
            "Select a valid choice",
        ),
        (
            {
                "job": "billing.sync_invoice",
                "tenant": "t1",
                "arguments": '{"invoice_id": {"nested": [1, 2]}}',
            },
            "subject field",
        ),
    ],
)
def test_run_job_form_refuses_bad_input_and_enqueues_nothing(operator, tenants, data, error):
    response = operator.post(RUN_JOB, data)
    assert response.status_code == 200
    assert error in text(response)
    assert not JobRun.objects.exists()
    assert transport.queue_length("default") == 0


def test_operator_also_lists_failures(operator, history):
    html = text(operator.get(FAILURES))
    assert "testapp.flaky_failed" in html and "tag=t1-bad" in html and "tag=t2-bad" in html


# --- operations ------------------------------------------------------------------------------


def test_operations_refuse_what_does_not_apply(history):
    succeeded = JobRun.objects.get(pk=history.t1_ok.run_id)
    with pytest.raises(operations.OperationRefused, match="only failed or cancelled"):
        operations.retry_run(succeeded, by=None)
    assert operations.cancel_run(succeeded, by=None) == ""  # finished: nothing to do

    # A job removed from the code base since the run: simulate by renaming the run's job.
    JobRun.objects.filter(pk=history.t2_bad.run_id).update(job_name="testapp.removed")
    with pytest.raises(operations.OperationRefused, match="no longer registered"):
        operations.retry_run(JobRun.objects.get(pk=history.t2_bad.run_id), by=None)

    with pytest.raises(operations.OperationRefused, match="manual=True"):
        operations.enqueue_manual(jobs.probe, "t1", {"tag": "x"}, by=None)
    with pytest.raises(InvalidJob, match="No tenant"):
        operations.enqueue_manual("billing.sync_invoice", "ghost", {"invoice_id": 1}, by=None)


def test_cancel_loses_to_a_worker_that_already_started(history):
    waiting = JobRun.objects.get(pk=history.t2_waiting.run_id)
    work()  # the worker takes it first
    assert operations.cancel_run(waiting, by=None) == ""  # finished before the request
    assert JobRun.objects.get(pk=waiting.pk).status == RunStatus.SUCCEEDED


def test_retry_outside_a_request_records_who_asked_in_the_trigger(history, operator_user):
    handle = operations.retry_run(JobRun.objects.get(pk=history.t1_bad.run_id), by=operator_user)
    run = handle.refresh()
    assert run.trigger == f"retry:{uuid.UUID(history.t1_bad.run_id)} by operator"
    # Outside a request nothing fills triggered_by yet: submit() has no parameter for it.
    assert run.triggered_by == ""


# --- tenant ----------------------------------------------------------------------------------


def assert_no_operator_data(html: str, *runs: JobRun) -> None:
    for secret in (
        T1_SECRET,
        T2_SECRET,
        ERROR_TEXT,
        "RuntimeError",
        "Traceback",
        "t2-ok",
        "t2-bad",
        "t2-waiting",
        "secret",
    ):
        assert secret not in html, secret
    for run in runs:
        for value in (run.correlation_id, run.rq_job_id, run.trace_id):
            if value:
                assert value not in html


def test_tenant_lists_only_its_own_runs_and_no_operator_fields(clerk, history):
    response = clerk.get(RUNS)
    assert listed(response) == ids(history.t1_ok, history.t1_bad, history.t1_sync)
    html = text(response)
    assert "Run a job…" not in html and "action-select" not in html
    assert "Send an invoice to the (pretend) accounting provider." in html  # job description
    assert "The test job kept failing and has given up." in html  # the failed run's problem
    assert_no_operator_data(html, *JobRun.objects.all())


def test_tenant_detail_shows_tenant_fields_only(clerk, history):
    for handle in (history.t1_ok, history.t1_bad, history.t1_sync):
        response = clerk.get(change_url(handle))
        assert response.status_code == 200
        html = text(response)
        assert_no_operator_data(html, *JobRun.objects.all())
        for operator_only in ("provider timed out", "INV-1", "payload", "attempt", "trigger"):
            assert operator_only not in html.lower(), operator_only
    assert "tag=t1-bad" in text(clerk.get(change_url(history.t1_bad)))


def test_tenant_cannot_open_another_tenants_run(clerk, history):
    for url in (change_url(history.t2_ok), change_url(history.t2_ok).replace("change", "history")):
        response = clerk.get(url, follow=True)
        assert response.redirect_chain and response.redirect_chain[-1][0] == "/admin/"
        assert_no_operator_data(text(response))
    failure_t2 = JobFailure.objects.get(schema_name="t2")
    response = clerk.get(f"{FAILURES}{failure_t2.pk}/change/")
    assert response.status_code == 302


@pytest.mark.parametrize(
    "query",
    [
        "payload__secret=s3cr3t-t1",
        "error_message__contains=boom",
        "schema_name=t2",
        "tenant=t2",
        "correlation_id__startswith=a",
        "trigger__isnull=False",
    ],
)
def test_tenant_cannot_filter_on_hidden_fields(clerk, history, query):
    assert clerk.get(f"{RUNS}?{query}").status_code == 400


def test_tenant_search_looks_at_subjects_only(clerk, history):
    assert listed(clerk.get(RUNS, {"q": "t1-bad"})) == ids(history.t1_bad)
    assert listed(clerk.get(RUNS, {"q": T1_SECRET})) == set()
    assert listed(clerk.get(RUNS, {"q": history.t1_bad.run_id})) == set()
    assert listed(clerk.get(RUNS, {"q": "t2-ok"})) == set()


def test_tenant_filters_stay_within_the_tenant(clerk, history):
    response = clerk.get(RUNS, {"status__exact": "failed"})
    assert listed(response) == ids(history.t1_bad)
    job_choices = {
        c["display"]
        for spec in response.context["cl"].filter_specs
        if getattr(spec, "parameter_name", "") == "job"
        for c in spec.choices(response.context["cl"])
    }
    assert "Send an invoice to the (pretend) accounting provider." in job_choices
    assert "testapp.probe" in job_choices


@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_the_date_filters_links_are_aware_times_for_both_audiences(operator, clerk, history):
    """Each link of the run list's "queued at" filter (Django's DateFieldListFilter), followed
    on either audience's list, filters without a naive datetime (its RuntimeWarning is an
    error here); "Past 7 days" lists the audience's runs."""
    for client, runs in (
        (operator, ids(*vars(history).values())),
        (clerk, ids(history.t1_ok, history.t1_bad, history.t1_sync)),
    ):
        changelist = client.get(RUNS).context["cl"]
        (spec,) = [s for s in changelist.filter_specs if isinstance(s, DateFieldListFilter)]
        links = {str(c["display"]): c["query_string"] for c in spec.choices(changelist)}
        assert len(links) == 5, links  # any date, today, past 7 days, this month, this year
        for query in links.values():
            listed(client.get(f"{RUNS}{query}"))
        assert listed(client.get(f"{RUNS}{links['Past 7 days']}")) == runs


def test_tenant_reads_failures_as_translated_sentences(clerk, history):
    english = text(clerk.get(FAILURES))
    assert "The test job kept failing and has given up." in english
    assert "tag=t1-bad" in english and "tag=t2-bad" not in english
    assert "testapp.flaky_failed" not in english  # the key, not the sentence
    assert_no_operator_data(english)

    failure = JobFailure.objects.get(schema_name="t1")
    detail = text(clerk.get(f"{FAILURES}{failure.pk}/change/"))
    assert "The test job kept failing and has given up." in detail
    assert_no_operator_data(detail)

    german = text(clerk.get(FAILURES, HTTP_ACCEPT_LANGUAGE="de"))
    assert "Der Testauftrag ist wiederholt fehlgeschlagen und wurde aufgegeben." in german
    german_runs = text(clerk.get(RUNS, HTTP_ACCEPT_LANGUAGE="de"))
    assert "Der Testauftrag ist wiederholt fehlgeschlagen" in german_runs


def test_tenant_has_no_operator_tools_even_as_superuser(history):
    """A tenant's superuser holds ``operate_tenant_runs`` (every permission of its tenant's auth
    tables), so it retries its own tenant's runs; another tenant's, "Run a job…" and the
    operators' tables stay out of reach (issue 26)."""
    boss = client_for("t1.localhost", "t1", make_user("t1", "t1-boss", superuser=True))
    assert listed(boss.get(RUNS)) == ids(history.t1_ok, history.t1_bad, history.t1_sync)
    assert boss.get(RUN_JOB).status_code == 403
    assert boss.get("/admin/kumiko_jobs/rejectedmessage/").status_code == 403
    assert boss.get("/admin/kumiko_jobs/escapehatchuse/").status_code == 403
    assert boss.get("/admin/kumiko_jobs/jobattempt/").status_code == 404  # never registered
    runs_before = set(JobRun.objects.values_list("pk", flat=True))
    boss.post(
        RUNS, {"action": "retry_selected", "index": 0, "_selected_action": [history.t2_bad.run_id]}
    )
    assert set(JobRun.objects.values_list("pk", flat=True)) == runs_before
    boss.post(
        RUNS, {"action": "retry_selected", "index": 0, "_selected_action": [history.t1_bad.run_id]}
    )
    (retry,) = JobRun.objects.exclude(pk__in=runs_before)
    assert retry.schema_name == "t1" and retry.trigger.endswith("by t1-boss (tenant t1)")
    assert_no_operator_data(text(boss.get(change_url(history.t1_bad))))


def test_tenant_permissions_govern_access(history):
    nobody = client_for("t1.localhost", "t1", make_user("t1", "t1-nobody"))
    assert nobody.get(RUNS).status_code == 403
    assert nobody.get(FAILURES).status_code == 403
    runs_only = client_for("t1.localhost", "t1", make_user("t1", "t1-runs", perms=("view_jobrun",)))
    assert runs_only.get(RUNS).status_code == 200
    assert runs_only.get(FAILURES).status_code == 403
    # A t1 user does not exist on t2's domain: its session is t1's.
    assert runs_only.get(RUNS, HTTP_HOST="t2.localhost").status_code == 302


def test_operator_sees_escape_hatch_uses_read_only(operator):
    from django.utils import timezone

    from kumiko_jobs.models import EscapeHatchUse

    now = timezone.now()
    use = EscapeHatchUse.objects.create(
        job_name="billing.rebuild_prices",
        grant="global_writes",
        reason="rebuilds the index",
        schema_name="t1",
        actor="user:7",
        first_seen=now,
        last_seen=now,
        count=3,
    )
    page = text(operator.get("/admin/kumiko_jobs/escapehatchuse/"))
    assert "billing.rebuild_prices" in page and "rebuilds the index" in page
    detail = operator.get(f"/admin/kumiko_jobs/escapehatchuse/{use.pk}/change/")
    assert detail.status_code == 200
    assert 'name="_save"' not in detail.content.decode()  # read-only: nothing to save
    assert operator.get("/admin/kumiko_jobs/escapehatchuse/add/").status_code == 403


def test_cancel_action_asks_a_running_run_to_stop(operator, history, redis_conn):
    run_id = history.t2_waiting.run_id
    # As the records step marks a run the moment a worker starts it.
    JobRun.objects.filter(pk=run_id).update(status=RunStatus.RUNNING)
    response = operator.post(
        RUNS,
        {"action": "cancel_selected", "index": 0, "_selected_action": [run_id]},
        follow=True,
    )
    assert "0 runs cancelled, 1 running run asked to stop." in text(response)
    run = JobRun.objects.get(pk=run_id)
    # Still running: the worker's beat carries the request to the job, which ends the run.
    assert run.status == RunStatus.RUNNING
    assert run.cancel_requested_by == "operator" and run.cancel_requested_at is not None
    assert redis_conn.get(transport_keys.CANCEL_KEY + run_id) == b"operator"
    assert redis_conn.ttl(transport_keys.CANCEL_KEY + run_id) > 0


def test_a_tenants_breadcrumb_names_the_run_by_its_jobs_title(clerk, operator):
    """The run page's breadcrumb: the job's title for a tenant (not its dotted name, which is
    the operators'); an operator's breadcrumb keeps Django's str(run)."""
    from tests.testapp import jobs

    handle = jobs.list_tags.enqueue(tenant="t1", tag="crumb")
    page = text(clerk.get(f"{RUNS}{handle.run_id}/change/"))
    crumb = page.split('aria-current="page">', 1)[1].split("<", 1)[0]
    assert crumb.startswith("Record every tag this run can see"), crumb
    assert jobs.list_tags.name not in crumb
    mine = text(operator.get(f"{RUNS}{handle.run_id}/change/"))
    assert jobs.list_tags.name in mine.split('aria-current="page">', 1)[1].split("<", 1)[0]
