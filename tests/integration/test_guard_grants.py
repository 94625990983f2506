"""The DB guard's allowed paths: declared grants, call-site opt-ins, audit, write origin, modes.

Every run goes through a real RQ worker (``work()``, in this process, so ``override_settings``
applies to the worker too).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AnonymousUser
from django.db import connection, connections
from django.http import HttpRequest, HttpResponse
from django.test import Client as HttpClient
from django.test import RequestFactory, override_settings
from django_tenants.utils import tenant_context

from kumiko_jobs import EscapeHatch, InvalidJob
from kumiko_jobs.definition.options import build_definition
from kumiko_jobs.guard.wrapper import GuardWrapper
from kumiko_jobs.models import EscapeHatchUse, JobRun, RunStatus
from kumiko_jobs.origin import KumikoJobsMiddleware
from tests.conftest import work
from tests.guardapp import jobs, support

pytestmark = pytest.mark.usefixtures("live_db")


SETTINGS = {"DB_GUARD": "enforce", "DEFAULT_RETRIES": 0}


@pytest.fixture
def guard_data(live_db: None) -> Iterator[None]:
    support.seed()
    yield
    support.clean()


@pytest.fixture
def t1_user(tenants: dict[str, Any]) -> Iterator[Any]:
    """A user of tenant t1 (auth is a tenant app: the row lives in t1's schema)."""
    user_model = get_user_model()
    with tenant_context(tenants["t1"]):
        user_model.objects.filter(username="guard-alice").delete()
        user = user_model.objects.create_user("guard-alice", password="pw")
    yield user
    with tenant_context(tenants["t1"]):
        user_model.objects.filter(username="guard-alice").delete()
    connection.set_schema_to_public()


def run_in(tenant: Any, enqueue: Callable[[], Any]) -> JobRun:
    """Enqueue in ``tenant`` (None: a system job), run the worker, return the run row."""
    if tenant is None:
        handle = enqueue()
    else:
        with tenant_context(tenant):
            handle = enqueue()
    work()
    connection.set_schema_to_public()
    return JobRun.objects.get(pk=handle.run_id)


def assert_denied(run: JobRun, *fragments: str) -> None:
    assert run.status == RunStatus.FAILED, (run.status, run.error_message)
    assert run.error_type == "DatabaseAccessDenied", run.error_message
    for fragment in fragments:
        assert fragment in run.error_message, run.error_message


def assert_succeeded(run: JobRun) -> None:
    assert run.status == RunStatus.SUCCEEDED, (run.error_type, run.error_message)


def uses() -> list[tuple[str, str, str, str, str, int]]:
    return [
        (u.job_name, u.grant, u.reason, u.schema_name, u.actor, u.count)
        for u in EscapeHatchUse.objects.order_by("job_name", "grant", "actor")
    ]


# --- global_writes ------------------------------------------------------------------------------


def test_global_writes_inside_the_block_only(tenants, guard_data):
    run = run_in(tenants["t1"], lambda: jobs.write_plan.enqueue(name="gold"))
    assert_succeeded(run)
    assert ("gold", "9.00") in support.plans()
    assert uses() == [
        ("guardapp.write_plan", "global_writes", "maintains the shared plan catalogue", "t1", "", 1)
    ]

    run = run_in(tenants["t1"], lambda: jobs.write_plan.enqueue(name="silver", also_outside=True))
    assert_denied(
        run,
        "'guardapp.write_plan' (tenant t1) was denied an insert statement",
        "shared table 'catalog_plan' needs the global_writes grant",
        "The job declares 'global_writes': wrap this code in `with ctx.global_writes():`",
    )
    names = [name for name, _ in support.plans()]
    assert "silver" in names and "silver-outside" not in names


# --- cross_tenant_reads -------------------------------------------------------------------------


def test_cross_tenant_reads_sees_the_other_tenant_then_comes_back(tenants, guard_data):
    run = run_in(tenants["t1"], lambda: jobs.read_other.enqueue(other="t2"))
    assert_succeeded(run)
    assert support.findings("t1") == {
        "inside": "t2-value",
        "after": "t1-value",
        "schema_after": "t1",
    }
    assert uses() == [
        (
            "guardapp.read_other",
            "cross_tenant_reads",
            "compares settings with a sister tenant",
            "t1",
            "",
            1,
        )
    ]


def test_cross_tenant_reads_may_name_the_granted_schema(tenants, guard_data):
    run = run_in(tenants["t1"], lambda: jobs.read_other.enqueue(other="t2", then="qualified_other"))
    assert_succeeded(run)


@pytest.mark.parametrize(
    ("then", "fragments"),
    [
        ("write", ("denied an insert statement", "while reading schema 't2'", "read-only")),
        ("update", ("denied an update statement", "while reading schema 't2'", "read-only")),
        ("lock", ("row locks (FOR UPDATE/SHARE)", "while reading schema 't2'")),
        (
            "third_tenant",
            ("reference to schema 't3' needs the cross_tenant_reads grant for it",),
        ),
    ],
)
def test_cross_tenant_reads_is_read_only_and_for_one_tenant(tenants, guard_data, then, fragments):
    run = run_in(tenants["t1"], lambda: jobs.read_other.enqueue(other="t2", then=then))
    assert_denied(run, "'guardapp.read_other'", *fragments)
    assert support.secrets("t2") == [("t2-secret", "t2-value")]
    assert support.secrets("t3") == [("t3-secret", "t3-value")]
    assert support.findings("t1") == {}


# --- unsafe_raw ---------------------------------------------------------------------------------


def test_unsafe_raw_allows_session_settings_and_ddl_inside_the_block(tenants, guard_data):
    run = run_in(tenants["t1"], lambda: jobs.tune.enqueue())
    assert_succeeded(run)
    assert support.findings("t1") == {"statement_timeout": "5s", "scratch_rows": "2"}
    assert uses() == [("guardapp.tune", "unsafe_raw", "tunes a slow report", "t1", "", 1)]

    run = run_in(tenants["t1"], lambda: jobs.tune.enqueue(also_outside=True))
    assert_denied(
        run,
        "denied a set statement",
        "The job declares 'unsafe_raw': wrap this code in `with ctx.unsafe_raw():`",
    )


# --- act_as (system_identity) -------------------------------------------------------------------


def test_act_as_sets_the_current_user_inside_the_block_only(tenants, guard_data, t1_user):
    run = run_in(tenants["t1"], lambda: jobs.on_behalf.enqueue(user_id=t1_user.pk))
    assert_succeeded(run)
    assert support.findings("t1") == {"before": "None", "inside": repr(t1_user.pk), "after": "None"}
    # The audit names the user the job acted as.
    assert uses() == [
        (
            "guardapp.on_behalf",
            "system_identity",
            "applies a change on behalf of the requesting user",
            "t1",
            f"user:{t1_user.pk}",
            1,
        )
    ]


# --- system_db ----------------------------------------------------------------------------------


def test_system_job_writes_shared_tables_inside_system_db(guard_data):
    run = run_in(None, lambda: jobs.system_plans.enqueue(name="sys"))
    assert_succeeded(run)
    assert run.schema_name == ""
    assert ("sys", "1.00") in support.plans()
    assert uses() == [("guardapp.system_plans", "system_db", "system job", "", "", 1)]

    run = run_in(None, lambda: jobs.system_plans.enqueue(name="sys2", also_outside=True))
    assert_denied(
        run, "denied an insert statement", "System jobs write inside `with ctx.system_db():`"
    )
    names = [name for name, _ in support.plans()]
    assert "sys2" in names and "sys2-outside" not in names


# --- opt-ins without the declaration ------------------------------------------------------------


@pytest.mark.parametrize(
    ("which", "declaration"),
    [
        ("unsafe_raw", "escape_hatch=EscapeHatch(reason='why', grants=['unsafe_raw'])"),
        ("global_writes", "escape_hatch=EscapeHatch(reason='why', grants=['global_writes'])"),
        (
            "cross_tenant_reads",
            "escape_hatch=EscapeHatch(reason='why', grants=['cross_tenant_reads'])",
        ),
        ("act_as", "escape_hatch=EscapeHatch(reason='why', grants=['system_identity'])"),
        ("system_db", "declare @job(system=True) on 'guardapp.undeclared'"),
    ],
)
def test_opt_in_without_the_declaration_fails_the_run(tenants, guard_data, which, declaration):
    run = run_in(tenants["t1"], lambda: jobs.undeclared.enqueue(which=which))
    assert run.status == RunStatus.FAILED
    assert run.error_type == "InvalidJob"
    assert declaration in run.error_message
    assert run.attempts == 1
    assert support.findings("t1") == {}
    assert uses() == []


def _a_job(ctx: Any) -> None:
    pass


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: EscapeHatch(reason="", grants=["global_writes"]), "needs a reason"),
        (lambda: EscapeHatch(reason="   ", grants=["global_writes"]), "needs a reason"),
        (lambda: EscapeHatch(reason="why", grants=[]), "non-empty list of grants"),
        (lambda: EscapeHatch(reason="why", grants="global_writes"), "non-empty list of grants"),
        (lambda: EscapeHatch(reason="why", grants=["global_write"]), "unknown grant"),
        (lambda: EscapeHatch(reason="why", grants=["superuser"]), "unknown grant"),
        (
            lambda: build_definition(_a_job, {"escape_hatch": {"reason": "why"}}),
            "escape_hatch must be EscapeHatch",
        ),
    ],
)
# The django_db mark makes pytest-django create the test database even when this file runs
# alone; without any such test in the session it would not.
@pytest.mark.django_db
def test_bad_declarations_fail_at_registration(make, message):
    with pytest.raises(InvalidJob, match=message):
        make()


# --- audit deduplication ------------------------------------------------------------------------


def test_uses_are_deduplicated_within_the_window(tenants, guard_data, caplog):
    caplog.set_level(logging.WARNING, logger="kumiko_jobs.audit")
    for name in ("a", "b"):
        assert_succeeded(run_in(tenants["t1"], lambda n=name: jobs.write_plan.enqueue(name=n)))
    assert [u[-1] for u in uses()] == [1]
    lines = [r for r in caplog.records if r.name == "kumiko_jobs.audit"]
    assert len(lines) == 1
    assert "escape hatch global_writes used by guardapp.write_plan in t1" in lines[0].getMessage()


def test_without_a_window_every_run_reports(tenants, guard_data):
    with override_settings(KUMIKO_JOBS={**SETTINGS, "ESCAPE_HATCH_DEDUPE_SECONDS": 0}):
        for name in ("a", "b"):
            assert_succeeded(run_in(tenants["t1"], lambda n=name: jobs.write_plan.enqueue(name=n)))
    assert [u[-1] for u in uses()] == [2]
    row = EscapeHatchUse.objects.get()
    assert row.first_seen < row.last_seen


def test_an_allowed_use_is_audited_even_if_the_run_then_fails(tenants, guard_data):
    run = run_in(tenants["t1"], lambda: jobs.write_plan.enqueue(name="x", also_outside=True))
    assert run.status == RunStatus.FAILED
    assert [(u[1], u[-1]) for u in uses()] == [("global_writes", 1)]
    assert EscapeHatchUse.objects.get().last_run_id.hex == run.run_id.hex


def test_each_tenant_and_actor_is_its_own_audit_row(tenants, guard_data, t1_user):
    with tenant_context(tenants["t1"]):
        user_model = get_user_model()
        other = user_model.objects.create_user("guard-bob", password="pw")
    try:
        for user_id in (t1_user.pk, other.pk, t1_user.pk):
            run = run_in(tenants["t1"], lambda u=user_id: jobs.on_behalf.enqueue(user_id=u))
            assert_succeeded(run)
        assert_succeeded(run_in(tenants["t2"], lambda: jobs.write_plan.enqueue(name="t2-plan")))
    finally:
        with tenant_context(tenants["t1"]):
            user_model.objects.filter(pk=other.pk).delete()
        connection.set_schema_to_public()
    assert sorted((u[1], u[3], u[4], u[5]) for u in uses()) == sorted(
        [
            ("system_identity", "t1", f"user:{t1_user.pk}", 1),
            ("system_identity", "t1", f"user:{other.pk}", 1),
            ("global_writes", "t2", "", 1),
        ]
    )


# --- write origin -------------------------------------------------------------------------------


def _post(client: HttpClient, path: str) -> str:
    with override_settings(ROOT_URLCONF="tests.guardapp.urls"):
        response = client.post(
            path, {"name": "Ann", "email": "ann@example.com"}, HTTP_HOST="t1.localhost"
        )
    connection.set_schema_to_public()
    assert response.status_code == 200, response.content
    return str(response.json()["run_id"])


def _people(tenant: Any) -> list[tuple[str, str]]:
    from tests.guardapp.models import Person

    with tenant_context(tenant):
        rows = list(Person.objects.values_list("name", "email"))
    connection.set_schema_to_public()
    return rows


def test_anonymous_request_may_not_write_personal_data(tenants, guard_data):
    run_id = _post(HttpClient(), "/signup/")
    run = JobRun.objects.get(pk=run_id)
    assert run.status == RunStatus.QUEUED
    work()
    run.refresh_from_db()
    assert_denied(
        run,
        "'guardapp.save_person' (tenant t1) was denied an insert statement",
        "writes personal data to 'guardapp_person'",
        "public_intake_required",
        "@kumiko_jobs.origin.public_intake",
    )
    assert _people(tenants["t1"]) == []


def test_public_intake_view_may_write_personal_data(tenants, guard_data):
    run_id = _post(HttpClient(), "/intake/")
    work()
    assert_succeeded(JobRun.objects.get(pk=run_id))
    assert _people(tenants["t1"]) == [("Ann", "ann@example.com")]


def test_authenticated_request_may_write_personal_data(tenants, guard_data, t1_user):
    client = HttpClient()
    with tenant_context(tenants["t1"]):
        client.force_login(t1_user)  # the session lives in t1's schema
    run_id = _post(client, "/signup/")
    work()
    run = JobRun.objects.get(pk=run_id)
    assert_succeeded(run)
    assert run.triggered_by == str(t1_user.pk)
    assert _people(tenants["t1"]) == [("Ann", "ann@example.com")]


def test_anonymous_origin_may_write_other_columns(tenants, guard_data):
    from tests.guardapp.models import Person

    with tenant_context(tenants["t1"]):
        Person.objects.create(name="Old", email="old@example.com")
    handles: list[Any] = []

    def view(request: HttpRequest) -> HttpResponse:
        handles.append(jobs.rename_people.enqueue(name="New"))
        return HttpResponse("ok")

    request = RequestFactory().post("/rename/")
    request.user = AnonymousUser()
    with tenant_context(tenants["t1"]):
        KumikoJobsMiddleware(view)(request)
    connection.set_schema_to_public()
    work()
    assert_succeeded(JobRun.objects.get(pk=handles[0].run_id))
    assert _people(tenants["t1"]) == [("New", "old@example.com")]


# --- modes --------------------------------------------------------------------------------------


def test_log_mode_lets_the_statement_run_and_logs_it(tenants, guard_data, caplog):
    caplog.set_level(logging.WARNING, logger="kumiko_jobs.guard")
    with override_settings(KUMIKO_JOBS={**SETTINGS, "DB_GUARD": "log"}):
        run = run_in(tenants["t1"], lambda: jobs.attack.enqueue(case="orm_create_shared"))
    assert_succeeded(run)
    assert ("free-forever", "0.00") in support.plans()
    lines = [r.getMessage() for r in caplog.records if r.name == "kumiko_jobs.guard"]
    assert len(lines) == 1
    assert lines[0].startswith("DB guard (log mode) would deny: Job 'guardapp.attack' (tenant t1)")
    assert "needs the global_writes grant" in lines[0]


def test_off_mode_installs_nothing(tenants, guard_data, caplog):
    caplog.set_level(logging.WARNING, logger="kumiko_jobs.guard")
    with override_settings(KUMIKO_JOBS={**SETTINGS, "DB_GUARD": "off"}):
        assert_succeeded(run_in(tenants["t1"], lambda: jobs.guard_installed.enqueue()))
        run = run_in(tenants["t1"], lambda: jobs.attack.enqueue(case="orm_create_shared"))
    assert_succeeded(run)
    assert support.findings("t1") == {"default": "False"}
    assert ("free-forever", "0.00") in support.plans()
    assert [r for r in caplog.records if r.name == "kumiko_jobs.guard"] == []


def test_enforce_mode_guards_every_alias_for_the_job_body_only(tenants, guard_data):
    with support.extra_alias() as alias:
        assert_succeeded(run_in(tenants["t1"], lambda: jobs.guard_installed.enqueue()))
        after = [
            any(isinstance(w, GuardWrapper) for w in c.execute_wrappers) for c in connections.all()
        ]
    assert support.findings("t1") == {"default": "True", alias: "True"}
    assert after == [False, False]
