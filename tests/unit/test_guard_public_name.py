"""The DB guard with django-tenants' ``PUBLIC_SCHEMA_NAME`` other than ``public``: no database.

The shared schema is whatever the project calls it, and SQL names it by that name; the guard
read it as the literal ``public`` (a reviewer's pass): a tenant run holding
``cross_tenant_reads`` of the public tenant read the operators' copies (``shared`` was "another
tenant"), a shared table named ``shared.<table>`` needed a cross-tenant grant, and a system run
(schema ``shared``) was refused kumiko's own tables. Every rule that names the public schema is
asked here under ``shared``, and ``public`` is then just another schema.
"""

from __future__ import annotations

import pytest

from kumiko_jobs.guard import Grant, Policy, classify

SHARED = frozenset({"catalog_plan"})


def _policy(*grants: Grant, schema: str = "t1", reading: str | None = None) -> Policy:
    return Policy(
        schema=schema,
        shared_tables=SHARED,
        active_grants=frozenset(grants),
        readable_schema=reading,
        operator_tables=frozenset({"django_session"}),
        operator_records=frozenset({"authtoken_token"}),
        kumiko_tables=frozenset({"kumiko_jobs_jobrun"}),
        extra_functions=frozenset({"unaccent"}),
        public_schema="shared",
    )


def _judge(statement: str, policy: Policy) -> tuple[bool, str | None]:
    verdict = classify(statement, policy, parameters=False)
    return verdict.allowed, verdict.rule


@pytest.mark.parametrize(
    ("statement", "expected"),
    [
        ("SELECT * FROM shared.django_session", (False, "operators")),
        ("DELETE FROM shared.django_session", (False, "operators")),
        ("SELECT * FROM django_session", (True, None)),  # the tenant's own copy
        ("SELECT * FROM shared.catalog_plan", (True, None)),  # a shared table, by its schema
        ("INSERT INTO shared.catalog_plan VALUES (1)", (False, "shared_write")),
        ("SELECT shared.unaccent('x')", (True, None)),  # a listed function, qualified
        ("SELECT * FROM public.catalog_plan", (False, "cross_schema")),  # just a schema now
        ("SET search_path = t1, shared", (True, None)),  # what django-tenants sends
    ],
)
def test_a_tenant_run_under_another_public_name(
    statement: str, expected: tuple[bool, str | None]
) -> None:
    assert _judge(statement, _policy()) == expected


def test_the_shared_insert_goes_through_with_global_writes() -> None:
    policy = _policy(Grant.GLOBAL_WRITES)
    assert _judge("INSERT INTO shared.catalog_plan VALUES (1)", policy) == (True, None)


def test_cross_tenant_reads_of_the_public_tenant_reads_nothing() -> None:
    reading = _policy(Grant.CROSS_TENANT_READS, reading="shared")
    for statement in ("SELECT * FROM django_session", "SELECT * FROM catalog_plan"):
        assert _judge(statement, reading) == (False, "operators"), statement


def test_a_system_run_is_the_operators_code() -> None:
    system = _policy(schema="shared")
    for statement in (
        "SELECT * FROM kumiko_jobs_jobrun",
        "SELECT * FROM authtoken_token",
        "SELECT * FROM shared.django_session",
    ):
        assert _judge(statement, system) == (True, None), statement
