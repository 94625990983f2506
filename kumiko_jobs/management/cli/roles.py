"""The tenants' database roles (``DB_ROLES``, docs/guard.md "Two walls"): ``roles`` creates or
repairs them, ``drop-roles`` removes those of this database or of a dropped one."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connections

from ...guard.roles import names as role_names
from ...guard.roles import privileges as role_grants
from ...guard.roles import sync as role_sync
from .common import Subcommand


def _roles_arguments(parser: CommandParser) -> None:
    parser.add_argument(
        "--check", action="store_true", help="only list tenants whose role is out of date"
    )


def _roles(command: BaseCommand, options: dict[str, Any]) -> None:
    if options["check"]:
        stale = role_sync.out_of_date()
        for name in stale:
            command.stdout.write(f"out of date: {name}")
        if stale:
            raise CommandError(f"{len(stale)} tenant role(s) out of date")
        command.stdout.write("every tenant role is up to date")
        return
    result = role_sync.sync_all()
    command.stdout.write(
        f"ensured {len(result.ensured)} tenant role(s), dropped {len(result.dropped)} "
        f"of deleted tenants ({', '.join(result.dropped) or '-'}); skipped tenants without "
        f"a schema: {', '.join(result.skipped) or '-'}"
    )


def _drop_roles_arguments(parser: CommandParser) -> None:
    parser.add_argument("--yes", action="store_true", help="drop them (without it: only list)")
    parser.add_argument(
        "--of-dropped-database",
        metavar="NAME",
        help="the roles of a database that no longer exists (dropdb leaves its roles behind)",
    )


def _run_drop_roles(command: BaseCommand, options: dict[str, Any]) -> None:
    _drop_roles(command, options["yes"], options["of_dropped_database"])


def _drop_roles(command: BaseCommand, yes: bool, dropped_database: str | None) -> None:
    """Roles are cluster-wide: ``dropdb`` leaves them behind. Only the roles of one database's
    prefix (``guard.roles.names``) are touched, never another database's or anyone else's."""
    if dropped_database is None:
        with connections["default"].cursor() as cursor:
            roles = role_grants.our_roles(cursor)
            groups = [role_names.group_name(), role_names.writers_group_name()]
            roles += [g for g in groups if _role_exists(cursor, g)]
        where = f"database {connections['default'].settings_dict['NAME']!r}"
    else:
        with connections["default"]._nodb_cursor() as cursor:  # the server's maintenance db
            cursor.execute("SELECT 1 FROM pg_database WHERE datname = %s", [dropped_database])
            if cursor.fetchone():
                raise CommandError(
                    f"database {dropped_database!r} exists: its roles hold grants there. Run "
                    "`manage.py kumiko_jobs drop-roles` with DATABASES pointing at it instead."
                )
            cursor.execute(
                "SELECT rolname FROM pg_roles WHERE rolname LIKE %s ORDER BY rolname",
                [role_names.prefix_of(dropped_database) + r"\_%"],
            )
            roles = [row[0] for row in cursor.fetchall()]
        where = f"dropped database {dropped_database!r}"
    if not roles:
        command.stdout.write(f"no kumiko roles of {where}")
        return
    if not yes:
        for role in roles:
            command.stdout.write(f"would drop: {role}")
        raise CommandError(
            f"{len(roles)} role(s) of {where} listed, none dropped: pass --yes to drop them "
            "(tenant runs under DB_ROLES then fail to log in until `kumiko_jobs roles`)."
        )
    if dropped_database is None:
        dropped = role_sync.drop_all()
        gone = [*dropped, *(r for r in roles if r not in dropped)]
    else:
        with connections["default"]._nodb_cursor() as cursor:
            gone = role_names.drop_roles_of_dropped_database(cursor, dropped_database)
    command.stdout.write(f"dropped {len(gone)} role(s) of {where}: {', '.join(sorted(gone))}")


def _role_exists(cursor: Any, role: str) -> bool:
    cursor.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [role])
    return cursor.fetchone() is not None


ROLES = Subcommand(
    "roles",
    "create or repair every tenant's database role and grants, drop roles of "
    "deleted tenants, give every role its current password (idempotent, DB_ROLES)",
    _roles,
    _roles_arguments,
)
DROP_ROLES = Subcommand(
    "drop-roles",
    "drop the database roles kumiko created for this database (DB_ROLES), or for one "
    "that was dropped; lists them unless --yes",
    _run_drop_roles,
    _drop_roles_arguments,
)
