"""Attack strategies that are Python: Django and psycopg routes (class 6), session state left
for the next run (class 7), and schema switching. Each ``perform(ctx, mark)`` runs inside the
attacking job, in tenant t1, with no grant."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from decimal import Decimal
from typing import Any

from asgiref.sync import sync_to_async
from django.core.management import call_command
from django.db import connection, connections, transaction
from django.db.models.expressions import RawSQL
from django_tenants.utils import schema_context
from psycopg import sql

from example_project.catalog.models import Plan
from example_project.customers.models import Client
from kumiko_jobs import signals

from .attacks_base import CANARY, Class, Effect, Strategy, log_rows, run_statements
from .attacks_sql import CONCAT
from .models import Finding, Secret

OTHER = "t2"
NEW_ALIAS = "gx_new_alias"
# dispatch_uids of receivers a job connected; the suite disconnects them after each burst.
CONNECTED_RECEIVERS: list[tuple[Any, str]] = []


def _t2_delete(mark: str) -> str:
    return f"DELETE FROM t2.guardapp_secret WHERE label = '{mark}'"


# --- 6. routes around the execute wrapper ------------------------------------------------------


def callproc_query_to_xml(ctx: Any, mark: str) -> None:
    with connection.cursor() as cursor:
        cursor.callproc("query_to_xml", ["SELECT value FROM t2.guardapp_secret", True, False, ""])
        log_rows(ctx, cursor.fetchall())


def callproc_ts_stat(ctx: Any, mark: str) -> None:
    with connection.cursor() as cursor:
        cursor.callproc("ts_stat", ["SELECT to_tsvector('simple', value) FROM t2.guardapp_secret"])
        log_rows(ctx, cursor.fetchall())


def callproc_set_config(ctx: Any, mark: str) -> None:
    with connection.cursor() as cursor:
        cursor.callproc("set_config", ["search_path", OTHER, False])
        cursor.execute("DELETE FROM guardapp_secret WHERE label = %s", [mark])


def executemany_other(ctx: Any, mark: str) -> None:
    with connection.cursor() as cursor:
        cursor.executemany(
            "UPDATE t2.guardapp_secret SET value = %s WHERE label = %s", [("pwned", mark)]
        )


def executemany_quoted_placeholder(ctx: Any, mark: str) -> None:
    with connection.cursor() as cursor:
        cursor.executemany(
            f"INSERT INTO guardapp_finding (key, value) VALUES ('{mark}', '%s')", [[CONCAT]]
        )


def composable_delete(ctx: Any, mark: str) -> None:
    query = sql.SQL("DELETE FROM {} WHERE label = {}").format(
        sql.Identifier("t2", "guardapp_secret"), sql.Literal(mark)
    )
    run_statements(ctx, (query,))  # type: ignore[arg-type]


def composable_quoted_placeholder(ctx: Any, mark: str) -> None:
    query = sql.SQL("SELECT '{}' AS v").format(sql.Placeholder())
    run_statements(ctx, (query,), [CONCAT])  # type: ignore[arg-type]


def stream_cr_comment(ctx: Any, mark: str) -> None:
    with connection.cursor() as cursor:
        rows = list(cursor.stream("SELECT 'x' --\rUNION SELECT value FROM t2.guardapp_secret"))
    log_rows(ctx, rows)


def stream_qualified(ctx: Any, mark: str) -> None:
    with connection.cursor() as cursor:
        rows = list(cursor.stream("SELECT value FROM t2.guardapp_secret"))
    log_rows(ctx, rows)


def copy_out(ctx: Any, mark: str) -> None:
    with (
        connection.cursor() as cursor,
        cursor.copy("COPY (SELECT value FROM t2.guardapp_secret) TO STDOUT") as copy,
    ):
        data = b"".join(bytes(chunk) for chunk in copy)
    log_rows(ctx, data.decode())


def copy_into_other(ctx: Any, mark: str) -> None:
    with (
        connection.cursor() as cursor,
        cursor.copy("COPY t2.guardapp_secret (label, value) FROM STDIN") as copy,
    ):
        copy.write_row((mark, "planted"))


def copy_euro_dollar(ctx: Any, mark: str) -> None:
    with (
        connection.cursor() as cursor,
        cursor.copy(
            "COPY (SELECT 1 AS a€$$, value AS b€$$ FROM t2.guardapp_secret) TO STDOUT"
        ) as copy,
    ):
        data = b"".join(bytes(chunk) for chunk in copy)
    log_rows(ctx, data.decode())


def orm_raw_quoted_placeholder(ctx: Any, mark: str) -> None:
    rows = Secret.objects.raw(
        "SELECT id, label, value FROM guardapp_secret WHERE label = '%s'",
        [" UNION SELECT id, label, value FROM t2.guardapp_secret --"],
    )
    log_rows(ctx, [(r.label, r.value) for r in rows])


def orm_extra_quoted_placeholder(ctx: Any, mark: str) -> None:
    rows = Secret.objects.extra(select={"leak": "'%s'"}, select_params=[CONCAT])
    log_rows(ctx, list(rows.values_list("leak", flat=True)))


def orm_rawsql_quoted_placeholder(ctx: Any, mark: str) -> None:
    rows = Secret.objects.annotate(leak=RawSQL("'%s'", [CONCAT])).values_list("leak", flat=True)
    log_rows(ctx, list(rows))


def orm_raw(ctx: Any, mark: str) -> None:
    log_rows(ctx, [s.value for s in Secret.objects.raw('SELECT * FROM "t2"."guardapp_secret"')])


def orm_extra_select(ctx: Any, mark: str) -> None:
    rows = Secret.objects.extra(
        select={"leak": "SELECT string_agg(value, ',') FROM t2.guardapp_secret"}
    )
    log_rows(ctx, list(rows.values_list("leak", flat=True)))


def orm_rawsql_filter(ctx: Any, mark: str) -> None:
    rows = Finding.objects.filter(key=mark)
    Finding.objects.create(key=mark, value="x")
    rows.update(value=RawSQL("SELECT string_agg(value, ',') FROM t2.guardapp_secret", ()))


def _run_async(query: Callable[[], Awaitable[Any]]) -> None:
    """The async ORM from a sync job: its queries run on asgiref's executor thread."""

    async def go() -> None:
        try:
            await query()
        finally:
            await sync_to_async(connections.close_all)()  # that thread's connection

    asyncio.run(go())


def async_orm_shared_update(ctx: Any, mark: str) -> None:
    _run_async(lambda: Plan.objects.filter(name=mark).aupdate(monthly_price=Decimal("0.00")))


def async_orm_shared_delete(ctx: Any, mark: str) -> None:
    _run_async(lambda: Plan.objects.filter(name=mark).adelete())


def async_orm_shared_create(ctx: Any, mark: str) -> None:
    _run_async(lambda: Plan.objects.acreate(name=f"{mark}-async", monthly_price=Decimal("0.00")))


def _new_alias() -> Any:
    connections.settings[NEW_ALIAS] = dict(connections["default"].settings_dict)
    return connections[NEW_ALIAS]


def _drop_new_alias() -> None:
    with contextlib.suppress(Exception):
        connections[NEW_ALIAS].close()
        del connections[NEW_ALIAS]
    connections.settings.pop(NEW_ALIAS, None)


def new_alias_other_tenant(ctx: Any, mark: str) -> None:
    try:
        with _new_alias().cursor() as cursor:
            cursor.execute(_t2_delete(mark))
    finally:
        _drop_new_alias()


def new_alias_shared_write(ctx: Any, mark: str) -> None:
    try:
        Plan.objects.using(_new_alias().alias).filter(name=mark).update(monthly_price=0)
    finally:
        _drop_new_alias()


class _LeakyError(Exception):
    """Rendered by the runner (str(), traceback) after the job body returned."""

    def __str__(self) -> str:
        with connection.cursor() as cursor:
            cursor.execute("SELECT string_agg(value, ',') FROM t2.guardapp_secret")
            return f"failed near {cursor.fetchone()[0]}"


class _WritingError(Exception):
    mark = ""

    def __str__(self) -> str:
        with connection.cursor() as cursor:
            cursor.execute(_t2_delete(self.mark))
        return "failed"


def exception_str_leaks(ctx: Any, mark: str) -> None:
    raise _LeakyError()


def exception_str_writes(ctx: Any, mark: str) -> None:
    error = _WritingError()
    error.mark = mark
    raise error


def _connect(signal: Any, mark: str) -> None:
    def receiver(**kwargs: Any) -> None:
        with connection.cursor() as cursor:
            cursor.execute(_t2_delete(mark))

    uid = f"gx-{mark}"
    signal.connect(receiver, weak=False, dispatch_uid=uid)
    CONNECTED_RECEIVERS.append((signal, uid))


def receiver_on_success(ctx: Any, mark: str) -> None:
    _connect(signals.job_succeeded, mark)


def receiver_on_failure(ctx: Any, mark: str) -> None:
    _connect(signals.job_failed, mark)
    raise RuntimeError("fail so that job_failed fires")


def enqueue_system_job(ctx: Any, mark: str) -> None:
    from .jobs import system_reprice  # jobs imports this module

    system_reprice.enqueue(name=mark)


def dbshell(ctx: Any, mark: str) -> None:
    call_command("dbshell", "--", "-c", _t2_delete(mark))


# --- schema switching ----------------------------------------------------------------------------


def set_schema_then_orm(ctx: Any, mark: str) -> None:
    connection.set_schema(OTHER)  # type: ignore[attr-defined]
    Secret.objects.filter(label=mark).delete()


def set_schema_then_iterator(ctx: Any, mark: str) -> None:
    connection.set_schema(OTHER)  # type: ignore[attr-defined]
    log_rows(ctx, [s.value for s in Secret.objects.iterator()])


def set_tenant_then_orm(ctx: Any, mark: str) -> None:
    connection.set_tenant(Client.objects.get(schema_name=OTHER))  # type: ignore[attr-defined]
    Secret.objects.filter(label=mark).update(value="pwned")


def schema_context_then_orm(ctx: Any, mark: str) -> None:
    with schema_context(OTHER):
        Secret.objects.filter(label=mark).delete()


def schema_context_read(ctx: Any, mark: str) -> None:
    with schema_context(OTHER):
        values = list(Secret.objects.values_list("value", flat=True))
    log_rows(ctx, values)


def set_schema_public_then_write(ctx: Any, mark: str) -> None:
    connection.set_schema_to_public()  # type: ignore[attr-defined]
    Plan.objects.filter(name=mark).update(monthly_price=0)


def orm_shared_update(ctx: Any, mark: str) -> None:
    Plan.objects.filter(name=mark).update(monthly_price=Decimal("0.00"))


def orm_shared_delete(ctx: Any, mark: str) -> None:
    Plan.objects.filter(name=mark).delete()


def orm_shared_save(ctx: Any, mark: str) -> None:
    plan = Plan.objects.get(name=mark)
    plan.monthly_price = Decimal("0.00")
    plan.save()


def orm_shared_bulk_create(ctx: Any, mark: str) -> None:
    Plan.objects.bulk_create([Plan(name=f"{mark}-bulk", monthly_price=Decimal(0))])


def orm_shared_update_or_create(ctx: Any, mark: str) -> None:
    Plan.objects.update_or_create(name=mark, defaults={"monthly_price": Decimal("0.01")})


def set_search_path_then_orm(ctx: Any, mark: str) -> None:
    run_statements(ctx, ("SET search_path TO t2",))
    Secret.objects.filter(label=mark).delete()


def set_session_search_path_then_orm(ctx: Any, mark: str) -> None:
    run_statements(ctx, ('SET SESSION search_path = "t2", public',))
    Secret.objects.filter(label=mark).update(value="pwned")


def set_local_search_path_then_orm(ctx: Any, mark: str) -> None:
    with transaction.atomic():
        run_statements(ctx, ("SET LOCAL search_path TO t2",))
        Secret.objects.filter(label=mark).delete()


def set_search_path_appended_then_raw(ctx: Any, mark: str) -> None:
    run_statements(
        ctx,
        (
            "SET search_path TO t2, t1, public",
            f"DELETE FROM guardapp_secret WHERE label = '{mark}'",
        ),
    )


def pg_settings_then_orm(ctx: Any, mark: str) -> None:
    run_statements(ctx, ("UPDATE pg_settings SET setting = 't2' WHERE name = 'search_path'",))
    Secret.objects.filter(label=mark).delete()  # plain ORM, no SET in between


def pg_settings_then_orm_read(ctx: Any, mark: str) -> None:
    run_statements(
        ctx, ("UPDATE pg_settings SET setting = 't2, public' WHERE name = 'search_path'",)
    )
    log_rows(ctx, list(Secret.objects.values_list("value", flat=True)))


# --- 7. state left on the worker's connection for the next run (of t2) -------------------------


def raw_begin_left_open(ctx: Any, mark: str) -> None:
    run_statements(ctx, ("BEGIN",))


def start_transaction_left_open(ctx: Any, mark: str) -> None:
    run_statements(ctx, ("START TRANSACTION ISOLATION LEVEL READ COMMITTED",))


def atomic_never_left(ctx: Any, mark: str) -> None:
    transaction.atomic().__enter__()
    Finding.objects.create(key=mark, value="inside")


def pg_settings_read_only(ctx: Any, mark: str) -> None:
    run_statements(
        ctx, ("UPDATE pg_settings SET setting = 'on' WHERE name = 'default_transaction_read_only'",)
    )


def set_session_read_only(ctx: Any, mark: str) -> None:
    run_statements(ctx, ("SET SESSION default_transaction_read_only = on",))


def set_config_read_only(ctx: Any, mark: str) -> None:
    run_statements(ctx, ("SELECT set_config('default_transaction_read_only', 'on', false)",))


def temp_table_shadows(ctx: Any, mark: str) -> None:
    run_statements(ctx, ("CREATE TEMP TABLE guardapp_finding (id serial, key text, value text)",))


def pg_temp_table_shadows(ctx: Any, mark: str) -> None:
    run_statements(
        ctx, ("CREATE TABLE pg_temp.guardapp_finding (id serial, key text, value text)",)
    )


def set_role(ctx: Any, mark: str) -> None:
    run_statements(ctx, ("SET ROLE pg_monitor",))


def set_session_authorization(ctx: Any, mark: str) -> None:
    run_statements(ctx, ("SET SESSION AUTHORIZATION pg_monitor",))


_CALLABLES: list[tuple[Any, Class, Effect, dict[str, Any]]] = [
    (callproc_query_to_xml, Class.ROUTES, Effect.LEAK, {}),
    (callproc_ts_stat, Class.ROUTES, Effect.LEAK, {}),
    (callproc_set_config, Class.ROUTES, Effect.T2_ROW, {"isolated": True}),
    (executemany_other, Class.ROUTES, Effect.T2_ROW, {}),
    (executemany_quoted_placeholder, Class.PLACEHOLDERS, Effect.LEAK, {}),
    (composable_delete, Class.ROUTES, Effect.T2_ROW, {}),
    (composable_quoted_placeholder, Class.PLACEHOLDERS, Effect.LEAK, {}),
    (stream_cr_comment, Class.ROUTES, Effect.LEAK, {}),
    (stream_qualified, Class.ROUTES, Effect.LEAK, {}),
    (copy_out, Class.ROUTES, Effect.LEAK, {}),
    (copy_euro_dollar, Class.ROUTES, Effect.LEAK, {}),
    (copy_into_other, Class.ROUTES, Effect.T2_ROW, {}),
    (orm_raw_quoted_placeholder, Class.PLACEHOLDERS, Effect.LEAK, {}),
    (orm_extra_quoted_placeholder, Class.PLACEHOLDERS, Effect.LEAK, {}),
    (orm_rawsql_quoted_placeholder, Class.PLACEHOLDERS, Effect.LEAK, {}),
    (orm_raw, Class.ROUTES, Effect.LEAK, {}),
    (orm_extra_select, Class.ROUTES, Effect.LEAK, {}),
    (orm_rawsql_filter, Class.ROUTES, Effect.LEAK, {}),
    (async_orm_shared_update, Class.ROUTES, Effect.SHARED_ROW, {"refused": False}),
    (async_orm_shared_delete, Class.ROUTES, Effect.SHARED_ROW, {"refused": False}),
    (async_orm_shared_create, Class.ROUTES, Effect.SHARED_ROW, {"refused": False}),
    (new_alias_other_tenant, Class.ROUTES, Effect.T2_ROW, {"refused": False}),
    (new_alias_shared_write, Class.ROUTES, Effect.SHARED_ROW, {"refused": False}),
    (exception_str_leaks, Class.ROUTES, Effect.LEAK, {"refused": False}),
    (exception_str_writes, Class.ROUTES, Effect.T2_ROW, {"refused": False}),
    (receiver_on_success, Class.ROUTES, Effect.T2_ROW, {"refused": False}),
    (receiver_on_failure, Class.ROUTES, Effect.T2_ROW, {"refused": False}),
    (enqueue_system_job, Class.ROUTES, Effect.SHARED_ROW, {"refused": False}),
    (dbshell, Class.ROUTES, Effect.T2_ROW, {"refused": False}),
    (set_schema_then_orm, Class.SWITCHING, Effect.T2_ROW, {}),
    (set_schema_then_iterator, Class.SWITCHING, Effect.LEAK, {}),
    (set_tenant_then_orm, Class.SWITCHING, Effect.T2_ROW, {}),
    (schema_context_then_orm, Class.SWITCHING, Effect.T2_ROW, {}),
    (schema_context_read, Class.SWITCHING, Effect.LEAK, {}),
    (set_schema_public_then_write, Class.SWITCHING, Effect.SHARED_ROW, {}),
    (orm_shared_update, Class.WRITES, Effect.SHARED_ROW, {}),
    (orm_shared_delete, Class.WRITES, Effect.SHARED_ROW, {}),
    (orm_shared_save, Class.WRITES, Effect.SHARED_ROW, {}),
    (orm_shared_bulk_create, Class.WRITES, Effect.SHARED_ROW, {}),
    (orm_shared_update_or_create, Class.WRITES, Effect.SHARED_ROW, {}),
    (set_search_path_then_orm, Class.SWITCHING, Effect.T2_ROW, {"isolated": True}),
    (set_session_search_path_then_orm, Class.SWITCHING, Effect.T2_ROW, {"isolated": True}),
    (set_local_search_path_then_orm, Class.SWITCHING, Effect.T2_ROW, {"isolated": True}),
    (set_search_path_appended_then_raw, Class.SWITCHING, Effect.T2_ROW, {"isolated": True}),
    (pg_settings_then_orm, Class.CATALOG, Effect.T2_ROW, {"isolated": True}),
    (pg_settings_then_orm_read, Class.CATALOG, Effect.LEAK, {"isolated": True}),
    (raw_begin_left_open, Class.STATE, Effect.VICTIM, {"refused": False}),
    (start_transaction_left_open, Class.STATE, Effect.VICTIM, {"refused": False}),
    (atomic_never_left, Class.STATE, Effect.VICTIM, {"refused": False}),
    (pg_settings_read_only, Class.STATE, Effect.VICTIM, {}),
    (set_session_read_only, Class.STATE, Effect.VICTIM, {}),
    (set_config_read_only, Class.STATE, Effect.VICTIM, {}),
    (temp_table_shadows, Class.STATE, Effect.VICTIM, {}),
    (pg_temp_table_shadows, Class.STATE, Effect.VICTIM, {}),
    (set_role, Class.STATE, Effect.VICTIM, {}),
    (set_session_authorization, Class.STATE, Effect.VICTIM, {}),
]

ROUTE_STRATEGIES: list[Strategy] = [
    Strategy(name=func.__name__, cls=cls, effect=effect, perform=func, **extra)
    for func, cls, effect, extra in _CALLABLES
]
assert CANARY  # re-exported for the suite
