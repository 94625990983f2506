"""The refusal messages users read, built by the one builder (``guard/denials.py``): no database.

Each expected text below was produced by the message function as it was before the builder
existed (``guard/wrapper.py``'s ``denial_message``, commit f58831c), for one refusal of each
rule and each hint: moving the wording to one place changed none of it. The texts are pinned
whole, so a renamed rule or a changed hint fails here.
"""

# ruff: noqa: E501  (the messages are pinned whole, one per line, as users read them)
from __future__ import annotations

import pytest

from kumiko_jobs.core.exceptions import DatabaseAccessDenied
from kumiko_jobs.core.grants import Grant
from kumiko_jobs.guard import denials
from kumiko_jobs.guard.verdict import Rule, Verdict
from kumiko_jobs.guard.watch import Watch

CASES = [
    (
        False,
        (),
        Verdict(
            False,
            "insert",
            Grant("global_writes"),
            None,
            "INSERT on shared table 'catalog_plan' needs the global_writes grant",
            Rule("shared_write"),
        ),
        "Job 'billing.sync' (tenant t1) was denied an insert statement: INSERT on shared table 'catalog_plan' needs the global_writes grant. If this is intended, declare escape_hatch=EscapeHatch(reason='...', grants=['global_writes']) on the job and wrap the code in `with ctx.global_writes():`.",
    ),
    (
        False,
        ("global_writes",),
        Verdict(
            False,
            "insert",
            Grant("global_writes"),
            None,
            "INSERT on shared table 'catalog_plan' needs the global_writes grant",
            Rule("shared_write"),
        ),
        "Job 'billing.sync' (tenant t1) was denied an insert statement: INSERT on shared table 'catalog_plan' needs the global_writes grant. The job declares 'global_writes': wrap this code in `with ctx.global_writes():`.",
    ),
    (
        True,
        (),
        Verdict(
            False,
            "update",
            Grant("global_writes"),
            None,
            "UPDATE on shared table 'catalog_plan' needs the global_writes grant",
            Rule("shared_write"),
        ),
        "Job 'billing.sync' (tenant t1) was denied an update statement: UPDATE on shared table 'catalog_plan' needs the global_writes grant. System jobs write inside `with ctx.system_db():`.",
    ),
    (
        False,
        (),
        Verdict(
            False,
            "select",
            Grant("cross_tenant_reads"),
            None,
            "reference to schema 't2' needs the cross_tenant_reads grant for it",
            Rule("cross_schema"),
        ),
        "Job 'billing.sync' (tenant t1) was denied a select statement: reference to schema 't2' needs the cross_tenant_reads grant for it. If this is intended, declare escape_hatch=EscapeHatch(reason='...', grants=['cross_tenant_reads']) on the job and wrap the code in `with ctx.cross_tenant_reads(other_tenant):`.",
    ),
    (
        False,
        ("cross_tenant_reads",),
        Verdict(
            False,
            "select",
            Grant("cross_tenant_reads"),
            None,
            "reference to schema 't2' needs the cross_tenant_reads grant for it",
            Rule("cross_schema"),
        ),
        "Job 'billing.sync' (tenant t1) was denied a select statement: reference to schema 't2' needs the cross_tenant_reads grant for it. The job declares 'cross_tenant_reads': wrap this code in `with ctx.cross_tenant_reads(other_tenant):`.",
    ),
    (
        False,
        (),
        Verdict(
            False,
            "ddl",
            Grant("unsafe_raw"),
            None,
            "CreateStmt statements cannot be verified; needs the unsafe_raw grant",
            Rule("unverifiable"),
        ),
        "Job 'billing.sync' (tenant t1) was denied a ddl statement: CreateStmt statements cannot be verified; needs the unsafe_raw grant. If this is intended, declare escape_hatch=EscapeHatch(reason='...', grants=['unsafe_raw']) on the job and wrap the code in `with ctx.unsafe_raw():`.",
    ),
    (
        False,
        (),
        Verdict(
            False,
            "insert",
            None,
            None,
            "INSERT writes personal data to 'app_contact' but the run's origin is anonymous without public intake",
            Rule("public_intake_required"),
        ),
        "Job 'billing.sync' (tenant t1) was denied an insert statement: INSERT writes personal data to 'app_contact' but the run's origin is anonymous without public intake. No grant allows this (rule public_intake_required): enqueue it from a view marked @kumiko_jobs.origin.public_intake if anonymous visitors may submit this data.",
    ),
    (
        False,
        (),
        Verdict(
            False,
            "select",
            None,
            None,
            "kumiko_jobs_jobrun: kumiko's own table(s)",
            Rule("protected"),
        ),
        "Job 'billing.sync' (tenant t1) was denied a select statement: kumiko_jobs_jobrun: kumiko's own table(s). No grant allows this: kumiko's history is read through its API (a run's own results: RunHandle.refresh(), get_result()); runs and tenants are changed through the admin, manage.py, or a system job inside ctx.system_db().",
    ),
    (
        False,
        (),
        Verdict(
            False,
            "select",
            None,
            None,
            "public.django_session: the operators' own table(s)",
            Rule("operators"),
        ),
        "Job 'billing.sync' (tenant t1) was denied a select statement: public.django_session: the operators' own table(s). No grant allows this in a tenant run.",
    ),
    (
        False,
        (),
        Verdict(False, "select", None, None, "reading pg_stats of the catalogs", Rule("catalog")),
        "Job 'billing.sync' (tenant t1) was denied a select statement: reading pg_stats of the catalogs. No grant allows this in a tenant run.",
    ),
    (
        False,
        (),
        Verdict(
            False,
            "update",
            None,
            None,
            "UPDATE on 't2.x': a tenant run never writes outside its own schema",
            Rule("cross_schema"),
        ),
        "Job 'billing.sync' (tenant t1) was denied an update statement: UPDATE on 't2.x': a tenant run never writes outside its own schema. No grant allows this; run a job in that tenant instead.",
    ),
    (
        False,
        (),
        Verdict(
            False,
            "update",
            None,
            None,
            "UPDATE on 'x' is not allowed while reading schema 't2'",
            Rule("read_only"),
        ),
        "Job 'billing.sync' (tenant t1) was denied an update statement: UPDATE on 'x' is not allowed while reading schema 't2'. No grant allows this; run a job in that tenant instead.",
    ),
]


def _watch(system: bool, declared: tuple[str, ...]) -> Watch:
    return Watch(
        job="billing.sync",
        schema="t1",
        origin=None,
        declared_grants=frozenset(Grant(g) for g in declared),
        system=system,
        atomic=False,
    )


@pytest.mark.parametrize(("system", "declared", "verdict", "message"), CASES)
def test_a_statements_refusal_reads_as_before(
    system: bool, declared: tuple[str, ...], verdict: Verdict, message: str
) -> None:
    assert denials.statement_message(_watch(system, declared), verdict) == message


def test_a_refusal_is_recorded_on_the_run_and_raised_with_its_kind_and_grant() -> None:
    watch = _watch(False, ())
    verdict = CASES[0][2]
    with pytest.raises(DatabaseAccessDenied) as raised:
        denials.refuse_statement(watch, verdict, enforce=True)
    assert watch.violations == [str(raised.value)] == [CASES[0][3]]
    assert (raised.value.job_name, raised.value.kind, raised.value.grant) == (
        "billing.sync",
        "insert",
        Grant.GLOBAL_WRITES,
    )
    assert isinstance(raised.value.grant, Grant)  # kept as Grant, not a string


def test_log_mode_only_logs(caplog: pytest.LogCaptureFixture) -> None:
    watch = _watch(False, ())
    denials.refuse_statement(watch, CASES[0][2], enforce=False)
    denials.refuse(watch, denials.Route.SHELL, "no shell", enforce=False)
    assert watch.violations == []
    assert [r.getMessage() for r in caplog.records] == [
        "DB guard (log mode) would deny: " + CASES[0][3],
        "DB guard (log mode) would deny: Job 'billing.sync' (tenant t1): no shell",
    ]


def test_a_route_refusal_names_the_route_as_its_kind() -> None:
    watch = _watch(False, ())
    with pytest.raises(DatabaseAccessDenied) as raised:
        denials.refuse_not_a_tenant_alias(watch, "other", enforce=True)
    assert raised.value.kind == "database" and raised.value.grant is None
    assert str(raised.value) == (
        "Job 'billing.sync' (tenant t1): alias 'other' is not a django-tenants connection, so "
        "the guard cannot tell which schema its unqualified names mean. Tenant runs use "
        "django-tenants aliases only."
    )
    assert watch.violations == [str(raised.value)]
