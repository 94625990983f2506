"""Unit tests of issue 22's rule for kumiko's own tables: no database.

kumiko's tables (``kumiko_jobs_jobrun``, ``_jobattempt``, ``_jobfailure``, ...) hold every
tenant's arguments, results, errors and tracebacks. A tenant run's SQL never names them, in any
schema, read, written, locked or copied, whatever its grants (rule ``protected``); a system run
(schema public) is the operators' code and is judged as before. kumiko's own reads inside a run
go through ``history.run_reads`` with the guard stepped aside (tests/integration).

Django compiles real ORM statements (no connection); the tables come from the app registry.
"""

from __future__ import annotations

from typing import Any

import pytest

from kumiko_jobs.core.db import TABLES_WITHOUT_MODELS
from kumiko_jobs.guard import Grant, Policy, classify
from kumiko_jobs.guard.parse import statement_shape
from kumiko_jobs.guard.tables import (
    kumiko_tables,
    operator_tables,
    protected_tables,
    shared_tables,
)
from kumiko_jobs.models import JobAttempt, JobFailure, JobRun

EVERY_GRANT_SET: list[tuple[Grant, ...]] = [
    (),
    (Grant.GLOBAL_WRITES,),
    (Grant.UNSAFE_RAW,),
    tuple(frozenset(Grant) - {Grant.CROSS_TENANT_READS}),
]


def _policy(*grants: Grant, schema: str = "t1", reading: str | None = None) -> Policy:
    return Policy(
        schema=schema,
        shared_tables=shared_tables(),
        active_grants=frozenset(grants),
        readable_schema=reading,
        protected_tables=protected_tables(),
        operator_tables=operator_tables(),
        kumiko_tables=kumiko_tables(),
    )


def _orm(queryset: Any) -> str:
    text, _params = queryset.query.get_compiler("default").as_sql()
    return str(text)


def test_kumiko_tables_are_the_apps_own_and_protected() -> None:
    own = kumiko_tables()
    for table in ("kumiko_jobs_jobrun", "kumiko_jobs_jobattempt", "kumiko_jobs_jobfailure"):
        assert table in own
    assert {"kumiko_jobs_escapehatchuse", "kumiko_jobs_admissionlock"} <= own
    assert "kumiko_jobs_jobattempt_id_seq" in own  # an AutoField's sequence
    assert "kumiko_jobs_jobrun_run_id_seq" not in own  # a UUID key has none
    # The dashboard's rollups have no model (raw tables of migrations 0024 and 0025): named
    # in core/db.py, so the guard knows them as kumiko's all the same.
    assert set(TABLES_WITHOUT_MODELS) <= own and set(TABLES_WITHOUT_MODELS) <= protected_tables()
    tables = {name for name in own if not name.endswith("_id_seq")}
    assert tables <= protected_tables()
    assert tables - set(TABLES_WITHOUT_MODELS) <= shared_tables()
    assert "customers_client" not in own  # the tenant registry stays readable


OWN_TABLE_STATEMENTS = [
    "SELECT * FROM kumiko_jobs_jobrun",
    "SELECT payload FROM kumiko_jobs_jobrun WHERE schema_name = 't2'",
    "SELECT * FROM public.kumiko_jobs_jobrun",
    'SELECT "payload" FROM "public"."kumiko_jobs_jobrun"',
    "TABLE kumiko_jobs_jobattempt",
    "SELECT traceback FROM kumiko_jobs_jobattempt",
    "SELECT subject FROM kumiko_jobs_jobfailure",
    "SELECT * FROM kumiko_jobs_rejectedmessage",
    "SELECT * FROM kumiko_jobs_escapehatchuse",
    "SELECT * FROM kumiko_jobs_jobrun FOR UPDATE",
    "SELECT * FROM kumiko_jobs_jobrun FOR SHARE SKIP LOCKED",
    "SELECT g.label FROM guardapp_secret g JOIN kumiko_jobs_jobrun r ON true",
    "SELECT (SELECT max(error_message) FROM kumiko_jobs_jobrun)",
    "WITH r AS (SELECT payload FROM kumiko_jobs_jobrun) SELECT * FROM r",
    "SELECT 1 WHERE EXISTS (SELECT 1 FROM kumiko_jobs_jobrun WHERE payload::text LIKE '%x%')",
    "INSERT INTO guardapp_finding (key, value) SELECT 'k', payload::text FROM kumiko_jobs_jobrun",
    "SELECT * FROM t2.kumiko_jobs_jobrun",  # no such table; refused before any lookup
    "UPDATE kumiko_jobs_jobrun SET status = 'succeeded'",
    "DELETE FROM kumiko_jobs_jobfailure",
    "EXPLAIN ANALYZE SELECT * FROM kumiko_jobs_jobrun",
    # utility statements (unverifiable): refused before unsafe_raw is considered
    "COPY kumiko_jobs_jobrun TO STDOUT",
    "COPY (SELECT payload FROM kumiko_jobs_jobrun) TO STDOUT",
    "LOCK TABLE kumiko_jobs_jobrun",
    "TRUNCATE kumiko_jobs_jobattempt",
    "CREATE TEMP VIEW v AS SELECT * FROM kumiko_jobs_jobrun",
    "SELECT 1; SELECT payload FROM kumiko_jobs_jobrun",
    # kumiko's id sequences: setval() would make its next inserts collide
    "SELECT setval('kumiko_jobs_jobattempt_id_seq', 1)",
    "SELECT nextval('public.kumiko_jobs_jobfailure_id_seq'::regclass)",
    "SELECT currval('kumiko_jobs_escapehatchuse_id_seq')",
    "SELECT query_to_xml('x', true, false, '') FROM kumiko_jobs_jobrun",
    # a name in SQL text a function or DO runs (these need unsafe_raw): refused like a name
    "SELECT query_to_xml('SELECT payload FROM kumiko_jobs_jobrun', true, false, '')",
    "SELECT query_to_xml('select * from PUBLIC.KUMIKO_JOBS_JOBATTEMPT', true, false, '')",
    "SELECT dblink_exec('dbname=x', 'DELETE FROM kumiko_jobs_jobrun')",
    "DO $$BEGIN PERFORM payload FROM kumiko_jobs_jobrun; END$$",
    "DO $x$ BEGIN EXECUTE 'SELECT 1 FROM public.kumiko_jobs_jobfailure'; END $x$",
    "SELECT 1; SELECT query_to_xml('TABLE kumiko_jobs_jobrun', true, false, '')",
    # the dashboard's rollups (no model): every tenant's worker time, every job's failures
    "SELECT schema_name, worker_ms FROM kumiko_jobs_workertimerollup",
    "SELECT failures FROM public.kumiko_jobs_runrollup",
    "UPDATE kumiko_jobs_runrollup SET failed = 0",
    "DELETE FROM kumiko_jobs_runrollupmark",
    "INSERT INTO public.kumiko_jobs_workertimerollup VALUES (now(), 'q', 't2', 0, 0)",
    "SELECT query_to_xml('TABLE kumiko_jobs_workertimerollup', true, false, '')",
]


@pytest.mark.parametrize("statement", OWN_TABLE_STATEMENTS)
def test_kumiko_tables_are_refused_to_tenant_runs_whatever_the_grants(statement: str) -> None:
    for grants in EVERY_GRANT_SET:
        verdict = classify(statement, _policy(*grants), parameters=False)
        assert not verdict.allowed, (grants, verdict)
        assert verdict.rule == "protected", verdict
        assert verdict.grant_needed is None
        assert "kumiko's own table" in verdict.reason, verdict.reason


def test_kumiko_tables_are_refused_inside_cross_tenant_reads() -> None:
    reading = _policy(Grant.CROSS_TENANT_READS, reading="t2")
    for statement in ("SELECT payload FROM kumiko_jobs_jobrun", "TABLE public.kumiko_jobs_jobrun"):
        verdict = classify(statement, reading, parameters=False)
        assert not verdict.allowed and verdict.rule == "protected", verdict


@pytest.mark.parametrize(
    "queryset",
    [
        lambda: JobRun.objects.filter(schema_name="t2").values_list("payload"),
        lambda: JobRun.objects.filter(pk="00000000-0000-0000-0000-000000000000"),
        lambda: JobAttempt.objects.values_list("traceback"),
        lambda: JobAttempt.objects.select_related("run"),
        lambda: JobFailure.objects.all(),
    ],
)
def test_orm_reads_of_kumiko_models_are_refused(queryset: Any) -> None:
    text = _orm(queryset())
    assert statement_shape(text, True).plain  # the hot path: the rule must hold there too
    # select_for_update() appends this (compiling it here would need a connection).
    for statement in (text, text + " FOR UPDATE", text + " FOR NO KEY UPDATE OF T1"):
        for grants in EVERY_GRANT_SET:
            verdict = classify(statement, _policy(*grants), parameters=True)
            assert not verdict.allowed and verdict.rule == "protected", (grants, verdict)


@pytest.mark.parametrize(
    "statement",
    [
        "SELECT * FROM guardapp_secret",
        "SELECT name FROM public.catalog_plan",
        "SELECT schema_name FROM public.customers_client",
        "SELECT 'kumiko_jobs_jobrun'",  # a string is no relation
        "SELECT 1 AS kumiko_jobs_jobrun",
    ],
)
def test_other_tables_are_not_caught(statement: str) -> None:
    assert classify(statement, _policy(), parameters=False).allowed


@pytest.mark.parametrize("statement", OWN_TABLE_STATEMENTS[:6])
def test_a_system_run_reads_kumiko_tables(statement: str) -> None:
    """A system run's schema is public: the operators' code (its writes stay protected)."""
    verdict = classify(statement, _policy(schema="public"), parameters=False)
    assert verdict.allowed, verdict.reason


@pytest.mark.parametrize(
    "statement",
    [
        "SELECT query_to_xml('SELECT payload FROM kumiko_' || 'jobs_jobrun', true, false, '')",
        "DO $$BEGIN EXECUTE format('SELECT 1 FROM %I', 'kumiko_' || 'jobs_jobrun'); END$$",
    ],
)
def test_documented_gap_a_name_built_at_run_time_under_unsafe_raw(statement: str) -> None:
    """docs/guard.md, "Not covered": a name built at run time by SQL that unsafe_raw lets run is
    not seen (with DB_ROLES, PostgreSQL refuses it). Fails the day it is closed."""
    assert classify(statement, _policy(Grant.UNSAFE_RAW), parameters=False).allowed
    assert not classify(statement, _policy(), parameters=False).allowed  # needs the grant


def test_literal_words_are_kept_only_for_what_needs_unsafe_raw() -> None:
    """The ORM's and everyday SQL's literals cost nothing: only statements that need
    unsafe_raw keep the words of their strings."""
    assert statement_shape("SELECT 'kumiko_jobs_jobrun' AS x", False).literal_words == frozenset()
    shape = statement_shape("SELECT query_to_xml('TABLE kumiko_jobs_jobrun', true, false, '')")
    assert "kumiko_jobs_jobrun" in shape.literal_words


def test_a_policy_without_kumiko_tables_is_the_old_rule() -> None:
    """Calibration: the same statement passes a policy that does not list kumiko's tables (the
    rule before this change), so the refusals above are this rule's."""
    old = Policy(schema="t1", shared_tables=shared_tables(), protected_tables=protected_tables())
    assert classify("SELECT payload FROM kumiko_jobs_jobrun", old, parameters=False).allowed
