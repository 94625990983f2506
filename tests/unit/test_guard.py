"""Unit tests for the pure SQL guard: no Django, no database."""

from __future__ import annotations

import pytest

from kumiko_jobs.guard import Grant, Policy, Verdict, classify, statement_shape

SHARED = frozenset({"kumiko_jobs_jobrun", "example_shared_plan"})
BASE = Policy(schema="t1", shared_tables=SHARED)

UNSAFE = Grant.UNSAFE_RAW
WRITES = Grant.GLOBAL_WRITES
READS = Grant.CROSS_TENANT_READS


def policy(*grants: Grant, readable: str | None = None) -> Policy:
    return Policy(
        schema="t1", shared_tables=SHARED, active_grants=frozenset(grants), readable_schema=readable
    )


def assert_allowed(verdict: Verdict, grant_used: Grant | None = None) -> None:
    assert verdict.allowed, verdict.reason
    assert verdict.grant_needed is None
    assert verdict.grant_used == grant_used


def assert_denied(verdict: Verdict, grant_needed: Grant | None, rule: str) -> None:
    assert not verdict.allowed, f"unexpectedly allowed: {verdict}"
    assert verdict.grant_needed == grant_needed
    assert verdict.grant_used is None
    assert verdict.rule == rule
    assert verdict.reason


# --- allowed without any grant ---------------------------------------------------------------

ALLOWED_PLAIN = [
    # Django ORM shapes
    (
        'SELECT "app_model"."id", "app_model"."name" FROM "app_model" '
        'WHERE "app_model"."id" = %s LIMIT 21',
        "select",
    ),
    (
        'INSERT INTO "app_model" ("name", "tenant_id") VALUES (%s, %s) RETURNING "app_model"."id"',
        "insert",
    ),
    (
        'UPDATE "app_model" SET "name" = %s WHERE "app_model"."id" IN '
        '(SELECT U0."id" FROM "app_model" U0 WHERE U0."tenant_id" = %s)',
        "update",
    ),
    ('DELETE FROM "app_model" WHERE "app_model"."id" IN (%s, %s)', "delete"),
    (
        'SELECT "a"."id" FROM "app_model" "a" '
        'INNER JOIN "other" ON ("a"."other_id" = "other"."id") '
        'LEFT OUTER JOIN "third" T3 ON ("other"."id" = T3."other_id")',
        "select",
    ),
    ('SELECT COUNT(*) AS "__count" FROM "app_model" WHERE "app_model"."x" > %s', "select"),
    ('SELECT (1) AS "a" FROM "app_model" WHERE "app_model"."id" = %s LIMIT 1', "select"),
    (
        'SELECT COUNT(*) FROM (SELECT "app_model"."id" AS "col1" FROM "app_model" '
        "GROUP BY 1) subquery",
        "select",
    ),
    ('SELECT COALESCE(SUM("app_model"."n"), %s) AS "total" FROM "app_model"', "select"),
    ('SELECT EXTRACT(YEAR FROM "app_model"."created" AT TIME ZONE %s) FROM "app_model"', "select"),
    ('SELECT substring("app_model"."name" from 1 for 3), TRIM(BOTH \' \' FROM x) FROM t', "select"),
    ('SELECT * FROM "app_model" WHERE "app_model"."a" IS DISTINCT FROM "app_model"."b"', "select"),
    ('SELECT * FROM "app_model" WHERE "app_model"."id" = %s FOR UPDATE', "select"),
    (
        'INSERT INTO "app_model" ("id", "name") VALUES (%s, %s) ON CONFLICT("id") '
        'DO UPDATE SET "name" = EXCLUDED."name"',
        "insert",
    ),
    (
        'INSERT INTO "app_model" ("name") SELECT * FROM UNNEST((%s)::varchar[]) '
        'RETURNING "app_model"."id"',
        "insert",
    ),
    (
        "WITH RECURSIVE r(n) AS (VALUES (1) UNION ALL SELECT n + 1 FROM r WHERE n < 5) "
        "SELECT n FROM r",
        "select",
    ),
    ("VALUES (1, 'a'), (2, 'b')", "values"),
    ("TABLE app_model", "select"),
    ("SELECT %(name)s::text, $1::int, 5 % 2", "select"),
    # shared tables may be read, unqualified or public-qualified
    ('SELECT "kumiko_jobs_jobrun"."id" FROM "kumiko_jobs_jobrun"', "select"),
    ("SELECT * FROM public.example_shared_plan p JOIN app_model m ON m.plan_id = p.id", "select"),
    ("SELECT * FROM public.auth_user", "select"),
    # the run's own schema, qualified in any spelling that folds to it
    ("SELECT * FROM t1.app_model", "select"),
    ('UPDATE "t1"."app_model" SET "name" = %s', "update"),
    ("DELETE FROM T1.app_model", "delete"),
    # system catalogs are readable (introspection)
    ("SELECT c.relname FROM pg_catalog.pg_class c WHERE c.relkind = 'r'", "select"),
    ("SELECT table_name FROM information_schema.tables WHERE table_schema = %s", "select"),
    # transaction control
    ("BEGIN", "transaction"),
    ("START TRANSACTION ISOLATION LEVEL SERIALIZABLE", "transaction"),
    ("COMMIT", "transaction"),
    ("ROLLBACK", "transaction"),
    ('SAVEPOINT "s123_x1"', "transaction"),
    ('RELEASE SAVEPOINT "s123_x1"', "transaction"),
    ('ROLLBACK TO SAVEPOINT "s123_x1"', "transaction"),
    ("SET CONSTRAINTS ALL IMMEDIATE", "transaction"),
    ("SHOW search_path", "show"),
    ("EXPLAIN (FORMAT TEXT) SELECT * FROM app_model", "select"),
    ("TRUNCATE app_model", "truncate"),
]


@pytest.mark.parametrize(("sql", "kind"), ALLOWED_PLAIN)
def test_allowed_without_grant(sql: str, kind: str) -> None:
    verdict = classify(sql, BASE)
    assert_allowed(verdict)
    assert verdict.kind == kind


# --- denied without a grant, allowed (or not) with one --------------------------------------

# (sql, kind, grant needed, rule); granting exactly that grant must then allow it.
NEEDS_GRANT = [
    # shared writes
    ('INSERT INTO "example_shared_plan" ("name") VALUES (%s)', "insert", WRITES, "shared_write"),
    (
        'UPDATE "kumiko_jobs_jobrun" SET "state" = %s WHERE "id" = %s',
        "update",
        WRITES,
        "shared_write",
    ),
    ("DELETE FROM example_shared_plan", "delete", WRITES, "shared_write"),
    ("DELETE FROM EXAMPLE_SHARED_PLAN", "delete", WRITES, "shared_write"),
    ("TRUNCATE TABLE app_model, example_shared_plan", "truncate", WRITES, "shared_write"),
    ("INSERT INTO public.anything (a) VALUES (1)", "insert", WRITES, "shared_write"),
    ('UPDATE "public"."auth_user" SET "last_login" = %s', "update", WRITES, "shared_write"),
    (
        "MERGE INTO example_shared_plan p USING src s ON p.id = s.id WHEN MATCHED THEN DELETE",
        "merge",
        WRITES,
        "shared_write",
    ),
    (
        "WITH gone AS (DELETE FROM example_shared_plan RETURNING id) SELECT count(*) FROM gone",
        "delete",
        WRITES,
        "shared_write",
    ),
    ("WITH x AS (SELECT 1) UPDATE public.p SET a = 1", "update", WRITES, "shared_write"),
    ("EXPLAIN ANALYZE DELETE FROM public.x", "delete", WRITES, "shared_write"),
    # other schemas
    ("SELECT * FROM t2.app_model", "select", READS, "cross_schema"),
    ('SELECT * FROM "t2"."app_model"', "select", READS, "cross_schema"),
    ("SELECT * FROM a, t2.secret", "select", READS, "cross_schema"),
    ("SELECT * FROM a JOIN (b CROSS JOIN t2.c) ON true", "select", READS, "cross_schema"),
    ("SELECT x FROM a WHERE id IN (SELECT id FROM t2.b)", "select", READS, "cross_schema"),
    ("SELECT t2.app_model.name FROM a", "select", READS, "cross_schema"),
    ("SELECT t2.f(1)", "select", READS, "cross_schema"),
    ("SELECT 1 UNION TABLE t2.x", "select", READS, "cross_schema"),
    ("SELECT * FROM pg_toast.pg_toast_1234", "select", READS, "cross_schema"),
    # unverifiable
    ("SET search_path = t2, public", "set_search_path", UNSAFE, "unverifiable"),
    ("SET search_path = public", "set_search_path", UNSAFE, "unverifiable"),
    ("SET search_path = %s", "set_search_path", UNSAFE, "unverifiable"),
    ("SET LOCAL search_path = t1, public", "set", UNSAFE, "unverifiable"),
    ("SET ROLE admin", "set", UNSAFE, "unverifiable"),
    ("SET SESSION AUTHORIZATION admin", "set", UNSAFE, "unverifiable"),
    ("SET statement_timeout = 0", "set", UNSAFE, "unverifiable"),
    ("RESET ALL", "reset", UNSAFE, "unverifiable"),
    ("SELECT set_config('search_path', 't2', false)", "call_function", UNSAFE, "unverifiable"),
    ("SELECT pg_catalog.set_config(%s, %s, true)", "call_function", UNSAFE, "unverifiable"),
    ("SELECT pg_read_file('/etc/passwd')", "call_function", UNSAFE, "unverifiable"),
    (
        "SELECT * FROM dblink('dbname=x', 'select 1') AS t(a int)",
        "call_function",
        UNSAFE,
        "unverifiable",
    ),
    ("SELECT lo_import('/tmp/x')", "call_function", UNSAFE, "unverifiable"),
    (
        "SELECT query_to_xml('select * from t2.x', true, false, '')",
        "call_function",
        UNSAFE,
        "unverifiable",
    ),
    ("CREATE TABLE x (id int)", "ddl", UNSAFE, "unverifiable"),
    ("ALTER TABLE app_model ADD COLUMN x int", "ddl", UNSAFE, "unverifiable"),
    ("DROP TABLE app_model", "ddl", UNSAFE, "unverifiable"),
    ("GRANT SELECT ON app_model TO someone", "ddl", UNSAFE, "unverifiable"),
    ("COMMENT ON TABLE app_model IS 'x'", "ddl", UNSAFE, "unverifiable"),
    ("SELECT * INTO new_table FROM app_model", "ddl", UNSAFE, "unverifiable"),
    ("VACUUM app_model", "maintenance", UNSAFE, "unverifiable"),
    ("COPY app_model TO STDOUT", "copy", UNSAFE, "unverifiable"),
    ("DO $$ BEGIN PERFORM 1; END $$", "do", UNSAFE, "unverifiable"),
    ("CALL my_proc()", "call", UNSAFE, "unverifiable"),
    ("PREPARE q AS SELECT 1", "prepared_statement", UNSAFE, "unverifiable"),
    ("EXECUTE q", "prepared_statement", UNSAFE, "unverifiable"),
    ("NOTIFY jobs, 'x'", "notify", UNSAFE, "unverifiable"),
    ("LOCK TABLE app_model", "lock", UNSAFE, "unverifiable"),
    ("COMMIT PREPARED 'x'", "transaction", UNSAFE, "unverifiable"),
    ("SELECT 1; SELECT 2", "multi_statement", UNSAFE, "unverifiable"),
    ("SELECT 'unterminated", "unparseable", UNSAFE, "unverifiable"),
    ('SELECT "unterminated', "unparseable", UNSAFE, "unverifiable"),
    ("SELECT 1 /* /* nested, only one closed */", "unparseable", UNSAFE, "unverifiable"),
    ("SELECT $x$ never closed", "unparseable", UNSAFE, "unverifiable"),
    ("SELECT (1", "unparseable", UNSAFE, "unverifiable"),
    ("SELECT ARRAY[1)", "unparseable", UNSAFE, "unverifiable"),
    ('SELECT * FROM U&"t\\0032".x', "unparseable", UNSAFE, "unverifiable"),
]


@pytest.mark.parametrize(("sql", "kind", "grant", "rule"), NEEDS_GRANT)
def test_denied_without_grant(sql: str, kind: str, grant: Grant, rule: str) -> None:
    verdict = classify(sql, BASE)
    assert_denied(verdict, grant, rule)
    assert verdict.kind == kind


@pytest.mark.parametrize(("sql", "kind", "grant", "rule"), NEEDS_GRANT)
def test_allowed_with_the_named_grant(sql: str, kind: str, grant: Grant, rule: str) -> None:
    readable = "t2" if grant is READS else None
    if "pg_toast" in sql:
        readable = "pg_toast"
    verdict = classify(sql, policy(grant, readable=readable))
    assert_allowed(verdict, grant)
    assert grant in verdict.grants_used


@pytest.mark.parametrize(
    ("sql", "wrong_grants"),
    [
        ("DELETE FROM example_shared_plan", (UNSAFE, READS)),
        ("SELECT * FROM t2.x", (UNSAFE, WRITES)),
        ("DROP TABLE x", (WRITES, READS)),
        ("SELECT set_config('a', 'b', false)", (WRITES, READS)),
    ],
)
def test_other_grants_do_not_substitute(sql: str, wrong_grants: tuple[Grant, ...]) -> None:
    assert not classify(sql, policy(*wrong_grants)).allowed


# --- hard denials: no grant helps ---------------------------------------------------------------

ALL = (UNSAFE, WRITES, READS, Grant.SYSTEM_IDENTITY)


@pytest.mark.parametrize(
    "sql",
    [
        "INSERT INTO t2.app_model (a) VALUES (1)",
        'UPDATE "T2"."x" SET a = 1',
        "DELETE FROM pg_catalog.pg_class",
        "TRUNCATE t2.x",
        "INSERT INTO app_model (a) SELECT a FROM t2.app_model",
        "UPDATE app_model SET a = (SELECT a FROM t2.b LIMIT 1)",
        "SELECT * FROM t2.x FOR UPDATE",
    ],
)
def test_cross_schema_writes_are_never_allowed(sql: str) -> None:
    assert_denied(classify(sql, policy(*ALL)), None, "cross_schema")
    assert_denied(classify(sql, BASE), None, "cross_schema")


def test_cross_schema_read_needs_the_matching_readable_schema() -> None:
    verdict = classify("SELECT * FROM t3.x", policy(READS, readable="t2"))
    assert_denied(verdict, READS, "cross_schema")
    assert "t3" in verdict.reason


@pytest.mark.parametrize(
    ("sql", "allowed"),
    [
        ('SELECT "app_model"."id" FROM "app_model"', True),
        ("SELECT * FROM t2.app_model", True),
        ('INSERT INTO "app_model" ("a") VALUES (%s)', False),
        ("UPDATE app_model SET a = 1", False),
        ("DELETE FROM app_model", False),
        ("SELECT * FROM app_model FOR UPDATE", False),
        ("SELECT 1; SELECT 2", False),
        ("CREATE TABLE x (a int)", False),
    ],
)
def test_reading_another_tenant_is_read_only(sql: str, allowed: bool) -> None:
    verdict = classify(sql, policy(READS, UNSAFE, readable="t2"))
    if allowed:
        assert_allowed(verdict, READS)
    else:
        assert_denied(verdict, None, "read_only")


def test_readable_schema_requires_the_grant() -> None:
    with pytest.raises(ValueError, match="cross_tenant_reads"):
        Policy(schema="t1", shared_tables=SHARED, readable_schema="t2")


# --- search_path ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sql", "readable", "allowed"),
    [
        ('SET search_path = "t1","public"', None, True),
        ("SET search_path = 't1', 'public'", None, True),
        ("SET search_path TO t1, public", None, True),
        ("SET SEARCH_PATH TO T1", None, True),
        ('SET search_path = "t1"', None, True),
        ('SET search_path = "T1","public"', None, False),  # quoted keeps case: schema "T1"
        ("SET search_path = 'T1'", None, False),
        ("SET search_path = public, t1", None, False),
        ("SET search_path = t1, public, t2", None, False),
        ("SET search_path = 't1, public'", None, False),  # one element named "t1, public"
        ("SET search_path = t1,", None, False),
        ("SET search_path TO DEFAULT", None, False),
        ('SET search_path = "t2","public"', None, False),
        ('SET search_path = "t2","public"', "t2", True),
        ('SET search_path = "t1","public"', "t2", True),
        ('SET search_path = "t3","public"', "t2", False),
    ],
)
def test_search_path(sql: str, readable: str | None, allowed: bool) -> None:
    grants = (READS,) if readable else ()
    verdict = classify(sql, policy(*grants, readable=readable))
    assert verdict.allowed is allowed, verdict.reason
    if not allowed:
        assert verdict.rule in ("unverifiable", "read_only")


def test_wrong_search_path_is_allowed_under_unsafe_raw() -> None:
    assert_allowed(classify("SET search_path = t2", policy(UNSAFE)), UNSAFE)


# --- tokeniser traps --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT 'DROP TABLE t2.x'",
        "SELECT 'it''s; DELETE FROM public.x'",
        "SELECT E'\\'; DELETE FROM public.x; --'",
        "SELECT $$; DELETE FROM public.x$$",
        "SELECT $body$ t2.x $inner$ $body$",
        "SELECT 1 /* ; DELETE FROM public.x */",
        "SELECT 1 /* outer /* inner; t2.x */ still comment; DROP TABLE x */",
        "SELECT 1 -- ; DELETE FROM public.x",
        "SELECT 1;",
        "SELECT 1 ; -- trailing\n /* and */ ",
        'SELECT "t2.x" FROM "a.b"',
        'SELECT "we said ""hi""; DROP" FROM app_model',
        "SELECT x::text, y::numeric(10, 2) FROM app_model",
        "SELECT '100%%' LIKE %s",
        "SELECT B'101', X'ff', N'x', U&'d\\0061t'",
        'select * from "app_model" where "app_model"."x" ~ \'^t2\\.\'',
    ],
)
def test_literals_and_comments_hide_nothing(sql: str) -> None:
    assert_allowed(classify(sql, BASE))


@pytest.mark.parametrize(
    ("sql", "grant", "rule"),
    [
        # Content after the literal is real SQL again.
        ("SELECT 'a' FROM t2.x", READS, "cross_schema"),
        ("SELECT E'\\\\' FROM t2.x", READS, "cross_schema"),
        ("SELECT $$x$$ FROM t2.x", READS, "cross_schema"),
        ("SELECT 1 /* a /* b */ c */ FROM t2.x", READS, "cross_schema"),
        ("SELECT 1 -- comment\nFROM t2.x", READS, "cross_schema"),
        ('SELECT 1 FROM "t2"."x"', READS, "cross_schema"),
        ('SELECT 1 FROM "T2".x', READS, "cross_schema"),  # schema "T2", not t1/public
        ('DELETE FROM "Example_Shared_Plan"', None, ""),  # quoted: a different, tenant table
        ("SELECT 1 /* */; DELETE FROM app_model", UNSAFE, "unverifiable"),
        ("SELECT 1;;SELECT 2", UNSAFE, "unverifiable"),
    ],
)
def test_tokens_after_literals_still_count(sql: str, grant: Grant | None, rule: str) -> None:
    verdict = classify(sql, BASE)
    if rule:
        assert_denied(verdict, grant, rule)
    else:
        assert_allowed(verdict)


def test_quoted_identifier_with_dot_is_one_name() -> None:
    shape = statement_shape('SELECT * FROM "t2.x" JOIN "public.y" ON true')
    assert shape.schemas == frozenset()
    shape = statement_shape('DELETE FROM "public.example_shared_plan"')
    assert shape.writes[0].schema is None
    assert shape.writes[0].table == "public.example_shared_plan"


def test_unquoted_folds_and_quoted_keeps_case() -> None:
    assert statement_shape("SELECT * FROM T2.X").schemas == {"t2"}
    assert statement_shape('SELECT * FROM "T2".x').schemas == {"T2"}
    assert statement_shape('INSERT INTO "T"."Tab" DEFAULT VALUES').writes[0].table == "Tab"


# --- multiple statements under unsafe_raw ------------------------------------------------------


def test_multi_statement_parts_still_need_their_own_grants() -> None:
    sql = "SELECT 1; DELETE FROM public.example_shared_plan"
    verdict = classify(sql, policy(UNSAFE))
    assert_denied(verdict, WRITES, "shared_write")
    assert verdict.reason.startswith("statement 2:")
    verdict = classify(sql, policy(UNSAFE, WRITES))
    assert_allowed(verdict, UNSAFE)
    assert verdict.grants_used == (UNSAFE, WRITES)


def test_unsafe_raw_does_not_cover_a_shared_write_next_to_set_config() -> None:
    sql = "WITH c AS (SELECT set_config('a', 'b', true)) DELETE FROM example_shared_plan"
    assert_denied(classify(sql, policy(UNSAFE)), WRITES, "shared_write")
    assert_denied(classify(sql, policy(WRITES)), UNSAFE, "unverifiable")
    verdict = classify(sql, policy(UNSAFE, WRITES))
    assert verdict.allowed
    assert set(verdict.grants_used) == {UNSAFE, WRITES}


# --- personal data ---------------------------------------------------------------------------

PERSONAL = {"app_person": frozenset({"email", "name"}), "example_shared_plan": frozenset({"owner"})}


def personal_policy(*grants: Grant, deny: bool = True) -> Policy:
    return Policy(
        schema="t1",
        shared_tables=SHARED,
        active_grants=frozenset(grants),
        personal_data_columns=PERSONAL,
        deny_personal_data_writes=deny,
    )


@pytest.mark.parametrize(
    ("sql", "allowed"),
    [
        ('INSERT INTO "app_person" ("email", "created") VALUES (%s, %s)', False),
        ('INSERT INTO "app_person" ("created") VALUES (%s)', True),
        ("INSERT INTO app_person VALUES (1, 'x')", False),  # no column list: every column
        ('INSERT INTO "app_person" DEFAULT VALUES', True),
        ('UPDATE "app_person" SET "name" = %s WHERE "app_person"."id" = %s', False),
        ('UPDATE "app_person" SET "visits" = "app_person"."visits" + 1', True),
        ("UPDATE app_person SET (visits, email) = (1, 'x')", False),
        ("UPDATE app_person SET visits = (SELECT max(email) FROM app_person)", True),
        (
            'INSERT INTO "app_person" ("id") VALUES (%s) ON CONFLICT ("id") '
            'DO UPDATE SET "email" = EXCLUDED."email"',
            False,
        ),
        ("WITH u AS (UPDATE app_person SET name = 'x' RETURNING id) SELECT * FROM u", False),
        (
            "MERGE INTO app_person p USING s ON p.id = s.id "
            "WHEN MATCHED THEN UPDATE SET visits = 1",
            False,
        ),
        ('DELETE FROM "app_person"', True),
        ('INSERT INTO "app_other" ("email") VALUES (%s)', True),
        ('INSERT INTO "APP_PERSON" ("email") VALUES (%s)', True),  # quoted: another table
    ],
)
def test_personal_data_writes(sql: str, allowed: bool) -> None:
    verdict = classify(sql, personal_policy())
    if allowed:
        assert_allowed(verdict)
    else:
        assert_denied(verdict, None, "public_intake_required")
    assert classify(sql, personal_policy(deny=False)).allowed


def test_personal_data_rule_applies_to_shared_tables_even_with_global_writes() -> None:
    sql = 'UPDATE "example_shared_plan" SET "owner" = %s'
    assert_denied(classify(sql, personal_policy(WRITES)), None, "public_intake_required")
    assert_allowed(classify(sql, personal_policy(WRITES, deny=False)), WRITES)


# --- shape details ----------------------------------------------------------------------------


def test_written_columns_are_parsed() -> None:
    insert = statement_shape('INSERT INTO "t" ("a", "B", c) VALUES (%s, %s, %s)')
    assert insert.writes[0].columns == frozenset({"a", "B", "c"})
    update = statement_shape('UPDATE "t" SET "a" = %s, "b" = f(x, y), c[1] = 2 WHERE d = %s')
    assert update.writes[0].columns == frozenset({"a", "b", "c"})


def test_shape_is_cached_per_sql_text() -> None:
    sql = 'SELECT "app_model"."id" FROM "app_model" WHERE "app_model"."id" = %s'
    assert statement_shape(sql) is statement_shape("".join([sql[:7], sql[7:]]))


def test_select_verdicts_report_the_statement_kind() -> None:
    assert classify("WITH x AS (SELECT 1) SELECT * FROM x", BASE).kind == "select"
    assert classify("EXPLAIN ANALYZE UPDATE app_model SET a = 1", BASE).kind == "update"
    assert classify("", BASE).allowed


@pytest.mark.parametrize(
    "sql",
    [
        'UPDATE "kumiko_jobs_jobrun" SET "status" = %s WHERE "kumiko_jobs_jobrun"."run_id" = %s',
        'DELETE FROM "customers_client" WHERE "customers_client"."id" = %s',
        "INSERT INTO public.kumiko_jobs_jobfailure (schema_name) VALUES (%s)",
    ],
)
def test_protected_tables_are_never_written_even_with_global_writes(sql: str) -> None:
    protected = frozenset({"kumiko_jobs_jobrun", "kumiko_jobs_jobfailure", "customers_client"})
    policy = Policy(
        schema="t1",
        shared_tables=protected | {"catalog_plan"},
        active_grants=frozenset({Grant.GLOBAL_WRITES, Grant.UNSAFE_RAW}),
        protected_tables=protected,
    )
    verdict = classify(sql, policy)
    assert not verdict.allowed
    assert (verdict.rule, verdict.grant_needed) == ("protected", None)
    # An ordinary shared table stays writable with the grant.
    assert classify('UPDATE "catalog_plan" SET "name" = %s', policy).allowed
