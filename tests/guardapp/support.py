"""Helpers of the guard suites: seed data, a snapshot of everything an attack could touch."""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from django.db import connection, connections

from tests.conftest import TENANTS, refuse_unless_test_database

from .jobs import EXTRA_ALIAS

if TYPE_CHECKING:
    import psycopg

GUARD_TABLES = ("guardapp_secret", "guardapp_person", "guardapp_finding")
PLANS = (("basic", "10.00"), ("pro", "25.00"))


def seed() -> None:
    """Fresh guardapp tables in every tenant (one secret each) and two shared plans."""
    from kumiko_jobs.history import audit

    refuse_unless_test_database()

    audit._last_reported.clear()
    connection.set_schema_to_public()  # type: ignore[attr-defined]
    with connection.cursor() as cursor:
        cursor.execute(
            'TRUNCATE kumiko_jobs_escapehatchuse, catalog_plan, "GuardShared_Notice" '
            "RESTART IDENTITY"
        )
        for name, price in PLANS:
            cursor.execute(
                "INSERT INTO catalog_plan (name, monthly_price) VALUES (%s, %s)", (name, price)
            )
        for schema in TENANTS:
            tables = ", ".join(f'"{schema}".{t}' for t in GUARD_TABLES)
            cursor.execute(f"TRUNCATE {tables} RESTART IDENTITY")
            cursor.execute(
                f'INSERT INTO "{schema}".guardapp_secret (label, value) VALUES (%s, %s)',
                (f"{schema}-secret", f"{schema}-value"),
            )


def clean() -> None:
    from kumiko_jobs.history import audit

    audit._last_reported.clear()
    connection.set_schema_to_public()  # type: ignore[attr-defined]
    with connection.cursor() as cursor:
        cursor.execute(
            'TRUNCATE kumiko_jobs_escapehatchuse, catalog_plan, "GuardShared_Notice" '
            "RESTART IDENTITY"
        )
        for schema in TENANTS:
            tables = ", ".join(f'"{schema}".{t}' for t in GUARD_TABLES)
            cursor.execute(f"TRUNCATE {tables} RESTART IDENTITY")


def _rows(query: str, params: Any = None) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(query, params)
        return list(cursor.fetchall())


def secrets(schema: str) -> list[tuple[str, str]]:
    return [(r[0], r[1]) for r in _rows(f'SELECT label, value FROM "{schema}".guardapp_secret')]


def findings(schema: str) -> dict[str, str]:
    rows = _rows(f'SELECT key, value FROM "{schema}".guardapp_finding ORDER BY id')
    return {r[0]: r[1] for r in rows}


def plans() -> list[tuple[str, str]]:
    rows = _rows("SELECT name, monthly_price::text FROM public.catalog_plan ORDER BY name")
    return [(r[0], r[1]) for r in rows]


def snapshot() -> dict[str, Any]:
    """Everything outside the attacking run's own tables that an attack could change."""
    connection.set_schema_to_public()  # type: ignore[attr-defined]
    schemas = (*TENANTS, "public")
    state: dict[str, Any] = {
        f"{s}.secret": _rows(f'SELECT id, label, value FROM "{s}".guardapp_secret ORDER BY id')
        for s in TENANTS
    }
    state["plans"] = _rows("SELECT id, name, monthly_price FROM public.catalog_plan ORDER BY id")
    state["tenants"] = _rows("SELECT id, schema_name, name FROM customers_client ORDER BY id")
    state["schemata"] = _rows("SELECT nspname FROM pg_namespace ORDER BY nspname")
    state["tables"] = _rows(
        "SELECT table_schema, table_name FROM information_schema.tables "
        "WHERE table_schema = ANY(%s) ORDER BY 1, 2",
        (list(schemas),),
    )
    state["secret_columns"] = _rows(
        "SELECT table_schema, column_name FROM information_schema.columns "
        "WHERE table_name = 'guardapp_secret' ORDER BY 1, 2"
    )
    return state


# What may pass the guard in an attack run: nothing that names t2 or writes a shared table, and
# no session-changing or unverifiable statement other than django-tenants' own search_path.
_OWN_SEARCH_PATH = re.compile(r'^SET search_path = "t1","public"$')
_NAMES_OTHER_TENANT = re.compile(r'(?i)(\bt2\b|U&")')
_UNVERIFIABLE_HEAD = re.compile(
    r"(?i)^\W*(set|reset|discard|do|copy|create|alter|drop|truncate|lock|prepare|listen|"
    r"notify|call|execute|grant|revoke|comment)\b"
)
_SHARED_WRITE = re.compile(
    r'(?i)\b(insert\s+into|update|delete\s+from|merge\s+into)\s+(only\s+)?("?public"?\s*\.\s*)?'
    r'"?(catalog_plan|kumiko_jobs_\w+|customers_\w+)\b'
)


def offending(statement: str) -> str:
    """Why ``statement`` must not have reached PostgreSQL in an attack run, or ''."""
    if _NAMES_OTHER_TENANT.search(statement):
        return "names the other tenant"
    if _UNVERIFIABLE_HEAD.match(statement) and not _OWN_SEARCH_PATH.match(statement):
        return "session-changing or unverifiable"
    if ";" in statement.strip().rstrip(";"):
        return "several statements"
    if _SHARED_WRITE.search(statement):
        return "writes a shared table"
    return ""


@contextlib.contextmanager
def extra_alias() -> Iterator[str]:
    """A second database alias (same database), for the ``QuerySet.using()`` cases."""
    connections.settings[EXTRA_ALIAS] = dict(connections["default"].settings_dict)
    try:
        yield EXTRA_ALIAS
    finally:
        with contextlib.suppress(AttributeError):
            connections[EXTRA_ALIAS].close()
            del connections[EXTRA_ALIAS]
        del connections.settings[EXTRA_ALIAS]


# --- the calibrated attack suite: planting, a second connection, effects -----------------------


class Observer:
    """The test's second connection (psycopg, autocommit): plants what the strategies aim at and
    reads their effects. The worker runs in the test process on Django's connection, which an
    attack may leave in any state; this one it never touches."""

    def __init__(self) -> None:
        import psycopg

        self._psycopg = psycopg
        settings = connection.settings_dict
        self.params = {
            "dbname": settings["NAME"],
            "user": settings["USER"] or None,
            "password": settings["PASSWORD"] or None,
            "host": settings["HOST"] or None,
            "port": settings["PORT"] or None,
        }
        admin = os.environ.get("KUMIKO_TEST_ADMIN_DATABASE_URL")
        if admin:  # the suite runs as a non-superuser project user (tests/settings.py)
            from urllib.parse import unquote, urlparse

            url = urlparse(admin)
            self.params["user"] = unquote(url.username or "") or None
            self.params["password"] = unquote(url.password or "") or None
        self.conn = self.connect()
        self.notified: list[str] = []
        self.conn.add_notify_handler(lambda n: self.notified.append(n.payload))
        self.sessions: list[Any] = []

    def connect(self, *, autocommit: bool = True, **extra: Any) -> Any:
        params = {k: v for k, v in self.params.items() if v is not None}
        return self._psycopg.connect(**params, **extra, autocommit=autocommit)

    def rows(self, query: str, params: Any = None) -> list[tuple[Any, ...]]:
        cursor = self.conn.execute(query, params)
        return list(cursor.fetchall()) if cursor.description else []

    def value(self, query: str, params: Any = None) -> Any:
        rows = self.rows(query, params)
        return rows[0][0] if rows else None

    def close(self) -> None:
        for session in self.sessions:
            with contextlib.suppress(Exception):
                session.close()
        self.conn.close()


def plant(observer: Observer, marks: dict[str, Any]) -> None:
    """What the strategies aim at: the canary and one victim object per strategy and effect.

    ``marks`` maps each mark to its strategy's effect."""
    from .attacks_base import (
        ACTIVITY_CANARY,
        CANARY,
        INTACT,
        NOTIFY_CHANNEL,
        STATS_ROWS,
        VICTIM_APP,
        Effect,
    )

    o = observer
    o.rows("INSERT INTO t2.guardapp_secret (label, value) VALUES ('canary', %s)", (CANARY,))
    for mark, effect in marks.items():
        if effect is Effect.T2_ROW:
            o.rows("INSERT INTO t2.guardapp_secret (label, value) VALUES (%s, %s)", (mark, INTACT))
        elif effect is Effect.SHARED_ROW:
            o.rows("INSERT INTO public.catalog_plan (name, monthly_price) VALUES (%s, 1)", (mark,))
        elif effect in (Effect.T2_TABLE, Effect.CATALOG):
            o.rows(f"CREATE TABLE t2.{mark}_tab (v text)")
            o.rows(f"INSERT INTO t2.{mark}_tab VALUES ('{INTACT}')")
        elif effect is Effect.T2_SEQ:
            o.rows(f"CREATE SEQUENCE t2.{mark}_seq")
        elif effect is Effect.TERMINATED:
            o.sessions.append(o.connect(application_name=f"{VICTIM_APP}_{mark}"))
        elif effect is Effect.STATS:
            o.rows(f"CREATE TABLE t2.{mark}_tab (v text)")
            o.rows(
                f"INSERT INTO t2.{mark}_tab SELECT 'r' || n FROM generate_series(1, %s) n",
                (STATS_ROWS,),
            )
            o.rows(f"VACUUM ANALYZE t2.{mark}_tab")  # pg_class now holds its true size
    plant_operators_copies(o)
    from .attacks_own import plant_history

    plant_history(o)  # a run of t2 in kumiko's history, the canary its secret argument
    # A function of t2 that reads t2 (tenants share their migrations, so t1 has its own copy),
    # and an operator that calls it.
    o.rows(
        "CREATE FUNCTION t2.gx_leak(a int DEFAULT 0, b int DEFAULT 0) RETURNS text "
        "LANGUAGE sql AS $$ SELECT string_agg(value, ',') FROM t2.guardapp_secret $$"
    )
    o.rows("CREATE OPERATOR t2.### (LEFTARG = int, RIGHTARG = int, FUNCTION = t2.gx_leak)")
    # A view of t2 whose definition holds a value of t2 (the catalogs show definitions).
    o.rows(f"CREATE VIEW t2.gx_view AS SELECT '{CANARY}'::text AS v")
    o.rows(f"CREATE FUNCTION t2.gx_const() RETURNS text LANGUAGE sql AS $$ SELECT '{CANARY}' $$")
    o.rows(f"CREATE MATERIALIZED VIEW t2.gx_matview AS SELECT '{CANARY}'::text AS v")
    o.rows("CREATE TABLE t2.gx_ruled (v text)")
    o.rows(
        f"CREATE RULE gx_rule AS ON UPDATE TO t2.gx_ruled WHERE old.v = '{CANARY}' "
        "DO INSTEAD NOTHING"
    )
    # Statistics and on-disk pages hold t2's values; another t2 session's query text too.
    o.rows("ANALYZE t2.guardapp_secret")
    o.rows("CHECKPOINT")
    activity = o.connect(application_name="gx_t2_session")
    activity.execute(f"SELECT '{ACTIVITY_CANARY}' AS planted_by_t2")
    o.sessions.append(activity)
    o.rows(f"LISTEN {NOTIFY_CHANNEL}")


# The operators' own rows in public (django.contrib.sessions, auth and admin are in SHARED_APPS
# and TENANT_APPS: public's copies are the operators'), each holding the canary.
OPERATOR = "gx_operator"


def plant_operators_copies(o: Observer) -> None:
    from .attacks_base import CANARY

    o.rows(
        "INSERT INTO public.django_session (session_key, session_data, expire_date) "
        "VALUES (%s, 'x', now() + interval '1 day')",
        (f"{CANARY}sess",),
    )
    user = o.value(
        "INSERT INTO public.auth_user (password, is_superuser, username, first_name, last_name, "
        "email, is_staff, is_active, date_joined) "
        "VALUES (%s, true, %s, '', '', '', true, true, now()) RETURNING id",
        (f"md5${CANARY}hash", OPERATOR),
    )
    o.rows(
        "INSERT INTO public.django_admin_log (action_time, object_id, object_repr, action_flag, "
        "change_message, user_id) VALUES (now(), '1', %s, 2, '', %s)",
        (f"{CANARY} plan", user),
    )


def unplant_operators_copies(o: Observer) -> None:
    from .attacks_base import CANARY

    o.rows("DELETE FROM public.django_admin_log WHERE object_repr LIKE %s", (f"{CANARY}%",))
    o.rows("DELETE FROM public.auth_user WHERE username = %s", (OPERATOR,))
    o.rows("DELETE FROM public.django_session WHERE session_key LIKE %s", (f"{CANARY}%",))


def unplant(observer: Observer) -> None:
    from .attacks_own import unplant_history

    o = observer
    unplant_operators_copies(o)
    unplant_history(o)
    o.rows("DROP MATERIALIZED VIEW IF EXISTS t2.gx_matview")
    # The tables and sequences planted for (or created by) strategies are named gx<n>_...
    for name, kind in o.rows(
        "SELECT relname, relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE nspname = 't2' AND relname LIKE 'gx%' AND relkind IN ('r', 'S')"
    ):
        o.rows(f'DROP {"SEQUENCE" if kind == "S" else "TABLE"} IF EXISTS t2."{name}" CASCADE')
    o.rows("DROP VIEW IF EXISTS t2.gx_view")
    o.rows("DROP FUNCTION IF EXISTS t2.gx_const()")
    o.rows("DROP FUNCTION IF EXISTS t2.gx_leak(int, int) CASCADE")
    o.rows("DELETE FROM public.catalog_plan WHERE name LIKE 'gx%'")
    o.rows(
        "SELECT lo_unlink(m.oid) FROM pg_largeobject_metadata m "
        "WHERE convert_from(lo_get(m.oid), 'UTF8') LIKE 'gx%'"
    )
    o.rows("DELETE FROM pg_description WHERE description LIKE 'gx%'")
    o.rows("SELECT pg_advisory_unlock_all()")


def leak_texts(observer: Observer, run_id: str, mark: str) -> list[str]:
    """Everything of the run an attacker reads back: error text, traceback, log, t1's rows."""
    o = observer
    texts = [
        str(t)
        for row in o.rows(
            "SELECT error_message, traceback, log::text FROM kumiko_jobs_jobattempt "
            "WHERE run_id = %s",
            (run_id,),
        )
        for t in row
    ]
    texts.append(
        str(o.value("SELECT error_message FROM kumiko_jobs_jobrun WHERE run_id = %s", (run_id,)))
    )
    texts += [r[0] for r in o.rows("SELECT value FROM t1.guardapp_finding WHERE key = %s", (mark,))]
    return texts


def effect_evidence(observer: Observer, effect: Any, mark: str, run_id: str) -> str:
    """What shows the strategy reached its target, read on the second connection; '' if not."""
    from .attacks_base import CANARY, INTACT, Effect

    o = observer
    if effect is Effect.LEAK:
        found = [t for t in leak_texts(o, run_id, mark) if CANARY in t]
        return f"canary in {found[0][:300]!r}" if found else ""
    if effect is Effect.T2_ROW:
        rows = o.rows("SELECT label, value FROM t2.guardapp_secret WHERE label = %s", (mark,))
        return "" if rows == [(mark, INTACT)] else f"t2 rows now {rows}"
    if effect is Effect.T2_TABLE:
        state = o.rows(
            "SELECT table_name, string_agg(column_name, ',' ORDER BY column_name) "
            "FROM information_schema.columns WHERE table_schema = 't2' AND table_name LIKE %s "
            "GROUP BY table_name",
            (f"{mark}%",),
        )
        if state != [(f"{mark}_tab", "v")]:
            return f"t2 tables now {state}"
        count = o.value(f"SELECT count(*) FROM t2.{mark}_tab")
        return "" if count == 1 else f"t2.{mark}_tab has {count} rows"
    if effect is Effect.T2_SEQ:
        state = o.rows(f"SELECT last_value, is_called FROM t2.{mark}_seq")
        return "" if state == [(1, False)] else f"t2 sequence now {state}"
    if effect is Effect.SHARED_ROW:
        rows = o.rows(
            "SELECT name, monthly_price::text FROM public.catalog_plan "
            "WHERE name = %s OR name LIKE %s ORDER BY name",
            (mark, f"{mark}-%"),
        )
        return "" if rows == [(mark, "1.00")] else f"shared plans now {rows}"
    if effect is Effect.CATALOG:
        n = o.value("SELECT count(*) FROM pg_description WHERE description = %s", (mark,))
        return f"{n} pg_description rows" if n else ""
    if effect is Effect.LARGE_OBJECT:
        n = o.value(
            "SELECT count(*) FROM pg_largeobject_metadata m "
            "WHERE convert_from(lo_get(m.oid), 'UTF8') = %s",
            (mark,),
        )
        return f"{n} large objects" if n else ""
    if effect is Effect.NOTIFY:
        o.rows("SELECT 1")  # delivers pending notifications to the handler
        got = [p for p in o.notified if p.startswith(mark)]
        return f"notified {got}" if got else ""
    if effect is Effect.LOCK:
        key = "kumiko_jobs:guardapp.victim:t2"
        if o.value("SELECT pg_try_advisory_lock(hashtext(%s))", (key,)):
            o.rows("SELECT pg_advisory_unlock(hashtext(%s))", (key,))
            return ""
        return "kumiko's admission lock for (guardapp.victim, t2) is held by another session"
    if effect is Effect.TERMINATED:
        from .attacks_base import VICTIM_APP

        n = o.value(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
            (f"{VICTIM_APP}_{mark}",),
        )
        return "" if n else "the victim session was terminated"
    if effect is Effect.STATS:
        return _stats_evidence(o, mark, run_id)
    if effect is Effect.VICTIM:
        rows = o.rows("SELECT value FROM t2.guardapp_finding WHERE key = %s", (mark,))
        return "" if rows == [("victim",)] else f"the next t2 run's write is missing ({rows})"
    raise AssertionError(f"unknown effect {effect}")


def _stats_evidence(o: Observer, mark: str, run_id: str) -> str:
    """t2's table's row count, pages or sizes written after ``{mark}=`` in what the run shows."""
    numbers = o.rows(
        f"SELECT reltuples::bigint, relpages, relallvisible, pg_relation_size(c.oid), "
        f"pg_total_relation_size(c.oid) FROM pg_class c WHERE c.oid = 't2.{mark}_tab'::regclass"
    )[0]
    wanted = {str(n) for n in numbers if n}
    for text in leak_texts(o, run_id, mark):
        for after in text.split(f"{mark}=")[1:]:
            found = wanted.intersection(re.findall(r"(?<![\w.])(\d+)(?:\.0)?(?![\w.])", after))
            if found:
                return f"t2's {mark}_tab numbers {sorted(found)} in {after[:200]!r}"
    return ""


def snapshot_outside_marks(observer: Observer) -> dict[str, Any]:
    """What no strategy may change with the guard on, its own victims aside (read through the
    second connection): t2's rows and the canary, shared plans, tenants, schemas, t2's tables."""
    from .attacks_base import CANARY

    o = observer
    return {
        "t2": o.rows(
            "SELECT id, label, value FROM t2.guardapp_secret WHERE label NOT LIKE 'gx%' "
            "AND label <> 'canary' ORDER BY id"
        ),
        "canary": o.rows("SELECT value FROM t2.guardapp_secret WHERE label = 'canary'")
        in ([], [(CANARY,)]),
        "plans": o.rows(
            "SELECT id, name, monthly_price FROM public.catalog_plan "
            "WHERE name NOT LIKE 'gx%' ORDER BY id"
        ),
        "tenants": o.rows("SELECT id, schema_name, name FROM customers_client ORDER BY id"),
        "schemata": o.rows(
            "SELECT nspname FROM pg_namespace WHERE nspname NOT LIKE 'pg_temp%' "
            "AND nspname NOT LIKE 'pg_toast_temp%' ORDER BY 1"
        ),
        "t2_tables": o.rows(
            "SELECT table_name, column_name FROM information_schema.columns "
            "WHERE table_schema = 't2' AND table_name NOT LIKE 'gx%' ORDER BY 1, 2"
        ),
    }


def discard_worker_connections() -> None:
    """Close Django's connections whatever a run left on them (the in-process worker shares
    them with the test): an open transaction, an ``atomic()`` never left, session settings."""
    for conn in connections.all(initialized_only=True):
        if conn.in_atomic_block:
            # Forget the abandoned atomic() blocks, or close() keeps a dead connection around.
            conn.in_atomic_block = False
            conn.atomic_blocks = []
            conn.savepoint_ids = []
            conn.needs_rollback = False
            conn.closed_in_transaction = False
        conn.close()
    from kumiko_jobs.guard.roles import connections as tenant_connections

    tenant_connections.close_all()  # the tenant roles' connections (DB_ROLES)


@contextlib.contextmanager
def second_connection() -> Iterator[psycopg.Connection[Any]]:
    """A psycopg connection of the test's own to the test database, from the test settings
    (autocommit): another session than Django's and the in-process worker's, so it sees and
    leaves committed data only."""
    import psycopg

    s = connection.settings_dict
    with psycopg.connect(
        dbname=s["NAME"],
        user=s["USER"],
        password=s["PASSWORD"],
        host=s["HOST"] or None,
        port=s["PORT"] or None,
        autocommit=True,
    ) as conn:
        yield conn


def observed(query: str, params: Any = None) -> list[tuple[Any, ...]]:
    """Rows as a second, independent connection sees them (committed data only)."""
    with second_connection() as conn:
        return list(conn.execute(query, params).fetchall())


def run_for(tenant: Any, job: Any, mode: dict[str, Any], **kwargs: Any) -> Any:
    """Enqueue ``job`` in ``tenant`` under the settings ``mode``, work the queue in process, and
    return the run's row (back in public)."""
    from django.test import override_settings
    from django_tenants.utils import tenant_context

    from kumiko_jobs.models import JobRun
    from tests.conftest import work

    with override_settings(KUMIKO_JOBS=mode):
        with tenant_context(tenant):
            handle = job.enqueue(**kwargs)
        work()
    connection.set_schema_to_public()
    return JobRun.objects.get(pk=handle.run_id)
