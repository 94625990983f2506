"""Helpers of the guard suites: seed data, a snapshot of everything an attack could touch."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import Any

from django.db import connection, connections

from tests.conftest import TENANTS

from .jobs import EXTRA_ALIAS

GUARD_TABLES = ("guardapp_secret", "guardapp_person", "guardapp_finding")
PLANS = (("basic", "10.00"), ("pro", "25.00"))


def refuse_unless_test_database() -> None:
    name = str(connection.settings_dict["NAME"])
    if not name.startswith("test_"):
        raise RuntimeError(
            f"refusing to run against {name!r}: not a test database (pytest-django creates one "
            "only when a test of the session is marked django_db)"
        )


def seed() -> None:
    """Fresh guardapp tables in every tenant (one secret each) and two shared plans."""
    from kumiko_jobs import audit

    refuse_unless_test_database()

    audit._last_reported.clear()
    connection.set_schema_to_public()  # type: ignore[attr-defined]
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE kumiko_jobs_escapehatchuse, catalog_plan RESTART IDENTITY")
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
    from kumiko_jobs import audit

    audit._last_reported.clear()
    connection.set_schema_to_public()  # type: ignore[attr-defined]
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE kumiko_jobs_escapehatchuse, catalog_plan RESTART IDENTITY")
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
