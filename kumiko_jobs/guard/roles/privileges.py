"""Creating, granting and dropping the tenants' PostgreSQL roles: the second wall's privileges.

The job body of a tenant run logs in as its tenant's role (``guard.roles.connections``), so that
PostgreSQL itself refuses what the classifier might let through: another tenant's schema,
writes to shared tables, kumiko's history (docs/guard.md, "Two walls"). This module owns what
each role may do: the group's reads of the shared tables, the tenant's rows in its own schema,
the reader's and writer's escape-hatch logins, and the one door to kumiko's history (the atomic
runs' success function). Every statement is idempotent (create or repair) and names roles and
schemas through ``psycopg.sql.Identifier``. When to run them (every tenant, on deploy, on a
tenant's creation or deletion) is ``guard.roles.sync``'s business.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.apps import apps
from django.db import DEFAULT_DB_ALIAS
from psycopg import sql

from ...core import project_settings
from ...core.db import ATOMIC_FUNCTION, ATOMIC_SIGNATURE
from ..tables import operator_record_tables, operator_tables, protected_tables, shared_tables
from .names import (
    READER_SUFFIX,
    WRITER_SUFFIX,
    group_name,
    prefix,
    role_name,
    scram_verifier,
    writers_group_name,
)

TABLE_PRIVILEGES = ("SELECT", "INSERT", "UPDATE", "DELETE")
SEQUENCE_PRIVILEGES = ("USAGE", "SELECT", "UPDATE")
# What a tenant role never holds on its own tables and schema, even if someone granted it.
REVOKED_TABLE_PRIVILEGES = ("TRUNCATE", "REFERENCES", "TRIGGER")


def readable_shared_tables() -> frozenset[str]:
    """Shared tables a tenant role may read: the classifier's shared tables without kumiko's
    own (every tenant's runs, arguments, errors and logs: no tenant reads them, which the
    classifier alone allows), nor the operators' records shared by every tenant (sessions, the
    admin's log: ``operator_record_tables``). The tenant and domain tables stay readable: a job
    names another tenant through them (``ctx.cross_tenant_reads(Client.objects.get(...))``)."""
    kumiko = apps.get_app_config("kumiko_jobs").get_models(include_auto_created=True)
    own = {model._meta.db_table for model in kumiko}
    return shared_tables() - own - operator_record_tables()


def _ident(*names: str) -> sql.Identifier:
    return sql.Identifier(*names)


def _privileges(names: Sequence[str]) -> sql.Composed:
    return sql.SQL(", ").join(sql.SQL(p) for p in names)  # fixed keywords, never input


def _exists(cursor: Any, role: str) -> bool:
    cursor.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [role])
    return cursor.fetchone() is not None


def _execute(cursor: Any, statement: sql.Composable) -> None:
    cursor.execute(statement.as_string(cursor.connection))


def ensure_group(cursor: Any, alias: str = DEFAULT_DB_ALIAS) -> str:
    """The group role and its read access to the shared tables (once, for every tenant)."""
    group = group_name(alias)
    if not _exists(cursor, group):
        _execute(cursor, sql.SQL("CREATE ROLE {} NOLOGIN").format(_ident(group)))
    public = project_settings.public_schema_name()
    _execute(
        cursor, sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(_ident(public), _ident(group))
    )
    cursor.execute(
        "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = %s AND c.relkind IN ('r', 'p', 'v', 'm', 'f')",
        [public],
    )
    existing = {row[0] for row in cursor.fetchall()}
    readable = readable_shared_tables()
    never = operator_tables() | operator_record_tables()
    _revoke_operator_tables(cursor, alias, public, sorted(existing & never))
    for table in sorted(existing):
        target = _ident(public, table)
        if table in readable:
            _execute(cursor, sql.SQL("GRANT SELECT ON {} TO {}").format(target, _ident(group)))
        if table in readable or table in protected_tables():
            # Repair: no write on shared tables, nothing at all on protected ones.
            revoked: tuple[str, ...] = (
                "INSERT",
                "UPDATE",
                "DELETE",
                "TRUNCATE",
                "REFERENCES",
                "TRIGGER",
            )
            if table not in readable:
                revoked = ("SELECT", *revoked)
            _execute(
                cursor,
                sql.SQL("REVOKE {} ON {} FROM {}").format(
                    _privileges(revoked), target, _ident(group)
                ),
            )
    _grant_atomic_success(cursor, public, group)
    # Never the protected ones: the tenant and domain tables are readable, not writable.
    protected = existing & protected_tables()
    _ensure_writers(cursor, alias, public, (existing & readable) - protected, protected)
    return group


def _revoke_operator_tables(cursor: Any, alias: str, public: str, tables: list[str]) -> None:
    """The operators' own copies in public (apps in SHARED_APPS and TENANT_APPS: sessions,
    users, admin log; every tenant has its own): repair whatever was granted on them by hand to
    the group, the shared writers or PUBLIC, of which every tenant role is a member (issue 22).
    One statement for all of them: this runs on every tenant's creation and migration."""
    if not tables:
        return
    holders = [
        _ident(role)
        for role in (group_name(alias), writers_group_name(alias))
        if _exists(cursor, role)
    ]
    everyone = sql.SQL(", ").join([*holders, sql.SQL("PUBLIC")])
    _execute(
        cursor,
        sql.SQL("REVOKE ALL ON {} FROM {}").format(
            sql.SQL(", ").join(_ident(public, table) for table in tables), everyone
        ),
    )
    # Their id sequences too: a release that counted a table as writable shared granted the
    # writers USAGE on its sequence, which a setval() would rewind (the admin log's: every
    # later admin save a duplicate key).
    cursor.execute(
        "SELECT s.relname FROM pg_class s JOIN pg_depend d ON d.objid = s.oid "
        "JOIN pg_class t ON t.oid = d.refobjid JOIN pg_namespace n ON n.oid = s.relnamespace "
        "WHERE s.relkind = 'S' AND d.deptype IN ('a', 'i') AND n.nspname = %s "
        "AND t.relname = ANY(%s)",
        [public, tables],
    )
    sequences = [_ident(public, name) for (name,) in cursor.fetchall()]
    if sequences:
        _execute(
            cursor,
            sql.SQL("REVOKE ALL ON SEQUENCE {} FROM {}").format(
                sql.SQL(", ").join(sequences), everyone
            ),
        )


def _grant_atomic_success(cursor: Any, public: str, group: str) -> None:
    """The one door a tenant login has to kumiko's history: the SECURITY DEFINER function an
    atomic run records its success with, in its own transaction (migration 0011, which checks
    that the run is one of the caller's schema). Skipped until that migration ran."""
    cursor.execute("SELECT to_regprocedure(%s)", [f"{public}.{ATOMIC_FUNCTION}{ATOMIC_SIGNATURE}"])
    if cursor.fetchone()[0] is None:
        return
    _execute(
        cursor,
        sql.SQL("GRANT EXECUTE ON FUNCTION {}{} TO {}").format(
            _ident(public, ATOMIC_FUNCTION), sql.SQL(ATOMIC_SIGNATURE), _ident(group)
        ),
    )


def _ensure_writers(
    cursor: Any, alias: str, public: str, writable: set[str], protected: set[str]
) -> None:
    """The shared writers' group: INSERT/UPDATE/DELETE on the shared tables ``global_writes``
    may write, and their sequences; no TRUNCATE, nothing on protected or tenant tables."""
    writers = _ident(writers_group_name(alias))
    if not _exists(cursor, writers_group_name(alias)):
        _execute(cursor, sql.SQL("CREATE ROLE {} NOLOGIN").format(writers))
    _execute(cursor, sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(_ident(public), writers))
    for table in sorted(protected):  # repair: whatever was granted by hand
        _execute(
            cursor,
            sql.SQL("REVOKE ALL ON {} FROM {}").format(_ident(public, table), writers),
        )
    for table in sorted(writable):
        _execute(
            cursor,
            sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON {} TO {}").format(
                _ident(public, table), writers
            ),
        )
    cursor.execute(
        "SELECT s.relname FROM pg_class s JOIN pg_depend d ON d.objid = s.oid "
        "JOIN pg_class t ON t.oid = d.refobjid JOIN pg_namespace n ON n.oid = s.relnamespace "
        "WHERE s.relkind = 'S' AND d.deptype IN ('a', 'i') AND n.nspname = %s "
        "AND t.relname = ANY(%s)",
        [public, sorted(writable)],
    )
    for (sequence,) in cursor.fetchall():
        _execute(
            cursor,
            sql.SQL("GRANT USAGE, SELECT, UPDATE ON SEQUENCE {} TO {}").format(
                _ident(public, sequence), writers
            ),
        )


def ensure_tenant_role(
    cursor: Any, tenant_pk: Any, schema: str, alias: str = DEFAULT_DB_ALIAS
) -> str:
    """Create or repair one tenant's role: login with its derived password, member of the
    group, USAGE on its schema, row privileges on its tables and sequences (existing ones and,
    through default privileges, those the project user creates later). Idempotent."""
    if schema == project_settings.public_schema_name():
        raise ValueError("the public schema's tenant has no role: its runs are system runs")
    role = role_name(tenant_pk, alias)
    who = _ident(role)
    verifier = sql.Literal(scram_verifier(role))
    if _exists(cursor, role):
        _execute(cursor, sql.SQL("ALTER ROLE {} LOGIN INHERIT PASSWORD {}").format(who, verifier))
        # A role may give itself session defaults (ALTER ROLE CURRENT_USER SET ...), which
        # outlive every session reset; they apply to its runs and to cross_tenant_reads of it.
        _execute(cursor, sql.SQL("ALTER ROLE {} RESET ALL").format(who))
    else:
        _execute(cursor, sql.SQL("CREATE ROLE {} LOGIN INHERIT PASSWORD {}").format(who, verifier))
    _execute(cursor, sql.SQL("GRANT {} TO {}").format(_ident(group_name(alias)), who))
    where = _ident(schema)
    table, sequence = _privileges(TABLE_PRIVILEGES), _privileges(SEQUENCE_PRIVILEGES)
    statements = [
        sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(where, who),
        sql.SQL("REVOKE CREATE ON SCHEMA {} FROM {}").format(where, who),
        sql.SQL("GRANT {} ON ALL TABLES IN SCHEMA {} TO {}").format(table, where, who),
        sql.SQL("REVOKE {} ON ALL TABLES IN SCHEMA {} FROM {}").format(
            _privileges(REVOKED_TABLE_PRIVILEGES), where, who
        ),
        sql.SQL("GRANT {} ON ALL SEQUENCES IN SCHEMA {} TO {}").format(sequence, where, who),
        # Tables a later migration creates (as the project user) are granted at once; the
        # schema_migrated hook and the command grant again anyway (default privileges apply
        # only to objects created by the role that ran this statement).
        sql.SQL("ALTER DEFAULT PRIVILEGES IN SCHEMA {} GRANT {} ON TABLES TO {}").format(
            where, table, who
        ),
        sql.SQL("ALTER DEFAULT PRIVILEGES IN SCHEMA {} GRANT {} ON SEQUENCES TO {}").format(
            where, sequence, who
        ),
    ]
    for statement in statements:
        _execute(cursor, statement)
    _ensure_reader(cursor, role + READER_SUFFIX, schema, alias)
    _ensure_login(cursor, role + WRITER_SUFFIX)
    writer = _ident(role + WRITER_SUFFIX)
    _execute(cursor, sql.SQL("GRANT {} TO {}").format(who, writer))
    _execute(cursor, sql.SQL("GRANT {} TO {}").format(_ident(writers_group_name(alias)), writer))
    return role


def _ensure_login(cursor: Any, role: str) -> None:
    who, verifier = _ident(role), sql.Literal(scram_verifier(role))
    verb = "ALTER" if _exists(cursor, role) else "CREATE"
    _execute(cursor, sql.SQL(verb + " ROLE {} LOGIN INHERIT PASSWORD {}").format(who, verifier))
    if verb == "ALTER":
        _execute(cursor, sql.SQL("ALTER ROLE {} RESET ALL").format(who))


def _ensure_reader(cursor: Any, reader: str, schema: str, alias: str) -> None:
    """SELECT on the tenant's tables and sequences (existing and future), the shared reads of
    the group, and not one write privilege: PostgreSQL itself keeps ``cross_tenant_reads``
    to reads, whatever transaction the block's code ends."""
    _ensure_login(cursor, reader)
    who, where = _ident(reader), _ident(schema)
    _execute(cursor, sql.SQL("GRANT {} TO {}").format(_ident(group_name(alias)), who))
    for statement in (
        "GRANT USAGE ON SCHEMA {0} TO {1}",
        "REVOKE CREATE ON SCHEMA {0} FROM {1}",
        "GRANT SELECT ON ALL TABLES IN SCHEMA {0} TO {1}",
        "REVOKE INSERT, UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER "
        "ON ALL TABLES IN SCHEMA {0} FROM {1}",
        "GRANT SELECT ON ALL SEQUENCES IN SCHEMA {0} TO {1}",
        "REVOKE USAGE, UPDATE ON ALL SEQUENCES IN SCHEMA {0} FROM {1}",
        "ALTER DEFAULT PRIVILEGES IN SCHEMA {0} GRANT SELECT ON TABLES TO {1}",
        "ALTER DEFAULT PRIVILEGES IN SCHEMA {0} GRANT SELECT ON SEQUENCES TO {1}",
    ):
        _execute(cursor, sql.SQL(statement).format(where, who))


def drop_role(cursor: Any, role: str) -> bool:
    """Revoke what ``role`` holds in this database, then drop it.

    Not ``DROP OWNED BY``: that needs membership in the role, which a CREATEROLE project user
    does not have (docs/guard.md, "Two walls"). A tenant role owns nothing; it holds grants on
    schemas, tables and sequences, and default privileges, all given by the project user, who
    may therefore revoke them. Its group membership goes with it.
    """
    if not _exists(cursor, role):
        return False
    cursor.execute(
        "SELECT n.nspname FROM pg_namespace n, aclexplode(n.nspacl) a "
        "WHERE a.grantee = %s::regrole "
        "UNION SELECT n.nspname FROM pg_default_acl d "
        "JOIN pg_namespace n ON n.oid = d.defaclnamespace, aclexplode(d.defaclacl) a "
        "WHERE a.grantee = %s::regrole",
        [role, role],
    )
    who = _ident(role)
    for (schema,) in cursor.fetchall():
        where = _ident(schema)
        for statement in (
            "REVOKE ALL ON ALL TABLES IN SCHEMA {} FROM {}",
            "REVOKE ALL ON ALL SEQUENCES IN SCHEMA {} FROM {}",
            "REVOKE ALL ON SCHEMA {} FROM {}",
            "ALTER DEFAULT PRIVILEGES IN SCHEMA {} REVOKE ALL ON TABLES FROM {}",
            "ALTER DEFAULT PRIVILEGES IN SCHEMA {} REVOKE ALL ON SEQUENCES FROM {}",
        ):
            _execute(cursor, sql.SQL(statement).format(where, who))
    # Functions: the group's EXECUTE on the atomic runs' success function (migration 0011).
    cursor.execute(
        "SELECT p.oid::regprocedure::text FROM pg_proc p, aclexplode(p.proacl) a "
        "WHERE a.grantee = %s::regrole",
        [role],
    )
    for (function,) in cursor.fetchall():
        # regprocedure's text is already quoted as PostgreSQL needs it.
        _execute(
            cursor, sql.SQL("REVOKE ALL ON FUNCTION {} FROM {}").format(sql.SQL(function), who)
        )
    _execute(cursor, sql.SQL("DROP ROLE {}").format(who))
    return True


def our_roles(cursor: Any, alias: str = DEFAULT_DB_ALIAS) -> list[str]:
    """Tenant roles of this database (its prefix), never anyone else's."""
    pattern = prefix(alias) + r"\_t%"
    cursor.execute("SELECT rolname FROM pg_roles WHERE rolname LIKE %s ORDER BY rolname", [pattern])
    groups = (group_name(alias), writers_group_name(alias))
    return [row[0] for row in cursor.fetchall() if row[0] not in groups]
