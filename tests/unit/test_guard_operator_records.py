"""The operators' records shared by every tenant (guard.tables.operator_record_tables): no
database.

With ``django.contrib.sessions`` and ``django.contrib.admin`` in SHARED_APPS only (django-tenants'
shared-users layout), ``django_session`` and ``django_admin_log`` are one table for every
tenant's users and the operators: a session key read by a tenant run is the operators' login
taken (an attacker's pass did it through the ORM, both DB_ROLES modes), and the log holds every
tenant's admin actions. A tenant run's SQL never names them, in any schema, whatever its grants
(rule ``operators``); the shared user table stays readable; a system run is judged as before.
The tables in the unit settings' layout (sessions in both app lists) are the operators' copies
instead: tests/shared_auth runs the layout itself, with real runs.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from django.conf import settings
from django.contrib.admin.models import LogEntry
from django.contrib.auth import get_user_model
from django.contrib.sessions.models import Session
from django.test import override_settings

from kumiko_jobs.guard import Grant, Policy, classify
from kumiko_jobs.guard.parse import statement_shape
from kumiko_jobs.guard.tables import (
    _is_operator_record,
    kumiko_tables,
    operator_record_tables,
    protected_tables,
)

RECORDS = frozenset({"django_session", "django_admin_log", "django_admin_log_id_seq"})
SHARED = RECORDS | {"auth_user", "customers_client"}
EVERY_GRANT_SET: list[tuple[Grant, ...]] = [
    (),
    (Grant.GLOBAL_WRITES,),
    (Grant.UNSAFE_RAW,),
    tuple(frozenset(Grant) - {Grant.CROSS_TENANT_READS}),
]


def _policy(*grants: Grant, schema: str = "t1", reading: str | None = None) -> Policy:
    return Policy(
        schema=schema,
        shared_tables=SHARED,
        active_grants=frozenset(grants),
        readable_schema=reading,
        protected_tables=protected_tables(),
        kumiko_tables=kumiko_tables(),
        operator_records=RECORDS,
    )


def _orm(queryset: Any) -> str:
    text, _params = queryset.query.get_compiler("default").as_sql()
    return str(text)


def test_sessions_and_the_admin_log_are_operator_records_and_users_are_not() -> None:
    assert _is_operator_record(Session) and _is_operator_record(LogEntry)
    assert not _is_operator_record(get_user_model())


def _model(app_label: str, model_name: str) -> type:
    return type("Model", (), {"_meta": SimpleNamespace(app_label=app_label, model_name=model_name)})


def test_the_common_api_credentials_are_operator_records() -> None:
    for credential in [
        ("authtoken", "token"),  # Django REST framework
        ("knox", "authtoken"),
        ("oauth2_provider", "accesstoken"),
        ("oauth2_provider", "application"),
    ]:
        assert _is_operator_record(_model(*credential)), credential
    assert not _is_operator_record(_model("billing", "token"))


def test_a_project_names_more_of_them_in_operator_record_tables() -> None:
    base = dict(settings.KUMIKO_JOBS)
    try:
        with override_settings(KUMIKO_JOBS={**base, "OPERATOR_RECORD_TABLES": ["Api_Keys"]}):
            operator_record_tables.cache_clear()
            assert "Api_Keys" in operator_record_tables()
    finally:
        operator_record_tables.cache_clear()
    assert "Api_Keys" not in operator_record_tables()


RECORD_STATEMENTS = [
    "SELECT session_key, session_data FROM django_session",
    'SELECT "django_session"."session_key" FROM "django_session"',
    "SELECT * FROM public.django_session",
    "SELECT 1 FROM auth_user u JOIN django_session s ON true",
    "SELECT object_repr FROM django_admin_log",
    "INSERT INTO django_session VALUES ('k', 'd', now())",
    "UPDATE django_session SET expire_date = now()",
    "DELETE FROM public.django_admin_log",
    "COPY django_session TO STDOUT",
    "SELECT setval('django_admin_log_id_seq', 1)",
    "SELECT query_to_xml('SELECT session_key FROM django_session', true, false, '')",
]


@pytest.mark.parametrize("statement", RECORD_STATEMENTS)
def test_operator_records_are_refused_to_tenant_runs_whatever_the_grants(statement: str) -> None:
    for grants in EVERY_GRANT_SET:
        verdict = classify(statement, _policy(*grants), parameters=False)
        assert not verdict.allowed, (grants, verdict)
        assert verdict.rule == "operators", verdict
        assert "the operators' records of every user" in verdict.reason, verdict.reason
    reading = _policy(Grant.CROSS_TENANT_READS, reading="t2")
    assert not classify(statement, reading, parameters=False).allowed


@pytest.mark.parametrize(
    "queryset",
    [
        lambda: Session.objects.values_list("session_key", "session_data"),
        lambda: Session.objects.filter(session_key="k"),
        lambda: LogEntry.objects.values_list("object_repr"),
    ],
)
def test_orm_reads_of_operator_records_are_refused_on_the_hot_path(queryset: Any) -> None:
    text = _orm(queryset())
    assert statement_shape(text, True).plain  # the hot path: the rule must hold there too
    for grants in EVERY_GRANT_SET:
        verdict = classify(text, _policy(*grants), parameters=True)
        assert not verdict.allowed and verdict.rule == "operators", (grants, verdict)


def test_the_shared_user_table_stays_readable_and_a_system_run_reads_the_records() -> None:
    users = _orm(get_user_model().objects.values_list("username", "email"))
    assert classify(users, _policy(), parameters=True).allowed
    for statement in RECORD_STATEMENTS[:5]:
        assert classify(statement, _policy(schema="public"), parameters=False).allowed
