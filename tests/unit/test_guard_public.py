"""Unit tests of issue 22's classifier rules: no database.

* the operators' copies in public (tables of apps in SHARED_APPS and TENANT_APPS) are refused
  to tenant runs whatever their grants; the tenant's own copy (unqualified) is not;
* shared, protected and personal-data tables are matched as PostgreSQL spells them (the real
  models' compiled SQL: ``GuardShared_Notice``, ``GuardApp_Contact."Email"``);
* catalog columns and functions that give other tenants' row counts, sizes or code are refused
  whatever the grants, while the catalog reads Django's introspection makes still pass.

Django compiles real ORM statements (no connection); the tables come from the app registry of
the test settings (tests/settings.py: the example project's apps, guardapp, guardapp_shared).
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db.models import sql

from kumiko_jobs.guard import Grant, Policy, classify
from kumiko_jobs.guard.tables import (
    operator_tables,
    personal_data_columns,
    protected_tables,
    shared_tables,
)
from tests.guardapp.models import Contact
from tests.guardapp.shared.models import Notice

ALL_GRANTS = frozenset(Grant) - {Grant.CROSS_TENANT_READS}


def _policy(*grants: Grant, schema: str = "t1", anonymous: bool = False) -> Policy:
    return Policy(
        schema=schema,
        shared_tables=shared_tables(),
        active_grants=frozenset(grants),
        protected_tables=protected_tables(),
        operator_tables=operator_tables(),
        personal_data_columns=personal_data_columns(),
        deny_personal_data_writes=anonymous,
    )


# --- which tables are the operators' --------------------------------------------------------


def test_apps_in_both_lists_are_the_operators_and_not_shared() -> None:
    operators = operator_tables()
    for table in ("django_session", "auth_user", "auth_permission", "django_admin_log"):
        assert table in operators and table not in shared_tables()
    assert "django_content_type" in operators  # contenttypes is a tenant app here too
    assert {"catalog_plan", "GuardShared_Notice", "customers_client"} <= shared_tables()
    assert operators.isdisjoint(shared_tables())
    assert "guardapp_secret" not in operators | shared_tables()  # a tenant-only app


OPERATOR_READS = [
    "SELECT session_key FROM public.django_session",
    'SELECT "session_key" FROM "public"."django_session"',
    "SELECT password FROM PUBLIC.AUTH_USER",
    "TABLE public.django_session",
    "SELECT * FROM ONLY public.auth_user",
    "SELECT 1 FROM guardapp_secret s JOIN public.django_admin_log l ON true",
    "SELECT (SELECT max(session_key) FROM public.django_session)",
    "WITH s AS (SELECT * FROM public.django_session) SELECT * FROM s",
    "SELECT 1 WHERE EXISTS (SELECT 1 FROM public.auth_user WHERE is_superuser)",
    "SELECT label FROM guardapp_secret UNION SELECT username FROM public.auth_user",
    "INSERT INTO guardapp_finding (key, value) SELECT 'k', session_key FROM public.django_session",
    "UPDATE guardapp_finding SET value = u.password FROM public.auth_user u",
    "DELETE FROM guardapp_finding USING public.django_session s WHERE s.session_key = value",
    "SELECT * FROM public.django_content_type",
]
OPERATOR_WRITES = [
    "UPDATE public.django_session SET expire_date = now()",
    "INSERT INTO public.django_session (session_key, session_data, expire_date) "
    "VALUES ('k', 'd', now())",
    "DELETE FROM public.auth_user",
    'UPDATE "public"."auth_user" SET is_superuser = true',
    "TRUNCATE public.django_admin_log",
    "MERGE INTO public.auth_user u USING (SELECT 1 AS id) s ON u.id = s.id "
    "WHEN MATCHED THEN UPDATE SET is_staff = true",
]


@pytest.mark.parametrize("statement", OPERATOR_READS + OPERATOR_WRITES)
def test_the_operators_copies_are_refused_whatever_the_grants(statement: str) -> None:
    for grants in ((), (Grant.GLOBAL_WRITES,), (Grant.UNSAFE_RAW,), tuple(ALL_GRANTS)):
        verdict = classify(statement, _policy(*grants), parameters=False)
        assert not verdict.allowed, (grants, verdict)
        assert verdict.rule == "operators", verdict
        assert verdict.grant_needed is None
        assert "the operators' own table" in verdict.reason


def test_the_operators_copies_are_refused_inside_cross_tenant_reads() -> None:
    reading = Policy(
        schema="t1",
        shared_tables=shared_tables(),
        active_grants=frozenset({Grant.CROSS_TENANT_READS}),
        readable_schema="t2",
        operator_tables=operator_tables(),
    )
    verdict = classify("SELECT session_key FROM public.django_session", reading, parameters=False)
    assert not verdict.allowed and verdict.rule == "operators"


@pytest.mark.parametrize(
    "statement",
    ["SELECT session_key FROM django_session", "SELECT name FROM catalog_plan", "SELECT 1"],
)
def test_cross_tenant_reads_of_the_public_schema_is_refused(statement: str) -> None:
    """Inside ``cross_tenant_reads(<the public tenant>)`` unqualified names are public's: the
    operators' sessions. The public schema is no tenant; its shared tables need no grant."""
    reading = Policy(
        schema="t1",
        shared_tables=shared_tables(),
        active_grants=frozenset({Grant.CROSS_TENANT_READS}),
        readable_schema="public",
        operator_tables=operator_tables(),
    )
    verdict = classify(statement, reading, parameters=False)
    assert not verdict.allowed and verdict.rule == "operators", verdict
    assert classify('SET search_path = "public"', reading, parameters=False).allowed


@pytest.mark.parametrize(
    "statement",
    [
        "SELECT session_key FROM django_session",  # the tenant's own copy
        'SELECT "django_session"."session_key" FROM "django_session"',
        "SELECT id FROM auth_user WHERE username = 'x'",
        "SELECT id, app_label, model FROM django_content_type",
        "SELECT name FROM public.catalog_plan",  # a truly shared table stays readable
        'SELECT text FROM public."GuardShared_Notice"',
        "SELECT schema_name FROM public.customers_client",
        "SELECT NULL::public.django_session",  # the row type names no row
    ],
)
def test_own_copies_and_truly_shared_tables_are_readable(statement: str) -> None:
    verdict = classify(statement, _policy(), parameters=False)
    assert verdict.allowed, verdict.reason


@pytest.mark.parametrize("statement", OPERATOR_READS[:3] + OPERATOR_WRITES[:1])
def test_a_system_run_reads_the_operators_copies(statement: str) -> None:
    """A system run's own schema is public: the operators' code, judged as before."""
    verdict = classify(statement, _policy(Grant.GLOBAL_WRITES, schema="public"), parameters=False)
    assert verdict.rule != "operators", verdict


# --- names with upper-case letters: the real models' SQL --------------------------------------


def _insert_sql(model: Any, **values: Any) -> str:
    query = sql.InsertQuery(model)
    fields = [model._meta.get_field(name) for name in values]
    query.insert_values(fields, [model(**values)])
    ((text, _params),) = query.get_compiler("default").as_sql()
    return str(text)


def _update_sql(model: Any, **values: Any) -> str:
    query = model.objects.filter(pk=1).query.chain(sql.UpdateQuery)
    query.add_update_values(values)
    text, _params = query.get_compiler("default").as_sql()
    return str(text)


def _delete_sql(model: Any) -> str:
    query = model.objects.filter(pk=1).query.chain(sql.DeleteQuery)
    text, _params = query.get_compiler("default").as_sql()
    return str(text)


@pytest.mark.parametrize("compile_", ["insert", "update", "delete"])
def test_an_upper_case_shared_table_needs_global_writes(compile_: str) -> None:
    statement = {
        "insert": lambda: _insert_sql(Notice, text="x"),
        "update": lambda: _update_sql(Notice, text="x"),
        "delete": lambda: _delete_sql(Notice),
    }[compile_]()
    assert '"GuardShared_Notice"' in statement
    verdict = classify(statement, _policy())
    assert not verdict.allowed and verdict.rule == "shared_write", verdict
    assert verdict.grant_needed == Grant.GLOBAL_WRITES
    assert "'GuardShared_Notice'" in verdict.reason
    granted = classify(statement, _policy(Grant.GLOBAL_WRITES))
    assert granted.allowed and granted.grants_used == (Grant.GLOBAL_WRITES,)


def test_an_unquoted_spelling_is_another_table() -> None:
    """PostgreSQL folds an unquoted name: ``GuardShared_Notice`` is ``guardshared_notice``,
    which no model defines (a tenant's table of that name would be its own)."""
    verdict = classify("INSERT INTO GuardShared_Notice (text) VALUES ('x')", _policy())
    assert verdict.allowed


def test_personal_data_columns_keep_their_case() -> None:
    assert personal_data_columns()["GuardApp_Contact"] == frozenset({"Email"})
    statement = _insert_sql(Contact, name="n", email="e@example.com")
    verdict = classify(statement, _policy(anonymous=True))
    assert not verdict.allowed and verdict.rule == "public_intake_required", verdict
    assert classify(_update_sql(Contact, name="n"), _policy(anonymous=True)).allowed
    refused = classify(_update_sql(Contact, email="e"), _policy(anonymous=True))
    assert refused.rule == "public_intake_required"


def test_protected_tables_keep_their_case() -> None:
    assert "kumiko_jobs_jobrun" in protected_tables()
    assert all(name == name.strip() for name in protected_tables())


# --- catalog columns and functions with other tenants' values ---------------------------------

CATALOG_VALUES = [
    # row counts and sizes (pg_class), in every clause and spelling
    "SELECT relname, reltuples FROM pg_class",
    "SELECT relpages FROM pg_catalog.pg_class WHERE relname = 'x'",
    "SELECT relallvisible FROM pg_class",
    'SELECT "reltuples" FROM "pg_class"',
    "SELECT relname FROM pg_class WHERE reltuples > 1000",
    "SELECT relname FROM pg_class ORDER BY relpages DESC",
    "SELECT c.relname FROM pg_class c GROUP BY c.relname, c.reltuples",
    "SELECT * FROM pg_class",
    "SELECT * FROM pg_class c TABLESAMPLE SYSTEM (100)",
    "SELECT * FROM ONLY pg_class",
    "SELECT * FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace",
    "SELECT json_build_array(c.*) FROM pg_class c",
    "SELECT (c).* FROM pg_class c",
    "SELECT x FROM pg_class c, LATERAL (SELECT c.reltuples AS x) s",
    "SELECT relname FROM pg_class ORDER BY row_number() OVER (ORDER BY relpages)",
    "SELECT DISTINCT ON (reltuples) relname FROM pg_class",
    r'SELECT U&"reltuple\0073" FROM pg_class',
    "TABLE pg_class",
    "SELECT 'x', * FROM pg_class",
    "SELECT c.* FROM pg_class c",
    "SELECT pg_class.* FROM pg_class",
    "SELECT c FROM pg_class c",
    "SELECT c::text FROM pg_class c",
    "SELECT to_jsonb(c) FROM pg_class c",
    "SELECT row_to_json(c) ->> 'reltuples' FROM pg_class c",
    "SELECT (c).reltuples FROM pg_class c",
    "SELECT pg_catalog.pg_class FROM pg_catalog.pg_class",
    "SELECT j.* FROM (pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace) AS j",
    "SELECT j FROM (pg_class c JOIN pg_namespace n ON true) AS j",
    "SELECT * FROM pg_class NATURAL JOIN (SELECT 1::real AS reltuples) v",
    "SELECT relname FROM pg_class JOIN (SELECT 1::real AS reltuples) v USING (reltuples)",
    "SELECT t FROM pg_class AS c(o, n, ns, ty, oft, ow, am, fn, ts, p, t)",
    "SELECT x.r FROM (SELECT reltuples AS r FROM pg_class) x",
    "SELECT * FROM (SELECT * FROM pg_class) x",
    "WITH x AS (SELECT c FROM pg_class c) SELECT * FROM x",
    "SELECT (SELECT max(reltuples) FROM pg_class)",
    "UPDATE guardapp_finding SET value = 'x' FROM pg_class c RETURNING *",
    "UPDATE guardapp_finding SET value = c.reltuples::text FROM pg_class c",
    "DELETE FROM guardapp_finding USING pg_class c RETURNING c",
    "INSERT INTO guardapp_finding (key, value) SELECT relname, relpages FROM pg_class",
    "EXPLAIN SELECT reltuples FROM pg_class",
    # code: functions, views, rules, triggers, policies
    "SELECT prosrc FROM pg_proc",
    "SELECT proname, probin FROM pg_proc",
    "SELECT pg_get_expr(proargdefaults, 0) FROM pg_proc",
    "SELECT * FROM pg_proc WHERE proname = 'f'",
    "SELECT p::text FROM pg_proc p",
    "SELECT definition FROM pg_views",
    "SELECT * FROM pg_views",
    "SELECT definition FROM pg_matviews",
    "SELECT definition FROM pg_rules",
    "SELECT pg_get_expr(ev_qual, ev_class) FROM pg_rewrite",
    "SELECT ev_action FROM pg_rewrite",
    "SELECT tgargs FROM pg_trigger",
    "SELECT polqual FROM pg_policy",
    "SELECT qual FROM pg_policies",
    "SELECT routine_definition FROM information_schema.routines",
    "SELECT * FROM information_schema.routines",
    "SELECT view_definition FROM information_schema.views",
    "SELECT r FROM information_schema.views r",
    "SELECT action_statement FROM information_schema.triggers",
    "SELECT * FROM information_schema._pg_foreign_tables",
    # credentials of foreign servers' user mappings and options; parameters' defaults
    "SELECT option_name, option_value FROM information_schema.user_mapping_options",
    "SELECT * FROM information_schema.user_mapping_options",
    "SELECT option_value FROM information_schema.foreign_server_options",
    "SELECT o FROM information_schema.foreign_table_options o",
    "SELECT parameter_default FROM information_schema.parameters",
    # functions
    "SELECT pg_get_viewdef('t2.v'::regclass)",
    "SELECT pg_catalog.pg_get_viewdef(c.oid) FROM pg_class c",
    "SELECT pg_get_functiondef(p.oid) FROM pg_proc p",
    "SELECT pg_get_function_arguments(p.oid) FROM pg_proc p",
    "SELECT pg_get_ruledef(oid) FROM pg_rewrite",
    "SELECT pg_get_triggerdef(oid) FROM pg_trigger",
    "SELECT pg_get_constraintdef(oid) FROM pg_constraint",
    "SELECT pg_relation_size(c.oid) FROM pg_class c",
    "SELECT pg_total_relation_size('guardapp_secret')",
    "SELECT pg_table_size(c.oid), pg_indexes_size(c.oid) FROM pg_class c",
    "SELECT pg_database_size(current_database())",
    "SELECT pg_stat_get_live_tuples(c.oid) FROM pg_class c",
    "SELECT pg_stat_get_numscans(1)",
]


@pytest.mark.parametrize("statement", CATALOG_VALUES)
def test_catalog_values_are_refused_whatever_the_grants(statement: str) -> None:
    for grants in ((), (Grant.UNSAFE_RAW,), tuple(ALL_GRANTS)):
        verdict = classify(statement, _policy(*grants), parameters=False)
        assert not verdict.allowed, (grants, verdict)
        assert verdict.rule == "catalog", verdict
        assert verdict.grant_needed is None


@pytest.mark.parametrize(
    "statement",
    [
        # Django's introspection (connection.introspection, PostgreSQL backend) and friends
        "SELECT c.relname, CASE WHEN c.relispartition THEN 'p' WHEN c.relkind IN ('m', 'v') "
        "THEN 'v' ELSE 't' END, obj_description(c.oid, 'pg_class') FROM pg_catalog.pg_class c "
        "LEFT JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
        "WHERE c.relkind IN ('f', 'm', 'p', 'r', 'v') "
        "AND n.nspname NOT IN ('pg_catalog', 'pg_toast') AND pg_catalog.pg_table_is_visible(c.oid)",
        "SELECT a.attname AS column_name, NOT (a.attnotnull OR (t.typtype = 'd' AND "
        "t.typnotnull)) AS is_nullable, pg_get_expr(ad.adbin, ad.adrelid) AS column_default, "
        "CASE WHEN collname = 'default' THEN NULL ELSE collname END AS collation, "
        "a.attidentity != '' AS is_autofield, col_description(a.attrelid, a.attnum) AS "
        "column_comment FROM pg_attribute a LEFT JOIN pg_attrdef ad ON a.attrelid = ad.adrelid "
        "AND a.attnum = ad.adnum JOIN pg_collation co ON a.attcollation = co.oid JOIN pg_type t "
        "ON a.atttypid = t.oid JOIN pg_class c ON a.attrelid = c.oid JOIN pg_namespace n ON "
        "c.relnamespace = n.oid WHERE c.relkind IN ('f', 'm', 'p', 'r', 'v') AND c.relname = %s "
        "AND n.nspname NOT IN ('pg_catalog', 'pg_toast') AND pg_catalog.pg_table_is_visible(c.oid)",
        "SELECT indexname, array_agg(attname ORDER BY arridx), indisunique, indisprimary, "
        "array_agg(ordering ORDER BY arridx), amname, exprdef, s2.attoptions FROM (SELECT "
        "c2.relname as indexname, idx.*, attr.attname, am.amname, CASE WHEN idx.indexprs IS NOT "
        "NULL THEN pg_get_indexdef(idx.indexrelid) END AS exprdef, CASE am.amname WHEN %s THEN "
        "CASE (option & 1) WHEN 1 THEN 'DESC' ELSE 'ASC' END END as ordering, c2.reloptions as "
        "attoptions FROM (SELECT * FROM pg_index i, unnest(i.indkey, i.indoption) WITH "
        "ORDINALITY koi(key, option, arridx)) idx LEFT JOIN pg_class c ON idx.indrelid = c.oid "
        "LEFT JOIN pg_class c2 ON idx.indexrelid = c2.oid LEFT JOIN pg_am am ON c2.relam = am.oid "
        "LEFT JOIN pg_attribute attr ON attr.attrelid = c.oid AND attr.attnum = idx.key WHERE "
        "c.relname = %s AND pg_catalog.pg_table_is_visible(c.oid)) s2 GROUP BY indexname, "
        "indisunique, indisprimary, amname, exprdef, attoptions",
        "SELECT c.conname, array(SELECT attname FROM unnest(c.conkey) WITH ORDINALITY "
        "cols(colid, arridx) JOIN pg_attribute AS ca ON cols.colid = ca.attnum WHERE "
        "ca.attrelid = c.conrelid ORDER BY cols.arridx), c.contype, (SELECT fkc.relname || '.' || "
        "fka.attname FROM pg_attribute AS fka JOIN pg_class AS fkc ON fka.attrelid = fkc.oid "
        "WHERE fka.attrelid = c.confrelid AND fka.attnum = c.confkey[1]), cl.reloptions FROM "
        "pg_constraint AS c JOIN pg_class AS cl ON c.conrelid = cl.oid WHERE cl.relname = %s AND "
        "pg_catalog.pg_table_is_visible(cl.oid)",
        # definitions every tenant shares, by name
        "SELECT relname, relkind, relnamespace FROM pg_class WHERE relname = %s",
        "SELECT proname, pronargs FROM pg_proc WHERE proname = %s",
        "SELECT schemaname, viewname FROM pg_views",
        "SELECT matviewname, ispopulated FROM pg_matviews",
        "SELECT rulename FROM pg_rules",
        "SELECT * FROM pg_namespace",
        "SELECT * FROM pg_type WHERE typname = %s",
        "SELECT table_name, column_name FROM information_schema.columns WHERE table_name = %s",
        "SELECT routine_name FROM information_schema.routines",
        "SELECT table_name FROM information_schema.views",
        "SELECT * FROM information_schema.tables",
        "SELECT x.relname FROM (SELECT relname FROM pg_class) x",
        "SELECT * FROM (SELECT relname, relkind FROM pg_class) x",
        "SELECT count(*) FROM pg_class",
    ],
)
def test_catalog_definitions_stay_readable(statement: str) -> None:
    verdict = classify(statement, _policy())
    assert verdict.allowed, verdict.reason
