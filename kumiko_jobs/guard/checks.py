"""System checks of the guard's second wall (``DB_ROLES``) and of the poolers it meets: a
transaction pooler, ``DB_ROLES`` off in production, tenant roles missing or out of date, a
superuser as the project's database user. Registered at import (``kumiko_jobs.checks``
imports this module at start-up); docs/guard.md, "Two walls" and "Poolers"."""

from __future__ import annotations

from typing import Any

from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections, transaction

from ..core import conf, project_settings
from .roles import sync as role_sync


@checks.register(checks.Tags.security)
def check_db_roles(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """The database guard's posture: a transaction pooler (unsafe without ``DB_ROLES``, fragile with
    it) and ``DB_ROLES`` off in production, where isolation would rest on the guard's classifier
    alone.
    """
    try:
        settings = conf.get()
    except ImproperlyConfigured:
        return []  # E001 says so
    found: list[checks.CheckMessage] = []
    if settings.DB_POOLER == "transaction":
        if not settings.DB_ROLES:
            found.append(
                checks.Error(
                    "KUMIKO_JOBS['DB_POOLER'] is 'transaction' without DB_ROLES: the pooler "
                    "hands one server session to many clients, so a search path or setting a "
                    "run left in its session reaches the statements of another tenant's run.",
                    hint="Point the workers at PostgreSQL directly or through session pooling, "
                    "or turn DB_ROLES on (docs/guard.md, 'Poolers').",
                    id="kumiko_jobs.E013",
                )
            )
        else:
            found.append(
                checks.Warning(
                    "KUMIKO_JOBS['DB_POOLER'] is 'transaction': tenant isolation holds (the "
                    "pooler keeps a pool per login role), but django-tenants' search path and "
                    "kumiko's session reset are per session and may land on another one.",
                    hint="Use session pooling for workers (docs/guard.md, 'Poolers').",
                    id="kumiko_jobs.W004",
                )
            )
            if settings.HISTORY_PREPARED_STATEMENTS:
                found.append(
                    checks.Warning(
                        "KUMIKO_JOBS['DB_POOLER'] is 'transaction' and "
                        "HISTORY_PREPARED_STATEMENTS is on: every run's start and finish are "
                        "prepared statements on the project's connection, which the pooler "
                        "must keep per client.",
                        hint="Use PgBouncer 1.22 or later with max_prepared_statements above 0 "
                        "(then silence this check), or set KUMIKO_JOBS["
                        "'HISTORY_PREPARED_STATEMENTS'] = False (docs/settings.md).",
                        id="kumiko_jobs.W009",
                    )
                )
    if not settings.DB_ROLES:
        if project_settings.debug() or settings.DB_GUARD == "off":
            return found
        found.append(
            checks.Warning(
                "KUMIKO_JOBS['DB_ROLES'] is off: tenant isolation rests on the DB guard's "
                "classifier alone; job bodies run as the project's database user.",
                hint="Follow docs/guard.md ('Two walls', set-up) and set "
                "KUMIKO_JOBS['DB_ROLES'] = True.",
                id="kumiko_jobs.W005",
            )
        )
    return found


@checks.register(checks.Tags.database)
def check_db_roles_in_step(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """Tenants whose role is missing or lacks a grant (one catalog query; ``--database``)."""
    if not databases or "default" not in databases:
        return []
    try:
        if not conf.get().DB_ROLES:
            return []
    except ImproperlyConfigured:
        return []

    try:
        # In a savepoint, so that a failed statement leaves no caller's transaction aborted.
        with transaction.atomic(using=DEFAULT_DB_ALIAS):
            stale = role_sync.out_of_date()  # no tenant table yet (not migrated): []
    except DatabaseError as exc:
        # Say what can be said and let the command go on: `migrate` runs this check first.
        return [
            checks.Warning(
                f"Could not read the tenants' database roles: {exc}".strip(),
                hint="Run `manage.py migrate_schemas --shared` and `manage.py kumiko_jobs roles`.",
                id="kumiko_jobs.W008",
            )
        ]
    if not stale:
        return []
    shown = ", ".join(stale[:10]) + (f" and {len(stale) - 10} more" if len(stale) > 10 else "")
    return [
        checks.Error(
            f"{len(stale)} tenant database role(s) missing or out of date: {shown}. Their "
            "runs would fail with 'permission denied' or a failed login.",
            hint="Run `manage.py kumiko_jobs roles` (safe on every deploy).",
            id="kumiko_jobs.E012",
        )
    ]


@checks.register(checks.Tags.security, checks.Tags.database)
def check_project_user_not_superuser(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """``DB_ROLES`` with a superuser as the project user (``--database``, as E012).

    docs/guard.md ("Two walls", set-up) forbids it: a superuser passes every privilege check,
    so a job body that reaches the project's connection (``ctx.system_db()``, a connection
    opened by hand) holds every tenant's data and the server's files, and the tenant roles it
    creates are all the wall there is.
    """
    if not databases or "default" not in databases:
        return []
    try:
        if not conf.get().DB_ROLES:
            return []
    except ImproperlyConfigured:
        return []  # E001 says why
    try:
        with connections["default"].cursor() as cursor:
            # current_user: the identity that holds the privileges (after "assume_role")
            cursor.execute(
                "SELECT current_user, rolsuper FROM pg_roles WHERE rolname = current_user"
            )
            row = cursor.fetchone()
    except DatabaseError:
        return []  # no database to ask: Django's own checks and E012 report it
    if row is None or not row[1]:
        return []
    return [
        checks.Warning(
            f"KUMIKO_JOBS['DB_ROLES'] is on and the project's database user {row[0]!r} is a "
            "superuser: it passes every privilege check, so whatever a job reaches with the "
            "project's credentials is outside the second wall.",
            hint="Connect as a user with LOGIN and CREATEROLE that owns the database, not a "
            "superuser (docs/guard.md, 'Two walls', set-up).",
            id="kumiko_jobs.W007",
        )
    ]
