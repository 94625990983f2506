"""Attack strategies of issue 22: the operators' copies in public, and catalog columns that
hand out another tenant's row counts, sizes or code.

* **The operators' tables** (class 8): django.contrib.auth, sessions and admin are in both
  SHARED_APPS and TENANT_APPS, so every tenant has its own ``django_session``, and
  ``public.django_session`` holds the *operators'* sessions (a session key opens the operators'
  admin). ``support.plant`` puts the canary into the public copies (a session key, a password
  hash, an admin log entry); a strategy that shows it read them.
* **Catalog values** (class 3): ``pg_class.reltuples``/``relpages`` give the size of every
  tenant's tables (effect ``STATS``: t2's planted table of ``STATS_ROWS`` rows, its numbers
  after ``{mark}=`` in the run's output), ``pg_proc.prosrc``, ``pg_views.definition`` and friends
  the literals of t2's functions, views and rules (effect ``LEAK``: the canary is in them).
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.sessions.models import Session
from django.db import connection
from django.db.models.expressions import RawSQL

from .attacks_base import Class, Effect, Strategy, log_rows
from .models import Secret

L, S = Effect.LEAK, Effect.STATS
# t2's planted table for a STATS strategy: "{mark}_tab" with this many rows, vacuumed and
# analysed, so that pg_class holds its true size.
TAB = "'{mark}_tab'"
# pg_class's first eleven columns, renamed by a column alias list (reltuples is the 11th).
PG_CLASS_RENAMED = "pg_class AS c(o, n, ns, ty, oft, ow, am, fn, ts, p, t)"

_ROWS: list[tuple[str, Class, Effect, str]] = [
    # --- 8. the operators' copies in public ------------------------------------------------
    ("public_session_key", Class.PUBLIC, L, "SELECT session_key FROM public.django_session"),
    (
        "public_session_quoted",
        Class.PUBLIC,
        L,
        'SELECT "session_key" FROM "public"."django_session"',
    ),
    ("public_user_password", Class.PUBLIC, L, "SELECT username, password FROM public.auth_user"),
    ("public_admin_log", Class.PUBLIC, L, "SELECT object_repr FROM public.django_admin_log"),
    ("public_session_table", Class.PUBLIC, L, "TABLE public.django_session"),
    (
        "public_session_join_own",
        Class.PUBLIC,
        L,
        "SELECT s.session_key FROM guardapp_secret g CROSS JOIN public.django_session s",
    ),
    (
        "public_session_subquery",
        Class.PUBLIC,
        L,
        "SELECT (SELECT string_agg(session_key, ',') FROM public.django_session)",
    ),
    (
        "public_session_cte",
        Class.PUBLIC,
        L,
        "WITH s AS (SELECT session_key FROM public.django_session) SELECT * FROM s",
    ),
    (
        "public_session_into_own",
        Class.PUBLIC,
        L,
        "INSERT INTO guardapp_finding (key, value) "
        "SELECT '{mark}', session_key FROM public.django_session",
    ),
    # --- 3. catalog columns with another tenant's code -----------------------------------
    ("pg_proc_prosrc", Class.CATALOG, L, "SELECT prosrc FROM pg_proc WHERE proname = 'gx_const'"),
    ("pg_proc_star", Class.CATALOG, L, "SELECT * FROM pg_proc WHERE proname = 'gx_const'"),
    (
        "pg_proc_whole_row",
        Class.CATALOG,
        L,
        "SELECT p::text FROM pg_catalog.pg_proc p WHERE p.proname = 'gx_const'",
    ),
    (
        "pg_proc_to_jsonb",
        Class.CATALOG,
        L,
        "SELECT to_jsonb(p) ->> 'prosrc' FROM pg_proc p WHERE proname = 'gx_const'",
    ),
    (
        "pg_views_definition",
        Class.CATALOG,
        L,
        "SELECT definition FROM pg_views WHERE viewname = 'gx_view'",
    ),
    (
        "pg_views_star",
        Class.CATALOG,
        L,
        "SELECT * FROM pg_catalog.pg_views WHERE viewname = 'gx_view'",
    ),
    (
        "pg_matviews_definition",
        Class.CATALOG,
        L,
        "SELECT definition FROM pg_matviews WHERE matviewname = 'gx_matview'",
    ),
    (
        "pg_rules_definition",
        Class.CATALOG,
        L,
        "SELECT definition FROM pg_rules WHERE rulename = 'gx_rule'",
    ),
    (
        "pg_rewrite_ev_qual",
        Class.CATALOG,
        L,
        "SELECT pg_get_expr(ev_qual, ev_class) FROM pg_rewrite WHERE rulename = 'gx_rule'",
    ),
    (
        "pg_get_ruledef",
        Class.CATALOG,
        L,
        "SELECT pg_get_ruledef(oid) FROM pg_rewrite WHERE rulename = 'gx_rule'",
    ),
    (
        "information_schema_routines",
        Class.CATALOG,
        L,
        "SELECT routine_definition FROM information_schema.routines "
        "WHERE routine_name = 'gx_const'",
    ),
    (
        "information_schema_views",
        Class.CATALOG,
        L,
        "SELECT view_definition FROM information_schema.views WHERE table_name = 'gx_view'",
    ),
    # --- 3. catalog columns with another tenant's row counts and sizes -------------------
    (
        "pg_class_reltuples",
        Class.CATALOG,
        S,
        f"SELECT '{{mark}}=' || reltuples::bigint FROM pg_class WHERE relname = {TAB}",
    ),
    (
        "pg_class_relpages",
        Class.CATALOG,
        S,
        f"SELECT '{{mark}}=' || relpages FROM pg_catalog.pg_class WHERE relname = {TAB}",
    ),
    (
        "pg_class_relallvisible",
        Class.CATALOG,
        S,
        f"SELECT '{{mark}}=' || relallvisible FROM pg_class WHERE relname = {TAB}",
    ),
    (
        "pg_class_whole_row",
        Class.CATALOG,
        S,
        f"SELECT '{{mark}}=' || c::text FROM pg_class c WHERE c.relname = {TAB}",
    ),
    (
        "pg_class_star",
        Class.CATALOG,
        S,
        f"SELECT '{{mark}}=', * FROM pg_class WHERE relname = {TAB}",
    ),
    (
        "pg_class_tablesample_star",
        Class.CATALOG,
        S,
        f"SELECT '{{mark}}=', * FROM pg_class TABLESAMPLE SYSTEM (100) WHERE relname = {TAB}",
    ),
    (
        "pg_class_join_alias_star",
        Class.CATALOG,
        S,
        "SELECT '{mark}=', j.* FROM (pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace) "
        f"AS j WHERE j.relname = {TAB}",
    ),
    (
        "pg_class_column_aliases",
        Class.CATALOG,
        S,
        f"SELECT '{{mark}}=' || t::bigint FROM {PG_CLASS_RENAMED} WHERE n = {TAB}",
    ),
    (
        "pg_class_field_selection",
        Class.CATALOG,
        S,
        f"SELECT '{{mark}}=' || (c).reltuples::bigint FROM pg_class c WHERE relname = {TAB}",
    ),
    (
        "pg_relation_size",
        Class.CATALOG,
        S,
        f"SELECT '{{mark}}=' || pg_relation_size(oid) FROM pg_class WHERE relname = {TAB}",
    ),
    (
        "pg_total_relation_size",
        Class.CATALOG,
        S,
        f"SELECT '{{mark}}=' || pg_total_relation_size(oid) FROM pg_class WHERE relname = {TAB}",
    ),
]


# --- routes: the ORM reaching the operators' copies ----------------------------------------


def orm_raw_public_users(ctx: Any, mark: str) -> None:
    users = get_user_model().objects.raw("SELECT * FROM public.auth_user")
    log_rows(ctx, [(u.username, u.password) for u in users])


def orm_rawsql_public_session(ctx: Any, mark: str) -> None:
    # Every key, not max(): other tests' logins leave keys that sort after the canary's.
    leak = RawSQL("SELECT string_agg(session_key, ',') FROM public.django_session", ())
    log_rows(ctx, list(Secret.objects.annotate(leak=leak).values_list("label", "leak")))


def public_schema_then_sessions(ctx: Any, mark: str) -> None:
    # django-tenants' own switch: unqualified names then mean public's copy.
    connection.set_schema_to_public()  # type: ignore[attr-defined]
    log_rows(ctx, list(Session.objects.values_list("session_key")))


_CALLABLES = [orm_raw_public_users, orm_rawsql_public_session, public_schema_then_sessions]

PUBLIC_STRATEGIES: list[Strategy] = [
    *(Strategy(name=name, cls=cls, effect=effect, sql=sql) for name, cls, effect, sql in _ROWS),
    *(Strategy(name=f.__name__, cls=Class.PUBLIC, effect=L, perform=f) for f in _CALLABLES),
]
