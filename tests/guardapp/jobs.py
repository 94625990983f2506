"""Jobs of the guard suites.

``attack`` is one job that runs one of many ways a tenant job could reach another tenant (t2)
or shared data, chosen by ``case``: each case of the attack suite is a real run through a real
worker. Inside the run, a spy execute wrapper is installed *inside* the guard's (innermost), so
``REACHED`` lists exactly the statements that got past the guard on their way to psycopg. The
worker runs in the test process (``tests.conftest.work``), so the test can read that list.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from decimal import Decimal
from typing import Any

from django.contrib.auth import get_user_model
from django.db import connection, connections, transaction
from django.db.models.expressions import RawSQL
from django_tenants.utils import schema_context
from psycopg import sql

from example_project.catalog.models import Plan
from example_project.customers.models import Client
from kumiko_jobs import DatabaseAccessDenied, EscapeHatch, current_user, job
from kumiko_jobs.models import JobRun
from kumiko_jobs.run.context import JobContext

from .models import Finding, Person, Secret
from .shared.models import Notice

OTHER = "t2"
EXTRA_ALIAS = "guard_other"  # added by the attack suite for the QuerySet.using() cases

# (alias, SQL text) of every statement that passed the guard during the last attack run.
REACHED: list[tuple[str, str]] = []


def _spy(
    execute: Callable[..., Any], sql_: Any, params: Any, many: bool, context: Mapping[str, Any]
) -> Any:
    text = sql_ if isinstance(sql_, str) else repr(sql_)
    REACHED.append((context["connection"].alias, text))
    return execute(sql_, params, many, context)


@contextlib.contextmanager
def _spying() -> Iterator[None]:
    REACHED.clear()
    with contextlib.ExitStack() as stack:
        for conn in connections.all():
            stack.enter_context(conn.execute_wrapper(_spy))
        yield


def _run(statement: Any, params: Any = None) -> None:
    with connection.cursor() as cursor:
        cursor.execute(statement, params)


def _other_client() -> Client:
    return Client.objects.get(schema_name=OTHER)  # a read of a shared table: allowed


# --- the attacks ----------------------------------------------------------------------------


def _set_local_search_path(ctx: JobContext) -> None:
    with transaction.atomic():
        _run("SET LOCAL search_path TO t2")
        list(Secret.objects.all())


def _three_part_name(ctx: JobContext) -> None:
    database = connection.settings_dict["NAME"]
    _run(f'SELECT value FROM "{database}".t2.guardapp_secret')


def _orm_raw(ctx: JobContext) -> None:
    list(Secret.objects.raw('SELECT * FROM "t2"."guardapp_secret"'))


def _orm_extra_select(ctx: JobContext) -> None:
    list(Secret.objects.extra(select={"leak": "SELECT value FROM t2.guardapp_secret LIMIT 1"}))


def _orm_extra_where(ctx: JobContext) -> None:
    list(Secret.objects.extra(where=["label IN (SELECT label FROM t2.guardapp_secret)"]))


def _rawsql_annotation(ctx: JobContext) -> None:
    leak = RawSQL("SELECT value FROM t2.guardapp_secret LIMIT 1", ())
    list(Secret.objects.annotate(leak=leak).values("label", "leak"))


def _rawsql_filter(ctx: JobContext) -> None:
    list(Secret.objects.filter(value__in=RawSQL("SELECT value FROM t2.guardapp_secret", ())))


def _set_schema_then_orm(ctx: JobContext) -> None:
    connection.set_schema(OTHER)  # type: ignore[attr-defined]
    list(Secret.objects.all())  # django-tenants sends SET search_path = "t2","public"


def _set_schema_then_iterator(ctx: JobContext) -> None:
    # A server-side cursor: django-tenants sends its SET search_path on a raw psycopg cursor,
    # which no execute wrapper sees; only the SELECT that follows passes the guard.
    connection.set_schema(OTHER)  # type: ignore[attr-defined]
    list(Secret.objects.iterator())


def _set_tenant_then_orm(ctx: JobContext) -> None:
    connection.set_tenant(_other_client())  # type: ignore[attr-defined]
    Secret.objects.filter(label="t2-secret").update(value="pwned")


def _schema_context_then_orm(ctx: JobContext) -> None:
    with schema_context(OTHER):
        Secret.objects.all().delete()


def _set_schema_to_public_then_write(ctx: JobContext) -> None:
    connection.set_schema_to_public()  # type: ignore[attr-defined]
    Plan.objects.create(name="via-public", monthly_price=Decimal("0.00"))


def _composable_select(ctx: JobContext) -> None:
    query = sql.SQL("SELECT value FROM {}.{}").format(
        sql.Identifier("t2"), sql.Identifier("guardapp_secret")
    )
    _run(query)


def _composable_delete(ctx: JobContext) -> None:
    _run(sql.SQL("DELETE FROM {}").format(sql.Identifier("t2", "guardapp_secret")))


def _executemany_other(ctx: JobContext) -> None:
    with connection.cursor() as cursor:
        cursor.executemany(
            "INSERT INTO t2.guardapp_secret (label, value) VALUES (%s, %s)",
            [("planted", "1"), ("planted", "2")],
        )


def _executemany_shared(ctx: JobContext) -> None:
    with connection.cursor() as cursor:
        cursor.executemany(
            "INSERT INTO catalog_plan (name, monthly_price) VALUES (%s, %s)",
            [("many-1", 1), ("many-2", 2)],
        )


def _bytes_sql(ctx: JobContext) -> None:
    _run(b"SELECT value FROM t2.guardapp_secret")


def _orm_create_shared(ctx: JobContext) -> None:
    Plan.objects.create(name="free-forever", monthly_price=Decimal("0.00"))


def _orm_update_shared(ctx: JobContext) -> None:
    Plan.objects.update(monthly_price=Decimal("0.00"))


def _orm_delete_shared(ctx: JobContext) -> None:
    Plan.objects.all().delete()


def _orm_bulk_create_shared(ctx: JobContext) -> None:
    Plan.objects.bulk_create([Plan(name=f"bulk-{i}", monthly_price=Decimal(i)) for i in range(3)])


def _orm_save_shared(ctx: JobContext) -> None:
    plan = Plan.objects.get(name="basic")
    plan.monthly_price = Decimal("0.00")
    plan.save()


def _orm_update_or_create_shared(ctx: JobContext) -> None:
    Plan.objects.update_or_create(name="basic", defaults={"monthly_price": Decimal("0.01")})


def _orm_select_for_update_raw(ctx: JobContext) -> None:
    with transaction.atomic():
        list(Secret.objects.raw("SELECT * FROM t2.guardapp_secret FOR UPDATE"))


def _history_tamper(ctx: JobContext) -> None:
    JobRun.objects.filter(pk=ctx.run_id).update(status="succeeded", error_message="")


def _tenant_registry_tamper(ctx: JobContext) -> None:
    Client.objects.filter(schema_name=OTHER).update(schema_name="t1")


def _using_alias_other_tenant(ctx: JobContext) -> None:
    other = connections[EXTRA_ALIAS]
    other.set_schema(OTHER)  # type: ignore[attr-defined]
    list(Secret.objects.using(EXTRA_ALIAS).all())


def _using_alias_shared_write(ctx: JobContext) -> None:
    other = connections[EXTRA_ALIAS]
    other.set_tenant(ctx.tenant)  # type: ignore[attr-defined]
    Plan.objects.using(EXTRA_ALIAS).create(name="via-alias", monthly_price=Decimal("0.00"))


def _schema_editor_drop(ctx: JobContext) -> None:
    with connection.schema_editor() as editor:
        editor.delete_model(Secret)  # DROP TABLE through Django's migration machinery


def _orm_create_upper_case_shared(ctx: JobContext) -> None:
    # Honest ORM code; the shared table is "GuardShared_Notice" (issue 22).
    Notice.objects.create(text="from a tenant run")


def _swallowed(ctx: JobContext) -> None:
    # "Best effort" code that swallows the denial: the run must fail all the same.
    with contextlib.suppress(DatabaseAccessDenied):
        _run("DELETE FROM t2.guardapp_secret")
    Finding.objects.create(key="swallowed", value="carried on")


def _sql_case(statement: str) -> Callable[[JobContext], None]:
    def attack(ctx: JobContext) -> None:
        _run(statement)

    return attack


SQL_ATTACKS: dict[str, str] = {
    # schema-qualified names, spelled every way PostgreSQL accepts
    "qualified_select": "SELECT value FROM t2.guardapp_secret",
    "quoted_qualified_select": 'SELECT value FROM "t2"."guardapp_secret"',
    "mixed_case_unquoted": "SELECT value FROM T2.GuardApp_Secret",
    "parenthesised_select": "(SELECT value FROM t2.guardapp_secret)",
    "table_command": "TABLE t2.guardapp_secret",
    "values_subquery": "VALUES ((SELECT value FROM t2.guardapp_secret LIMIT 1))",
    "join_other_schema": (
        "SELECT a.value, b.value FROM guardapp_secret a "
        "JOIN t2.guardapp_secret b ON a.label <> b.label"
    ),
    "comma_join_other_schema": "SELECT * FROM guardapp_secret, ONLY t2.guardapp_secret",
    "exists_subquery": "SELECT 1 WHERE EXISTS (SELECT 1 FROM t2.guardapp_secret)",
    "union_other_schema": (
        "SELECT label, value FROM guardapp_secret UNION SELECT label, value FROM t2.guardapp_secret"
    ),
    "column_qualified_three_parts": "SELECT t2.guardapp_secret.value FROM guardapp_secret",
    "function_in_other_schema": "SELECT t2.guardapp_leak()",
    "cast_to_other_schema_type": "SELECT NULL::t2.guardapp_secret",
    # comments and literals that hide or fake keywords
    "comment_split_name": "SELECT value FROM/**/t2/* . */./**/guardapp_secret",
    "comment_hides_real_from": (
        "SELECT value /* FROM guardapp_secret */ FROM -- FROM guardapp_secret\n t2.guardapp_secret"
    ),
    "string_fakes_comment": "SELECT 'it''s /* not a comment', value FROM t2.guardapp_secret -- */",
    "dollar_quote_hides_quote": "SELECT $x$ ' $x$ AS q, value FROM t2.guardapp_secret",
    "string_fakes_statement_end": "SELECT ';--', value FROM t2.guardapp_secret",
    "nested_comment": "SELECT /* /* */ FROM guardapp_secret */ value FROM t2.guardapp_secret",
    "unicode_escape_identifier": 'SELECT value FROM U&"t\\0032".guardapp_secret',
    # writes into the other tenant
    "qualified_update": "UPDATE t2.guardapp_secret SET value = 'pwned'",
    "qualified_delete": 'DELETE FROM "t2"."guardapp_secret"',
    "qualified_insert": "INSERT INTO t2.guardapp_secret (label, value) VALUES ('planted', 'x')",
    "merge_into_other": (
        "MERGE INTO t2.guardapp_secret s USING guardapp_secret m ON s.label <> m.label "
        "WHEN MATCHED THEN UPDATE SET value = m.value"
    ),
    "insert_select_from_other": (
        "INSERT INTO guardapp_secret (label, value) SELECT label, value FROM t2.guardapp_secret"
    ),
    "update_from_other": "UPDATE guardapp_secret SET value = s.value FROM t2.guardapp_secret s",
    "delete_using_other": (
        "DELETE FROM guardapp_secret USING t2.guardapp_secret s WHERE s.label <> 'x'"
    ),
    "cte_delete_other": (
        "WITH gone AS (DELETE FROM t2.guardapp_secret RETURNING id) SELECT count(*) FROM gone"
    ),
    "explain_analyze_delete": "EXPLAIN ANALYZE DELETE FROM t2.guardapp_secret",
    "select_for_update_other": "SELECT value FROM t2.guardapp_secret FOR UPDATE",
    "truncate_other": "TRUNCATE t2.guardapp_secret",
    # writes to shared (public) tables
    "cte_update_shared": (
        "WITH x AS (UPDATE catalog_plan SET monthly_price = 0 RETURNING id) SELECT * FROM x"
    ),
    "qualified_public_update": "UPDATE public.catalog_plan SET monthly_price = 0",
    "mixed_case_shared_delete": "DELETE FROM Catalog_Plan",
    "truncate_shared": "TRUNCATE catalog_plan",
    # changing what unqualified names mean, or who we are
    "set_search_path": "SET search_path TO t2",
    "set_search_path_quoted": 'SET search_path = "t2", public',
    "set_search_path_appended": "SET search_path TO t1, public, t2",
    "set_session_search_path": "SET SESSION search_path TO t2",
    "set_config_search_path": "SELECT set_config('search_path', 't2', false)",
    "set_config_qualified": "SELECT pg_catalog.set_config('search_path', 't2', false)",
    "set_role": "SET ROLE postgres",
    "set_session_authorization": "SET SESSION AUTHORIZATION DEFAULT",
    "reset_all": "RESET ALL",
    "reset_search_path": "RESET search_path",
    "discard_all": "DISCARD ALL",
    # statements the guard cannot verify
    "multi_statement": "SELECT 1; DELETE FROM t2.guardapp_secret",
    "multi_statement_hidden_after_comment": "SELECT 1 /* ; */; DROP TABLE t2.guardapp_secret",
    "copy_to_stdout": "COPY t2.guardapp_secret TO STDOUT",
    "copy_query_delete": "COPY (DELETE FROM t2.guardapp_secret RETURNING *) TO STDOUT",
    "do_block": "DO $$ BEGIN DELETE FROM t2.guardapp_secret; END $$",
    "create_table_other": "CREATE TABLE t2.guardapp_evil (id int)",
    "alter_table_other": "ALTER TABLE t2.guardapp_secret ADD COLUMN evil int",
    "drop_table_other": "DROP TABLE t2.guardapp_secret",
    "select_into_other": "SELECT * INTO t2.guardapp_stolen FROM guardapp_secret",
    "lock_table_other": "LOCK TABLE t2.guardapp_secret",
    "prepare_statement": "PREPARE sneaky AS DELETE FROM t2.guardapp_secret",
    "query_to_xml": "SELECT query_to_xml('SELECT * FROM t2.guardapp_secret', true, true, '')",
    "dblink": "SELECT dblink_exec('dbname=x', 'DELETE FROM t2.guardapp_secret')",
    "call_procedure": "CALL t2.guardapp_proc()",
    "notify": "NOTIFY guardapp_channel, 'hello from t1'",
    # issue 22: the operators' copies in public, catalog columns with tenants' values
    "operators_session_read": "SELECT session_key FROM public.django_session",
    "operators_user_read": 'SELECT username, password FROM "public"."auth_user"',
    "operators_admin_log_join": (
        "SELECT l.object_repr FROM guardapp_secret s JOIN public.django_admin_log l ON true"
    ),
    "catalog_reltuples": "SELECT relname, reltuples FROM pg_class",
    "catalog_star": "SELECT * FROM pg_catalog.pg_class",
    "catalog_prosrc": "SELECT proname, prosrc FROM pg_proc",
    "catalog_view_definition": "SELECT viewname, definition FROM pg_views",
    "catalog_routine_definition": "SELECT routine_definition FROM information_schema.routines",
    "catalog_relation_size": "SELECT pg_relation_size(oid) FROM pg_class",
}

ATTACKS: dict[str, Callable[[JobContext], None]] = {
    **{name: _sql_case(statement) for name, statement in SQL_ATTACKS.items()},
    "set_local_search_path": _set_local_search_path,
    "three_part_name": _three_part_name,
    "orm_raw": _orm_raw,
    "orm_extra_select": _orm_extra_select,
    "orm_extra_where": _orm_extra_where,
    "rawsql_annotation": _rawsql_annotation,
    "rawsql_filter": _rawsql_filter,
    "set_schema_then_orm": _set_schema_then_orm,
    "set_schema_then_iterator": _set_schema_then_iterator,
    "set_tenant_then_orm": _set_tenant_then_orm,
    "schema_context_then_orm": _schema_context_then_orm,
    "set_schema_to_public_then_write": _set_schema_to_public_then_write,
    "composable_select": _composable_select,
    "composable_delete": _composable_delete,
    "executemany_other": _executemany_other,
    "executemany_shared": _executemany_shared,
    "bytes_sql": _bytes_sql,
    "orm_create_shared": _orm_create_shared,
    "orm_update_shared": _orm_update_shared,
    "orm_delete_shared": _orm_delete_shared,
    "orm_bulk_create_shared": _orm_bulk_create_shared,
    "orm_save_shared": _orm_save_shared,
    "orm_update_or_create_shared": _orm_update_or_create_shared,
    "orm_raw_select_for_update_other": _orm_select_for_update_raw,
    "history_tamper": _history_tamper,
    "tenant_registry_tamper": _tenant_registry_tamper,
    "using_alias_other_tenant": _using_alias_other_tenant,
    "using_alias_shared_write": _using_alias_shared_write,
    "schema_editor_drop": _schema_editor_drop,
    "swallowed_denial": _swallowed,
    "orm_create_upper_case_shared": _orm_create_upper_case_shared,
}


# --- known gaps: ways out that the guard does not see (docs/guard.md, "Not covered") ----------


def _cursor_copy(ctx: JobContext) -> None:
    # psycopg's Cursor.copy(), reached through Django's CursorWrapper.__getattr__: no wrapper.
    with connection.cursor() as cursor, cursor.copy("COPY t2.guardapp_secret TO STDOUT") as copy:
        leaked = b"".join(bytes(chunk) for chunk in copy)
    Finding.objects.create(key="leaked", value=leaked.decode())


def _cursor_stream(ctx: JobContext) -> None:
    with connection.cursor() as cursor:
        leaked = [row[0] for row in cursor.stream("SELECT value FROM t2.guardapp_secret")]
    Finding.objects.create(key="leaked", value=",".join(leaked))


def _name_in_string_literal(ctx: JobContext) -> None:
    # A relation named inside a string literal: the guard sees a string, PostgreSQL a sequence.
    _run("SELECT setval('t2.guardapp_secret_id_seq', 1000)")


def _other_thread(ctx: JobContext) -> None:
    # Django's connections are per thread; a thread's connection has no wrapper (and is public).
    import threading

    def write() -> None:
        Plan.objects.create(name="from-a-thread", monthly_price=Decimal("0.00"))
        connections.close_all()

    thread = threading.Thread(target=write)
    thread.start()
    thread.join()


def _raw_psycopg_connection(ctx: JobContext) -> None:
    connection.ensure_connection()
    leaked = connection.connection.execute("SELECT value FROM t2.guardapp_secret").fetchall()
    Finding.objects.create(key="leaked", value=",".join(row[0] for row in leaked))


ATTACKS["cursor_copy"] = _cursor_copy
ATTACKS["cursor_stream"] = _cursor_stream
ATTACKS["name_in_string_literal"] = _name_in_string_literal

KNOWN_GAPS: dict[str, Callable[[JobContext], None]] = {
    "other_thread": _other_thread,
    "raw_psycopg_connection": _raw_psycopg_connection,
}


@job
def attack(ctx: JobContext, *, case: str) -> None:
    """One way of reaching t2 or shared data from a run in t1, chosen by ``case``."""
    with _spying():
        (ATTACKS.get(case) or KNOWN_GAPS[case])(ctx)


@job(
    escape_hatch=EscapeHatch(
        reason="attack suite: the same attacks with the grant that covers them",
        grants=["cross_tenant_reads", "global_writes", "unsafe_raw"],
    )
)
def attack_granted(ctx: JobContext, *, case: str, grant: str) -> None:
    """``attack`` inside the call-site opt-in of ``grant`` (t2 for cross_tenant_reads)."""
    opener: contextlib.AbstractContextManager[None]
    if grant == "cross_tenant_reads":
        opener = ctx.cross_tenant_reads(_other_client())
    else:
        opener = getattr(ctx, grant)()
    with _spying(), opener:
        ATTACKS[case](ctx)


# --- grants: the allowed path ------------------------------------------------------------------


@job(
    escape_hatch=EscapeHatch(reason="maintains the shared plan catalogue", grants=["global_writes"])
)
def write_plan(ctx: JobContext, *, name: str, also_outside: bool = False) -> None:
    with ctx.global_writes():
        Plan.objects.create(name=name, monthly_price=Decimal("9.00"))
    if also_outside:
        Plan.objects.create(name=f"{name}-outside", monthly_price=Decimal("9.00"))


@job(
    escape_hatch=EscapeHatch(
        reason="compares settings with a sister tenant", grants=["cross_tenant_reads"]
    )
)
def read_other(ctx: JobContext, *, other: str, then: str = "") -> None:
    tenant = Client.objects.get(schema_name=other)
    with ctx.cross_tenant_reads(tenant):
        inside = sorted(Secret.objects.values_list("value", flat=True))
        if then == "write":
            Secret.objects.create(label="planted", value="from t1")
        elif then == "update":
            Secret.objects.update(value="pwned")
        elif then == "lock":
            with transaction.atomic():
                list(Secret.objects.select_for_update())
        elif then == "third_tenant":
            _run("SELECT value FROM t3.guardapp_secret")
        elif then == "qualified_other":
            _run("SELECT value FROM t2.guardapp_secret")
    after = sorted(Secret.objects.values_list("value", flat=True))
    Finding.objects.create(key="inside", value=",".join(inside))
    Finding.objects.create(key="after", value=",".join(after))
    Finding.objects.create(key="schema_after", value=connection.schema_name)  # type: ignore[attr-defined]


@job(escape_hatch=EscapeHatch(reason="tunes a slow report", grants=["unsafe_raw"]))
def tune(ctx: JobContext, *, also_outside: bool = False) -> None:
    with transaction.atomic(), ctx.unsafe_raw(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL statement_timeout = '5s'")
        cursor.execute("CREATE TEMP TABLE guard_scratch (n int) ON COMMIT DROP")
        cursor.execute("INSERT INTO guard_scratch VALUES (1), (2)")
        cursor.execute("SHOW statement_timeout")
        timeout = cursor.fetchone()[0]
        cursor.execute("SELECT count(*) FROM guard_scratch")
        rows = cursor.fetchone()[0]
    Finding.objects.create(key="statement_timeout", value=timeout)
    Finding.objects.create(key="scratch_rows", value=str(rows))
    if also_outside:
        with transaction.atomic():
            _run("SET LOCAL statement_timeout = '5s'")


@job(
    escape_hatch=EscapeHatch(
        reason="applies a change on behalf of the requesting user", grants=["system_identity"]
    )
)
def on_behalf(ctx: JobContext, *, user_id: int) -> None:
    user = get_user_model().objects.get(pk=user_id)
    before = current_user()
    with ctx.act_as(user):
        inside = current_user()
    after = current_user()
    for key, value in (("before", before), ("inside", inside), ("after", after)):
        Finding.objects.create(key=key, value=repr(getattr(value, "pk", value)))


@job(system=True)
def system_plans(ctx: JobContext, *, name: str, also_outside: bool = False) -> None:
    with ctx.system_db():
        Plan.objects.create(name=name, monthly_price=Decimal("1.00"))
    if also_outside:
        Plan.objects.create(name=f"{name}-outside", monthly_price=Decimal("1.00"))


@job
def undeclared(ctx: JobContext, *, which: str) -> None:
    """Uses an opt-in without declaring the grant (or, for system_db, without system=True)."""
    opener: contextlib.AbstractContextManager[None]
    if which == "cross_tenant_reads":
        opener = ctx.cross_tenant_reads(_other_client())
    elif which == "act_as":
        opener = ctx.act_as(None)
    else:
        opener = getattr(ctx, which)()
    with opener:
        Finding.objects.create(key="inside", value=which)


# --- write origin ------------------------------------------------------------------------------


@job
def save_person(ctx: JobContext, *, name: str, email: str) -> None:
    Person.objects.create(name=name, email=email)


@job
def rename_people(ctx: JobContext, *, name: str) -> None:
    Person.objects.update(name=name)  # no personal-data column


# --- modes -------------------------------------------------------------------------------------


@job
def guard_installed(ctx: JobContext) -> None:
    from kumiko_jobs.guard.wrapper import GuardWrapper

    for conn in connections.all():
        installed = any(isinstance(w, GuardWrapper) for w in conn.execute_wrappers)
        Finding.objects.create(key=conn.alias, value=str(installed))


# --- the calibrated attack suite (tests/guardapp/attacks_*.py) --------------------------------

from .attacks_base import Strategy, run_statements  # noqa: E402
from .attacks_own import OWN_STRATEGIES  # noqa: E402
from .attacks_public import PUBLIC_STRATEGIES  # noqa: E402
from .attacks_routes import ROUTE_STRATEGIES  # noqa: E402
from .attacks_sql import SQL_STRATEGIES  # noqa: E402

_ALL_STRATEGIES = (*SQL_STRATEGIES, *ROUTE_STRATEGIES, *PUBLIC_STRATEGIES, *OWN_STRATEGIES)
STRATEGIES: dict[str, Strategy] = {s.name: s for s in _ALL_STRATEGIES}
assert len(STRATEGIES) == len(_ALL_STRATEGIES), "duplicate names"


@job
def strategy(ctx: JobContext, *, name: str, mark: str) -> None:
    """One calibrated attack strategy, run in t1 with no grant; ``mark`` names its victims."""
    chosen = STRATEGIES[name]
    if chosen.perform is not None:
        chosen.perform(ctx, mark)
    else:
        run_statements(ctx, chosen.statements(mark), chosen.bound_params(mark))


@job(
    escape_hatch=EscapeHatch(
        reason="attack suite: strategies inside the grants that must not cover them",
        grants=["cross_tenant_reads", "unsafe_raw"],
    )
)
def strategy_granted(ctx: JobContext, *, name: str, mark: str, grant: str) -> None:
    """``strategy`` inside ``grant``'s block (t2 for cross_tenant_reads)."""
    opener: contextlib.AbstractContextManager[None]
    if grant == "cross_tenant_reads":
        opener = ctx.cross_tenant_reads(_other_client())
    else:
        opener = getattr(ctx, grant)()
    with opener:
        strategy.func(ctx, name=name, mark=mark)


@job
def victim(ctx: JobContext, *, mark: str) -> None:
    """The next run on the worker, in t2: an ordinary write that must land in t2."""
    Finding.objects.create(key=mark, value="victim")


@job(system=True)
def system_reprice(ctx: JobContext, *, name: str) -> None:
    """A system job taking its arguments at face value (a tenant run must not start it)."""
    with ctx.system_db():
        Plan.objects.filter(name=name).update(monthly_price=Decimal("0.00"))


# --- everyday ORM work: must run under 'enforce' without any grant -----------------------------


def _everyday_cases() -> dict[str, Callable[[], object]]:
    from django.db.models import Count, Exists, F, JSONField, Max, OuterRef, Q, Subquery, Window
    from django.db.models.functions import Cast, Length, RowNumber

    def skip_locked() -> object:
        with transaction.atomic():
            return [s.label for s in Secret.objects.select_for_update(skip_locked=True)]

    def upsert() -> object:
        Finding.objects.bulk_create(
            [Finding(id=7001, key="upsert", value="first")],
            update_conflicts=True,
            unique_fields=["id"],
            update_fields=["value"],
        )
        Finding.objects.bulk_create(
            [Finding(id=7001, key="upsert", value="second")],
            update_conflicts=True,
            unique_fields=["id"],
            update_fields=["value"],
        )
        return Finding.objects.get(id=7001).value

    def json_lookup() -> object:
        Finding.objects.create(key="json", value='{"kind": "a", "n": 2}')
        rows = Finding.objects.filter(key="json").annotate(
            data=Cast("value", output_field=JSONField())
        )
        return list(rows.filter(data__kind="a", data__n__gte=2).values_list("key", flat=True))

    def raw_any() -> object:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT label FROM guardapp_secret WHERE label = ANY(%s)", [["t1-secret", "x"]]
            )
            return cursor.fetchall()

    def own_sequence_and_xact_lock() -> object:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", ["billing-sync"])
            cursor.execute("SELECT nextval('guardapp_finding_id_seq') > 0")
            return cursor.fetchone()

    def explain_and_show() -> object:
        with connection.cursor() as cursor:
            cursor.execute("EXPLAIN SELECT * FROM guardapp_secret WHERE id = 1")
            plan = cursor.fetchall()
            cursor.execute("SHOW statement_timeout")
            return bool(plan), cursor.fetchone()

    return {
        "subquery_join": lambda: list(
            Secret.objects.filter(
                label__in=Finding.objects.filter(key="k").values("value")
            ).values_list("label", flat=True)
        ),
        "aggregates": lambda: list(
            Secret.objects.values("label").annotate(n=Count("id"), longest=Max(Length("value")))
        ),
        "window_function": lambda: list(
            Secret.objects.annotate(rank=Window(RowNumber(), order_by=F("id").asc())).values_list(
                "label", "rank"
            )
        ),
        "exists_outerref": lambda: list(
            Secret.objects.filter(
                Exists(Finding.objects.filter(key=OuterRef("label"))) | Q(label__startswith="t1"),
                id__in=Subquery(Secret.objects.values("id")),
            ).values_list("label", flat=True)
        ),
        "skip_locked": skip_locked,
        "upsert": upsert,
        "json_lookup": json_lookup,
        "iterator": lambda: [s.label for s in Secret.objects.order_by("id").iterator(chunk_size=1)],
        "get_or_create": lambda: Finding.objects.get_or_create(key="once", value="v")[1],
        "update_f_expression": lambda: Secret.objects.update(value=F("label")),
        "nested_atomic": lambda: _nested_atomic(),
        "raw_any": raw_any,
        "own_sequence_and_xact_lock": own_sequence_and_xact_lock,
        "explain_and_show": explain_and_show,
        "shared_reads": lambda: (
            sorted(Plan.objects.values_list("name", flat=True)),
            Client.objects.filter(schema_name="t1").exists(),
        ),
        "count_exists_distinct": lambda: (
            Secret.objects.count(),
            Secret.objects.filter(label="t1-secret").exists(),
            Secret.objects.values("label").distinct().count(),
        ),
    }


def _nested_atomic() -> object:
    with transaction.atomic():
        Finding.objects.create(key="outer", value="kept")
        try:
            with transaction.atomic():
                Finding.objects.create(key="inner", value="rolled back")
                raise ValueError("roll back the savepoint")
        except ValueError:
            pass
    return sorted(Finding.objects.filter(key__in=["outer", "inner"]).values_list("key", flat=True))


def everyday_case_names() -> list[str]:
    return sorted(_everyday_cases())


@job
def everyday(ctx: JobContext, *, case: str) -> None:
    """Ordinary ORM work of a tenant job; records its result in its own tenant."""
    result = _everyday_cases()[case]()
    Finding.objects.create(key=f"everyday:{case}", value=repr(result))


from . import (  # noqa: E402
    outlive_jobs,  # noqa: F401  (jobs of the "nothing outlives a run" suite)
    public_jobs,  # noqa: F401  (jobs of the public-copies suite)
    red_team_jobs,  # noqa: F401  (jobs of the round-4 red-team suite)
    role_jobs,  # noqa: F401  (jobs of the two-walls suite)
    route_jobs,  # noqa: F401  (jobs of the route and run-hygiene suites)
    slot_neighbours,  # noqa: F401  (the neighbours of the suites at several slots)
)
