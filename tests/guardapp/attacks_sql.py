"""Attack strategies that are SQL text (classes 0-5 of issue 11), as data.

``{mark}`` is replaced by the strategy's mark. Writes touch only what was planted for the mark
(``WHERE label = '{mark}'``), reads leak the canary of t2. The text is what a job passes to
``cursor.execute`` (with ``params`` when given), one statement after another on one cursor.
"""

from __future__ import annotations

from .attacks_base import ACTIVITY_CANARY, NOTIFY_CHANNEL, VICTIM_APP, Class, Effect, Strategy

L, W, C = Effect.LEAK, Effect.T2_ROW, Effect.SHARED_ROW
T2 = "t2.guardapp_secret"
ALL = f"(SELECT string_agg(value, chr(44)) FROM {T2})"  # every t2 value, canary included
ONE = f"(SELECT value FROM {T2} WHERE label = 'canary')"
DEL = f"DELETE FROM {T2} WHERE label = '{{mark}}'"
UPD = f"UPDATE {T2} SET value = 'pwned' WHERE label = '{{mark}}'"
SHARED_UPD = "UPDATE catalog_plan SET monthly_price = 0 WHERE name = '{mark}'"
OWN_INSERT = "INSERT INTO guardapp_finding (key, value) SELECT '{mark}', "
RECURSIVE = "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < 2) "
JOINED = f"({T2} s CROSS JOIN (SELECT 1) o)"  # a parenthesised join that starts with t2
# Rendered into '%s' by psycopg as ''<payload>'': the payload itself lands outside any quotes.
CONCAT = "|| (SELECT string_agg(value, chr(44)) FROM t2.guardapp_secret) ||"

_ROWS: list[tuple[str, Class, Effect, str | tuple[str, ...], dict[str, object]]] = [
    # --- 1. the lexer: where the hand lexer and PostgreSQL's disagree -----------------------
    ("cr_ends_comment_union", Class.LEXER, L, f"SELECT 'x' --\rUNION SELECT value FROM {T2}", {}),
    ("cr_ends_comment_multi", Class.LEXER, W, f"SELECT 1 --\r; {DEL}", {}),
    ("cr_comment_whole_statement", Class.LEXER, W, f"--\r{UPD}", {}),
    ("cr_comment_shared_write", Class.LEXER, C, f"SELECT 1 --\r; {SHARED_UPD}", {}),
    ("cr_comment_in_subquery", Class.LEXER, L, f"SELECT (SELECT 'x' --\r|| {ONE}\n)", {}),
    (
        "cr_comment_hides_cte",
        Class.LEXER,
        W,
        f"WITH d AS (SELECT 1 --\r) , e AS ({DEL} RETURNING 1\n) SELECT 1",
        {},
    ),
    ("cr_comment_in_join", Class.LEXER, L, f"SELECT b.value FROM guardapp_secret a --\r, {T2} b", {}),
    ("euro_continues_ident_leak", Class.LEXER, L, f"SELECT 1 AS a€$$, {ALL} AS b€$$", {}),
    ("euro_continues_ident_multi", Class.LEXER, W, f"SELECT 1 AS a€$$; {DEL}; SELECT 1 AS b€$$", {}),
    ("nbsp_continues_ident", Class.LEXER, L, f"SELECT 1 AS a\xa0$$, {ALL} AS b\xa0$$", {}),
    ("nel_continues_ident", Class.LEXER, W, f"SELECT 1 AS a\x85$$; {UPD}; SELECT 1 AS b\x85$$", {}),
    ("emoji_continues_ident", Class.LEXER, W, f"SELECT 1 AS 🙈$$; {DEL}; SELECT 1 AS 🙉$$", {}),
    ("arabic_digit_ident", Class.LEXER, L, f"SELECT 1 AS ٣$$, {ALL} AS ٤$$", {}),
    (
        "ideographic_space_ident",
        Class.LEXER,
        C,
        f"SELECT 1 AS a\u3000$$; {SHARED_UPD}; SELECT 1 AS b\u3000$$",
        {},
    ),
    (
        "percent_paren_s_no_params",
        Class.LEXER,
        L,
        f"SELECT 10 %(length('x)s')) AS n, {ALL} AS leak --'",
        {},
    ),
    (
        "percent_paren_s_multi",
        Class.LEXER,
        W,
        f"SELECT 10 %(length('x)s')); {DEL} --'",
        {},
    ),
    ("percent_paren_t_no_params", Class.LEXER, L, f"SELECT 10 %(length('x)t')) AS n, {ALL} --'", {}),
    ("percent_paren_b_no_params", Class.LEXER, W, f"SELECT 10 %(length('x)b')); {UPD} --'", {}),
    ("comment_split_name", Class.LEXER, L, "SELECT value FROM/**/t2/* . */./**/guardapp_secret", {}),
    (
        "comment_hides_real_from",
        Class.LEXER,
        L,
        f"SELECT value /* FROM guardapp_secret */ FROM -- FROM guardapp_secret\n {T2}",
        {},
    ),
    ("string_fakes_comment", Class.LEXER, L, f"SELECT 'it''s /* no', value FROM {T2} -- */", {}),
    ("dollar_quote_hides_quote", Class.LEXER, L, f"SELECT $x$ ' $x$ AS q, value FROM {T2}", {}),
    ("tagged_dollar_nested", Class.LEXER, L, f"SELECT $a$ $b$ $a$, value FROM {T2}", {}),
    ("string_fakes_statement_end", Class.LEXER, L, f"SELECT ';--', value FROM {T2}", {}),
    ("nested_comment", Class.LEXER, L, f"SELECT /* /* */ FROM x */ value FROM {T2}", {}),
    ("escape_string_quote", Class.LEXER, L, f"SELECT E'\\' FROM guardapp_secret', value FROM {T2}", {}),
    ("unicode_escape_identifier", Class.LEXER, L, 'SELECT value FROM U&"t\\0032".guardapp_secret', {}),
    (
        "unicode_uescape_identifier",
        Class.LEXER,
        L,
        "SELECT value FROM U&\"t!0032\" UESCAPE '!'.guardapp_secret",
        {},
    ),
    ("formfeed_separates", Class.LEXER, L, f"SELECT value\fFROM\f{T2}", {}),
    ("tab_vertical_layout", Class.LEXER, L, f"SELECT\tvalue\tFROM\t{T2}", {}),
    ("multi_statement_after_comment", Class.LEXER, W, f"SELECT 1 /* ; */; {DEL}", {}),
    ("multi_statement", Class.LEXER, W, f"SELECT 1; {DEL}", {}),
    # --- 2. grammar the scanner does not follow --------------------------------------------
    (
        "search_then_update",
        Class.GRAMMAR,
        W,
        f"{RECURSIVE}SEARCH DEPTH FIRST BY n SET ord {UPD}",
        {},
    ),
    (
        "search_breadth_then_shared_delete",
        Class.GRAMMAR,
        C,
        RECURSIVE + "SEARCH BREADTH FIRST BY n SET ord DELETE FROM catalog_plan WHERE name = '{mark}'",
        {},
    ),
    ("cycle_then_update", Class.GRAMMAR, W, f"{RECURSIVE}CYCLE n SET is_cycle USING path {UPD}", {}),
    ("cycle_then_shared_update", Class.GRAMMAR, C, f"{RECURSIVE}CYCLE n SET c USING p {SHARED_UPD}", {}),
    ("search_then_select", Class.GRAMMAR, L, f"{RECURSIVE}SEARCH DEPTH FIRST BY n SET o SELECT {ALL}", {}),
    ("from_only_parenthesised", Class.GRAMMAR, L, f"SELECT value FROM ONLY ({T2})", {}),
    ("from_only_paren_into_own", Class.GRAMMAR, L, f"{OWN_INSERT}value FROM ONLY ({T2})", {}),
    ("parenthesised_join_first", Class.GRAMMAR, L, f"SELECT s.value FROM {JOINED}", {}),
    ("parenthesised_join_after_comma", Class.GRAMMAR, L, f"SELECT s.value FROM guardapp_secret a, {JOINED}", {}),
    ("parenthesised_join_into_own", Class.GRAMMAR, L, f"{OWN_INSERT}s.value FROM {JOINED}", {}),
    (
        "parenthesised_join_merge",
        Class.GRAMMAR,
        L,
        f"MERGE INTO guardapp_finding f USING {JOINED} ON false "
        "WHEN NOT MATCHED THEN INSERT (key, value) VALUES ('{mark}', s.value)",
        {},
    ),
    ("keyword_alias_set", Class.GRAMMAR, L, f"SELECT x.value FROM guardapp_secret set, {T2} x", {}),
    (
        "keyword_alias_set_into_own",
        Class.GRAMMAR,
        L,
        f"{OWN_INSERT}x.value FROM guardapp_secret set, {T2} x",
        {},
    ),
    ("quoted_is_distinct_from", Class.GRAMMAR, L, f'SELECT y, "is" distinct FROM {T2} AS s("is", x, y)', {}),
    ("quoted_not_distinct_from", Class.GRAMMAR, L, f'SELECT y, "not" distinct FROM {T2} AS s("not", x, y)', {}),
    ("table_command", Class.GRAMMAR, L, f"TABLE {T2}", {}),
    ("table_in_union", Class.GRAMMAR, L, f"SELECT id, label, value FROM guardapp_secret UNION TABLE {T2}", {}),
    ("values_subquery", Class.GRAMMAR, L, f"VALUES ({ALL})", {}),
    ("lateral_subquery", Class.GRAMMAR, L, f"SELECT l.v FROM guardapp_secret a, LATERAL (SELECT value AS v FROM {T2}) l", {}),
    ("rows_from_function", Class.GRAMMAR, L, "SELECT * FROM ROWS FROM (t2.gx_leak())", {}),
    (
        "xmltable_passing",
        Class.GRAMMAR,
        L,
        f"SELECT x.v FROM XMLTABLE('/r' PASSING xmlelement(name r, {ALL}) COLUMNS v text PATH '.') x",
        {},
    ),
    ("window_clause", Class.GRAMMAR, L, f"SELECT value, row_number() OVER w FROM {T2} WINDOW w AS (ORDER BY id)", {}),
    ("grouping_sets", Class.GRAMMAR, L, f"SELECT value, count(*) FROM {T2} GROUP BY GROUPING SETS ((value), ())", {}),
    ("recursive_cte_read", Class.GRAMMAR, L, f"WITH RECURSIVE r AS (SELECT value FROM {T2}) SELECT * FROM r", {}),
    ("json_agg_row", Class.GRAMMAR, L, f"SELECT json_agg(s) FROM {T2} s", {}),
    ("exists_subquery", Class.GRAMMAR, L, f"SELECT {ALL} WHERE EXISTS (SELECT 1 FROM {T2})", {}),
    ("in_subquery_into_own", Class.GRAMMAR, L, f"{OWN_INSERT}value FROM {T2} WHERE id IN (SELECT id FROM {T2})", {}),
    ("array_subquery", Class.GRAMMAR, L, f"SELECT ARRAY(SELECT value FROM {T2})", {}),
    ("case_subquery", Class.GRAMMAR, L, f"SELECT CASE WHEN true THEN {ALL} END", {}),
    ("error_text_cast", Class.GRAMMAR, L, f"SELECT CAST({ONE} AS int)", {}),
    ("error_text_in_order_by", Class.GRAMMAR, L, f"SELECT 1 ORDER BY {ONE}::int", {}),
    ("returning_subquery", Class.GRAMMAR, L, "INSERT INTO guardapp_finding (key, value) VALUES ('{mark}', 'x') RETURNING " + ALL, {}),
    ("insert_values_subquery", Class.GRAMMAR, L, "INSERT INTO guardapp_finding (key, value) VALUES ('{mark}', " + ALL + ")", {}),
    (
        "on_conflict_subquery",
        Class.GRAMMAR,
        L,
        "INSERT INTO guardapp_finding (key, value) VALUES ('{mark}', " + ALL + ") "
        "ON CONFLICT (id) DO UPDATE SET value = excluded.value",
        {},
    ),
    ("intersect_except", Class.GRAMMAR, L, f"(SELECT value FROM {T2} EXCEPT SELECT 'x') INTERSECT SELECT value FROM {T2}", {}),
    ("operator_syntax_call", Class.GRAMMAR, L, "SELECT 1 OPERATOR(t2.###) 1", {}),
    # --- 0. plain references to the other schema, every spelling ------------------------------
    ("qualified_select", Class.SPELLINGS, L, f"SELECT value FROM {T2}", {}),
    ("quoted_qualified_select", Class.SPELLINGS, L, 'SELECT value FROM "t2"."guardapp_secret"', {}),
    ("mixed_case_unquoted", Class.SPELLINGS, L, "SELECT value FROM T2.GuardApp_Secret", {}),
    ("spaces_around_dot", Class.SPELLINGS, L, "SELECT value FROM t2 . guardapp_secret", {}),
    ("parenthesised_select", Class.SPELLINGS, L, f"(SELECT value FROM {T2})", {}),
    ("join_other_schema", Class.SPELLINGS, L, f"SELECT b.value FROM guardapp_secret a JOIN {T2} b ON a.label <> b.label", {}),
    ("comma_join_other_schema", Class.SPELLINGS, L, f"SELECT b.value FROM guardapp_secret a, ONLY {T2} b", {}),
    ("union_other_schema", Class.SPELLINGS, L, f"SELECT label, value FROM guardapp_secret UNION SELECT label, value FROM {T2}", {}),
    ("column_three_parts", Class.SPELLINGS, L, f"SELECT t2.guardapp_secret.value FROM {T2}", {}),
    ("function_in_other_schema", Class.SPELLINGS, L, "SELECT t2.gx_leak()", {}),
    ("quoted_function_other_schema", Class.SPELLINGS, L, 'SELECT "t2"."gx_leak"()', {}),
    ("row_type_of_other_schema", Class.SPELLINGS, L, f"SELECT s::text FROM {T2} s", {}),
    ("tablesample", Class.SPELLINGS, L, f"SELECT value FROM {T2} TABLESAMPLE BERNOULLI (100)", {}),
    ("explain_analyze_select", Class.SPELLINGS, L, f"EXPLAIN (ANALYZE, VERBOSE) SELECT CAST({ONE} AS int)", {}),
    # --- 0. writes into the other tenant and into shared tables --------------------------------
    ("qualified_update", Class.WRITES, W, UPD, {}),
    ("qualified_delete", Class.WRITES, W, 'DELETE FROM "t2"."guardapp_secret" WHERE label = \'{mark}\'', {}),
    ("qualified_insert", Class.WRITES, W, "INSERT INTO t2.guardapp_secret (label, value) VALUES ('{mark}', 'planted')", {}),
    (
        "merge_into_other",
        Class.WRITES,
        W,
        "MERGE INTO t2.guardapp_secret s USING (SELECT 1) m ON s.label = '{mark}' "
        "WHEN MATCHED THEN UPDATE SET value = 'pwned'",
        {},
    ),
    ("update_only_other", Class.WRITES, W, "UPDATE ONLY t2.guardapp_secret SET value = 'x' WHERE label = '{mark}'", {}),
    ("update_aliased_other", Class.WRITES, W, "UPDATE t2.guardapp_secret AS s SET value = 'x' WHERE s.label = '{mark}'", {}),
    ("cte_delete_other", Class.WRITES, W, f"WITH gone AS ({DEL} RETURNING id) SELECT count(*) FROM gone", {}),
    ("cte_update_other_chained", Class.WRITES, W, f"WITH a AS ({UPD} RETURNING 1), b AS (SELECT * FROM a) SELECT * FROM b", {}),
    ("explain_analyze_delete", Class.WRITES, W, f"EXPLAIN ANALYZE {DEL}", {}),
    ("explain_options_update", Class.WRITES, W, f"EXPLAIN (ANALYZE true, FORMAT JSON) {UPD}", {}),
    ("insert_on_conflict_other", Class.WRITES, W, "INSERT INTO t2.guardapp_secret (id, label, value) SELECT id, label, 'pwned' FROM t2.guardapp_secret WHERE label = '{mark}' ON CONFLICT (id) DO UPDATE SET value = 'pwned'", {}),
    ("cte_update_shared", Class.WRITES, C, f"WITH x AS ({SHARED_UPD} RETURNING id) SELECT * FROM x", {}),
    ("qualified_public_update", Class.WRITES, C, "UPDATE public.catalog_plan SET monthly_price = 0 WHERE name = '{mark}'", {}),
    ("mixed_case_shared_delete", Class.WRITES, C, "DELETE FROM Catalog_Plan WHERE name = '{mark}'", {}),
    ("quoted_shared_update", Class.WRITES, C, 'UPDATE "catalog_plan" SET monthly_price = 0 WHERE name = \'{mark}\'', {}),
    ("shared_insert", Class.WRITES, C, "INSERT INTO catalog_plan (name, monthly_price) VALUES ('{mark}-new', 0)", {}),
    ("shared_merge", Class.WRITES, C, "MERGE INTO catalog_plan p USING (SELECT 1) x ON p.name = '{mark}' WHEN MATCHED THEN DELETE", {}),
    # --- 0. statements that cannot be verified ---------------------------------------------------
    ("truncate_other", Class.UNVERIFIABLE, Effect.T2_TABLE, "TRUNCATE t2.{mark}_tab", {}),
    ("create_table_other", Class.UNVERIFIABLE, Effect.T2_TABLE, "CREATE TABLE t2.{mark}_new (id int)", {}),
    ("alter_table_other", Class.UNVERIFIABLE, Effect.T2_TABLE, "ALTER TABLE t2.{mark}_tab ADD COLUMN evil int", {}),
    ("drop_table_other", Class.UNVERIFIABLE, Effect.T2_TABLE, "DROP TABLE t2.{mark}_tab", {}),
    ("select_into_other", Class.UNVERIFIABLE, Effect.T2_TABLE, "SELECT 1 AS n INTO t2.{mark}_new", {}),
    ("create_table_as_other", Class.UNVERIFIABLE, Effect.T2_TABLE, "CREATE TABLE t2.{mark}_new AS SELECT 1 AS n", {}),
    ("comment_on_other", Class.UNVERIFIABLE, Effect.CATALOG, "COMMENT ON TABLE t2.{mark}_tab IS '{mark}'", {}),
    ("do_block", Class.UNVERIFIABLE, W, "DO $$ BEGIN " + DEL + "; END $$", {}),
    ("do_block_tagged", Class.UNVERIFIABLE, W, "DO $body$ BEGIN EXECUTE 'UPDATE t2.guardapp_secret SET value = ''x'' WHERE label = ''{mark}'''; END $body$", {}),
    ("prepare_then_execute", Class.UNVERIFIABLE, W, (f"PREPARE {{mark}}p AS {DEL}", "EXECUTE {mark}p"), {}),
    ("lock_then_delete", Class.UNVERIFIABLE, W, "BEGIN; LOCK TABLE t2.guardapp_secret IN SHARE MODE; " + DEL + "; COMMIT", {}),
    # --- 3. names PostgreSQL resolves in pg_catalog first ---------------------------------------
    ("pg_stats_values", Class.CATALOG, L, "SELECT most_common_vals::text, histogram_bounds::text FROM pg_stats WHERE tablename = 'guardapp_secret'", {}),
    ("pg_stats_qualified", Class.CATALOG, L, "SELECT histogram_bounds::text FROM pg_catalog.pg_stats WHERE schemaname = 't2'", {}),
    ("pg_statistic_raw", Class.CATALOG, L, "SELECT stavalues1::text, stavalues2::text FROM pg_statistic", {}),
    ("pg_stat_activity_query", Class.CATALOG, L, "SELECT string_agg(query, ' ') FROM pg_stat_activity", {}),
    ("pg_stat_activity_qualified", Class.CATALOG, L, "SELECT query FROM pg_catalog.pg_stat_activity WHERE query LIKE '%activity%'", {}),
    (
        "pg_description_insert",
        Class.CATALOG,
        Effect.CATALOG,
        "INSERT INTO pg_description (objoid, classoid, objsubid, description) "
        "VALUES ('t2.{mark}_tab'::regclass, 'pg_class'::regclass, 0, '{mark}')",
        {},
    ),
    (
        "pg_settings_search_path_same_cursor",
        Class.CATALOG,
        W,
        ("UPDATE pg_settings SET setting = 't2' WHERE name = 'search_path'", "DELETE FROM guardapp_secret WHERE label = '{mark}'"),
        {"isolated": True},
    ),
    (
        "pg_settings_quoted_then_read",
        Class.CATALOG,
        L,
        ('UPDATE "pg_settings" SET setting = \'t2\' WHERE name = \'search_path\'', "SELECT value FROM guardapp_secret"),
        {"isolated": True},
    ),
    (
        "pg_settings_aliased",
        Class.CATALOG,
        L,
        ("UPDATE pg_settings AS s SET setting = 't2' WHERE s.name = 'search_path'", "TABLE guardapp_secret"),
        {"isolated": True},
    ),
    (
        "pg_settings_update_from",
        Class.CATALOG,
        W,
        ("UPDATE pg_settings SET setting = v FROM (VALUES ('t2')) AS x(v) WHERE name = 'search_path'", "UPDATE guardapp_secret SET value = 'x' WHERE label = '{mark}'"),
        {"isolated": True},
    ),
    (
        "pg_settings_conforming_strings",
        Class.CATALOG,
        L,
        ("UPDATE pg_settings SET setting = 'off' WHERE name = 'standard_conforming_strings'", f"SELECT 'x\\'' , {ALL} AS leak --'"),
        {"isolated": True},
    ),
    # --- 4. functions ----------------------------------------------------------------------------
    ("pg_notify", Class.FUNCTIONS, Effect.NOTIFY, f"SELECT pg_notify('{NOTIFY_CHANNEL}', '{{mark}}')", {}),
    ("pg_notify_qualified_leak", Class.FUNCTIONS, Effect.NOTIFY, f"SELECT pg_catalog.pg_notify('{NOTIFY_CHANNEL}', '{{mark}}' || {ALL})", {}),
    ("notify_statement", Class.FUNCTIONS, Effect.NOTIFY, f"NOTIFY {NOTIFY_CHANNEL}, '{{mark}}'", {}),
    ("query_to_xml", Class.FUNCTIONS, L, f"SELECT query_to_xml('SELECT value FROM {T2}', true, false, '')", {}),
    ("query_to_xml_and_xmlschema", Class.FUNCTIONS, L, f"SELECT query_to_xml_and_xmlschema('SELECT value FROM {T2}', true, false, '')", {}),
    ("query_to_xml_qualified", Class.FUNCTIONS, L, f"SELECT pg_catalog.query_to_xml('TABLE {T2}', true, false, '')", {}),
    ("table_to_xml", Class.FUNCTIONS, L, f"SELECT table_to_xml('{T2}', true, false, '')", {}),
    ("schema_to_xml", Class.FUNCTIONS, L, "SELECT schema_to_xml('t2', true, false, '')", {}),
    ("database_to_xml", Class.FUNCTIONS, L, "SELECT database_to_xml(true, false, '')", {}),
    ("ts_stat_runs_sql", Class.FUNCTIONS, L, f"SELECT word FROM ts_stat('SELECT to_tsvector(''simple'', value) FROM {T2}')", {}),
    (
        "ts_rewrite_runs_sql",
        Class.FUNCTIONS,
        L,
        "SELECT ts_rewrite('x'::tsquery, 'SELECT ''x''::tsquery, plainto_tsquery(''simple'', value) "
        "FROM t2.guardapp_secret WHERE label = ''canary''')::text",
        {},
    ),
    ("pg_stat_get_activity", Class.FUNCTIONS, L, "SELECT string_agg(query, ' ') FROM pg_stat_get_activity(NULL)", {}),
    ("pg_stat_get_backend_activity", Class.FUNCTIONS, L, "SELECT string_agg(pg_stat_get_backend_activity(b), ' ') FROM pg_stat_get_backend_idset() b", {}),
    ("set_config_search_path", Class.FUNCTIONS, L, ("SELECT set_config('search_path', 't2', false)", "SELECT value FROM guardapp_secret"), {"isolated": True}),
    ("set_config_qualified", Class.FUNCTIONS, W, ("SELECT pg_catalog.set_config('search_path', 't2', false)", "DELETE FROM guardapp_secret WHERE label = '{mark}'"), {"isolated": True}),
    ("set_config_in_from", Class.FUNCTIONS, L, ("SELECT * FROM set_config('search_path', 't2,public', false)", "TABLE guardapp_secret"), {"isolated": True}),
    ("read_relation_file", Class.FUNCTIONS, L, "SELECT encode(pg_read_binary_file(pg_relation_filepath('t2.guardapp_secret')), 'escape')", {}),
    ("lo_from_bytea", Class.FUNCTIONS, Effect.LARGE_OBJECT, "SELECT lo_from_bytea(0, convert_to('{mark}', 'UTF8'))", {}),
    ("lo_create_put", Class.FUNCTIONS, Effect.LARGE_OBJECT, "SELECT lo_put(lo_create(0), 0, convert_to('{mark}', 'UTF8'))", {}),
    ("terminate_backend", Class.FUNCTIONS, Effect.TERMINATED, f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = '{VICTIM_APP}_{{mark}}'", {}),
    ("admission_lock_session", Class.FUNCTIONS, Effect.LOCK, "SELECT pg_advisory_lock(hashtext('kumiko_jobs:guardapp.victim:t2'))", {"isolated": True}),
    ("admission_lock_shared", Class.FUNCTIONS, Effect.LOCK, "SELECT pg_advisory_lock_shared(hashtext('kumiko_jobs:guardapp.victim:t2'))", {"isolated": True}),
    ("admission_lock_try", Class.FUNCTIONS, Effect.LOCK, "SELECT pg_try_advisory_lock(hashtext('kumiko_jobs:' || 'guardapp.victim' || ':t2'))", {"isolated": True}),
    # --- 4. names inside literals ----------------------------------------------------------------
    ("nextval_literal", Class.LITERAL_NAMES, Effect.T2_SEQ, "SELECT nextval('t2.{mark}_seq')", {}),
    ("nextval_quoted_literal", Class.LITERAL_NAMES, Effect.T2_SEQ, "SELECT nextval('\"t2\".\"{mark}_seq\"')", {}),
    ("nextval_regclass_cast", Class.LITERAL_NAMES, Effect.T2_SEQ, "SELECT nextval('t2.{mark}_seq'::regclass)", {}),
    ("nextval_to_regclass", Class.LITERAL_NAMES, Effect.T2_SEQ, "SELECT nextval(to_regclass('t2.{mark}_seq'))", {}),
    ("nextval_built_name", Class.LITERAL_NAMES, Effect.T2_SEQ, "SELECT nextval(concat('t', 2, '.{mark}_seq')::regclass)", {}),
    ("nextval_unicode_literal", Class.LITERAL_NAMES, Effect.T2_SEQ, "SELECT nextval(U&'t\\0032.{mark}_seq')", {}),
    ("nextval_escape_literal", Class.LITERAL_NAMES, Effect.T2_SEQ, "SELECT nextval(E't\\062.{mark}_seq')", {}),
    ("setval_literal", Class.LITERAL_NAMES, Effect.T2_SEQ, "SELECT setval('t2.{mark}_seq', 500)", {}),
    ("nextval_in_insert", Class.LITERAL_NAMES, Effect.T2_SEQ, "INSERT INTO guardapp_finding (key, value) VALUES ('{mark}', nextval('t2.{mark}_seq')::text)", {}),
    ("regclass_in_table_to_xml", Class.LITERAL_NAMES, L, "SELECT table_to_xml(to_regclass('t2.guardapp_secret'), true, false, '')", {}),
    # --- 5. placeholders inside quotes, and the server receiving something else ------------------
    ("quoted_placeholder_union", Class.PLACEHOLDERS, L, "SELECT label FROM guardapp_secret WHERE label = '%s'", {"params": [f" UNION SELECT value FROM {T2} --"]}),
    ("quoted_placeholder_concat", Class.PLACEHOLDERS, L, "SELECT '%s' AS v", {"params": [CONCAT]}),
    ("quoted_named_placeholder", Class.PLACEHOLDERS, L, "SELECT '%(v)s' AS v", {"params": {"v": CONCAT}}),
    ("placeholder_in_block_comment", Class.PLACEHOLDERS, L, "SELECT label FROM guardapp_secret /* %s */", {"params": [f"*/ UNION SELECT value FROM {T2} --"]}),
    ("placeholder_in_line_comment", Class.PLACEHOLDERS, L, "SELECT label FROM guardapp_secret -- %s\n", {"params": [f"\nUNION SELECT value FROM {T2} --"]}),
    ("placeholder_in_quoted_ident", Class.PLACEHOLDERS, L, 'SELECT 1 AS "%s"', {"params": ['" , (SELECT string_agg(value, chr(44)) FROM t2.guardapp_secret) AS "y']}),
    ("quoted_placeholder_multi", Class.PLACEHOLDERS, W, "SELECT '%s'", {"params": ["; DELETE FROM t2.guardapp_secret WHERE label = $q${mark}$q$; SELECT "]}),
    ("quoted_placeholder_into_own", Class.PLACEHOLDERS, L, "INSERT INTO guardapp_finding (key, value) VALUES ('{mark}', '%s')", {"params": [CONCAT]}),
    ("escape_string_placeholder", Class.PLACEHOLDERS, L, "SELECT E'%s' AS v", {"params": [CONCAT]}),
]

SQL_STRATEGIES: list[Strategy] = [
    Strategy(name=name, cls=cls, effect=effect, sql=sql, **extra)  # type: ignore[arg-type]
    for name, cls, effect, sql, extra in _ROWS
]
# The t2 session whose query text pg_stat_activity shows holds this literal.
assert ACTIVITY_CANARY
