"""One PostgreSQL role per tenant: the second wall (docs/guard.md, "Two walls").

The job body of a tenant run logs in as its tenant's role (``tenant_connections``), so that
PostgreSQL itself refuses what the classifier might let through: another tenant's schema,
writes to shared tables, kumiko's history. Login, not ``SET ROLE``: any SQL can undo a
``SET ROLE`` (``RESET ROLE``, ``set_config('role', ...)``), nothing can change a session's
login user.

Names. Roles are cluster-wide, so every name carries a per-database prefix
``kj_<10 hex of sha256(database name)>`` (a test database, a development database and another
project on the same server never collide) and the tenant's primary key, not its schema name
(schemas can be renamed; the key is stable and short): ``kj_0123456789_t42``. All tenant roles
are members of ``kj_0123456789_tenants``, which holds the read access to the shared tables once
(10,000 tenants do not mean 10,000 grant entries on every shared table). Names stay far below
PostgreSQL's 63 bytes (``ROLE_NAME_BYTES``).

Passwords are derived, never stored: HMAC-SHA256(SECRET_KEY, role name). The server only ever
receives a SCRAM-SHA-256 verifier computed here (with a salt derived the same way, so running
the command again changes nothing); rotating SECRET_KEY and running ``manage.py kumiko_jobs
roles`` gives every role its new password.

Every statement names roles and schemas through ``psycopg.sql.Identifier``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.apps import apps
from django.db import DEFAULT_DB_ALIAS, connections, transaction
from psycopg import sql

from ..core import conf, project_settings
from ..core.db import ATOMIC_FUNCTION, ATOMIC_SIGNATURE
from .tables import protected_tables, shared_tables

logger = logging.getLogger("kumiko_jobs.db_roles")

ROLE_NAME_BYTES = 63
TABLE_PRIVILEGES = ("SELECT", "INSERT", "UPDATE", "DELETE")
SEQUENCE_PRIVILEGES = ("USAGE", "SELECT", "UPDATE")
# What a tenant role never holds on its own tables and schema, even if someone granted it.
REVOKED_TABLE_PRIVILEGES = ("TRUNCATE", "REFERENCES", "TRIGGER")
SCRAM_ITERATIONS = 4096
# Tenants whose roles ``sync_all`` creates or repairs in one transaction.
SYNC_CHUNK = 100
_SIMPLE_KEY = re.compile(r"[0-9a-z_]{1,32}")


def prefix(alias: str = DEFAULT_DB_ALIAS) -> str:
    """``kj_`` and 10 hex digits of the database's name: cluster-wide unique per database."""
    return prefix_of(str(project_settings.database_settings(alias)["NAME"]))


def prefix_of(database: str) -> str:
    return "kj_" + hashlib.sha256(database.encode()).hexdigest()[:10]


def drop_roles_of_dropped_database(cursor: Any, database: str) -> list[str]:
    """After ``DROP DATABASE``: its roles hold nothing anywhere any more (grants and default
    privileges lived in that database), so they drop cleanly. For test and benchmark
    databases, whose roles would otherwise outlive them in the cluster."""
    cursor.execute(
        "SELECT rolname FROM pg_roles WHERE rolname LIKE %s ORDER BY rolname DESC",
        [prefix_of(database) + r"\_%"],
    )
    roles = [row[0] for row in cursor.fetchall()]
    for role in roles:
        _execute(cursor, sql.SQL("DROP ROLE {}").format(_ident(role)))
    return roles


def role_name(tenant_pk: Any, alias: str = DEFAULT_DB_ALIAS) -> str:
    key = str(tenant_pk).lower()
    if not _SIMPLE_KEY.fullmatch(key):  # a UUID or odd text: a hash keeps the name short
        key = hashlib.sha256(str(tenant_pk).encode()).hexdigest()[:24]
    return f"{prefix(alias)}_t{key}"


def group_name(alias: str = DEFAULT_DB_ALIAS) -> str:
    return f"{prefix(alias)}_tenants"


def writers_group_name(alias: str = DEFAULT_DB_ALIAS) -> str:
    """Writes on the shared tables no grant is refused (never kumiko's or the tenant tables)."""
    return f"{prefix(alias)}_shared_writers"


# Two more logins per tenant, the identities of its escape hatches (docs/guard.md, "Two
# walls"): ``_r`` for another tenant's ``cross_tenant_reads`` (SELECT only, so not even a raw
# ROLLBACK out of the READ ONLY transaction can write), ``_w`` for its own ``global_writes``
# (the tenant's privileges plus writes on the shared tables, and nothing on other tenants).
READER_SUFFIX = "_r"
WRITER_SUFFIX = "_w"


def reader_name(tenant_pk: Any, alias: str = DEFAULT_DB_ALIAS) -> str:
    return role_name(tenant_pk, alias) + READER_SUFFIX


def writer_name(tenant_pk: Any, alias: str = DEFAULT_DB_ALIAS) -> str:
    return role_name(tenant_pk, alias) + WRITER_SUFFIX


def _tenant_roles_of(role: str) -> list[str]:
    return [role, role + READER_SUFFIX, role + WRITER_SUFFIX]


def password(role: str) -> str:
    """Derived from SECRET_KEY: nothing to store, the same in every worker."""
    key = project_settings.secret_key().encode()
    return hmac.new(key, b"kumiko_jobs.db_roles.password:" + role.encode(), "sha256").hexdigest()


def scram_verifier(role: str) -> str:
    """The SCRAM-SHA-256 verifier of ``password(role)`` (RFC 5802/7677, as PostgreSQL stores
    it): the password itself never reaches the server, nor its logs."""
    secret = password(role).encode()
    salt = hmac.new(
        project_settings.secret_key().encode(),
        b"kumiko_jobs.db_roles.salt:" + role.encode(),
        "sha256",
    ).digest()[:16]
    salted = hashlib.pbkdf2_hmac("sha256", secret, salt, SCRAM_ITERATIONS)
    client_key = hmac.new(salted, b"Client Key", "sha256").digest()
    stored_key = hashlib.sha256(client_key).digest()
    server_key = hmac.new(salted, b"Server Key", "sha256").digest()

    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    return f"SCRAM-SHA-256${SCRAM_ITERATIONS}:{b64(salt)}${b64(stored_key)}:{b64(server_key)}"


def readable_shared_tables() -> frozenset[str]:
    """Shared tables a tenant role may read: the classifier's shared tables without kumiko's
    own (every tenant's runs, arguments, errors and logs: no tenant reads them, which the
    classifier alone allows). The tenant and domain tables stay readable: a job names another
    tenant through them (``ctx.cross_tenant_reads(Client.objects.get(...))``)."""
    kumiko = apps.get_app_config("kumiko_jobs").get_models(include_auto_created=True)
    return shared_tables() - {model._meta.db_table.lower() for model in kumiko}


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


@dataclass
class SyncResult:
    ensured: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # tenants whose schema does not exist


def _tenants() -> list[tuple[Any, str]]:
    from django_tenants.utils import get_tenant_model

    public = project_settings.public_schema_name()
    return [
        (pk, schema)
        for pk, schema in get_tenant_model().objects.values_list("pk", "schema_name")
        if schema != public
    ]


def _schemas(cursor: Any) -> set[str]:
    cursor.execute("SELECT nspname FROM pg_namespace")
    return {row[0] for row in cursor.fetchall()}


def sync_all(alias: str = DEFAULT_DB_ALIAS, *, drop_orphans: bool = True) -> SyncResult:
    """Create or repair every tenant's role and the group; drop roles of deleted tenants.
    Safe to run on every deploy (``manage.py kumiko_jobs roles``)."""
    result = SyncResult()
    conn = connections[alias]
    with conn.cursor() as cursor:
        with transaction.atomic(using=alias):
            ensure_group(cursor, alias)
        schemas = _schemas(cursor)
        expected = set()
        tenants = _tenants()
        for start in range(0, len(tenants), SYNC_CHUNK):
            # One transaction per chunk of tenants, not one per statement: about 30 statements
            # a tenant, each its own commit (and WAL flush) in autocommit, made provisioning
            # 10,000 tenants take hours (bench/README.md, "Many tenants"). A chunk is short:
            # a failure rolls back only its own tenants, and the command can be run again.
            with transaction.atomic(using=alias):
                for pk, schema in tenants[start : start + SYNC_CHUNK]:
                    role = role_name(pk, alias)
                    expected.update(_tenant_roles_of(role))
                    if schema not in schemas:
                        result.skipped.append(schema)
                        continue
                    ensure_tenant_role(cursor, pk, schema, alias)
                    result.ensured.append(role)
        if drop_orphans:
            # The escape-hatch logins first: the writer is a member of its tenant's role.
            orphans = [r for r in our_roles(cursor, alias) if r not in expected]
            for role in sorted(
                orphans, key=lambda r: r.endswith((READER_SUFFIX, WRITER_SUFFIX)), reverse=True
            ):
                drop_role(cursor, role)
                result.dropped.append(role)
    return result


def ensure_for_tenant(tenant_pk: Any, schema: str, alias: str = DEFAULT_DB_ALIAS) -> str:
    with connections[alias].cursor() as cursor:
        ensure_group(cursor, alias)
        return ensure_tenant_role(cursor, tenant_pk, schema, alias)


def drop_for_tenant(tenant_pk: Any, alias: str = DEFAULT_DB_ALIAS) -> bool:
    role = role_name(tenant_pk, alias)
    with connections[alias].cursor() as cursor:
        for login in (role + WRITER_SUFFIX, role + READER_SUFFIX):
            drop_role(cursor, login)
        return drop_role(cursor, role)


def drop_all(alias: str = DEFAULT_DB_ALIAS) -> list[str]:
    """Every role of this database's prefix and its group (a test database's teardown)."""
    with connections[alias].cursor() as cursor:
        roles = our_roles(cursor, alias)
        logins = sorted(
            roles, key=lambda r: r.endswith((READER_SUFFIX, WRITER_SUFFIX)), reverse=True
        )
        for role in [*logins, group_name(alias), writers_group_name(alias)]:
            drop_role(cursor, role)
    return roles


def out_of_date(alias: str = DEFAULT_DB_ALIAS) -> list[str]:
    """Schemas of tenants whose role is missing or lacks a privilege it should hold, and roles
    of deleted tenants. One query over the catalogs: cheap enough for a system check."""
    tenants = _tenants()
    roles = [role_name(pk, alias) for pk, _ in tenants]
    schemas = [schema for _, schema in tenants]
    with connections[alias].cursor() as cursor:
        # One pass over pg_class for all tenants (a hash join on the namespace): pg_class has
        # no index on relnamespace alone, so an EXISTS per tenant scanned the whole catalog
        # once per tenant, quadratic in the tenants (3.4 s at 1,000 tenants, against 0.14 s;
        # bench/README.md, "Many tenants"). Roles by to_regrole, not by joining pg_roles.
        cursor.execute(
            """
            WITH t AS (
                SELECT u.schema, n.oid AS nsp, to_regrole(quote_ident(u.role)) AS roid
                FROM unnest(%s::text[], %s::text[]) AS u(role, schema)
                JOIN pg_namespace n ON n.nspname = u.schema
            ), g AS (SELECT to_regrole(quote_ident(%s)) AS oid)
            SELECT t.schema FROM t, g
            WHERE t.roid IS NULL OR g.oid IS NULL
               OR NOT pg_has_role(t.roid, g.oid, 'USAGE')
               OR NOT has_schema_privilege(t.roid, t.nsp, 'USAGE')
            UNION
            SELECT t.schema FROM t JOIN pg_class c ON c.relnamespace = t.nsp
            WHERE t.roid IS NOT NULL AND (
                (c.relkind IN ('r', 'p') AND NOT (
                    has_table_privilege(t.roid, c.oid, 'SELECT')
                    AND has_table_privilege(t.roid, c.oid, 'INSERT')
                    AND has_table_privilege(t.roid, c.oid, 'UPDATE')
                    AND has_table_privilege(t.roid, c.oid, 'DELETE')))
                OR (c.relkind = 'S' AND NOT has_sequence_privilege(t.roid, c.oid, 'USAGE')))
            ORDER BY 1
            """,
            [roles, schemas, group_name(alias)],
        )
        stale = [row[0] for row in cursor.fetchall()]
        expected = {login for role in roles for login in _tenant_roles_of(role)}
        orphans = sorted(set(our_roles(cursor, alias)) - expected)
        door = _atomic_success_ungranted(cursor, alias)
    return [*stale, *door, *(f"role {role} (no such tenant)" for role in orphans)]


def _atomic_success_ungranted(cursor: Any, alias: str) -> list[str]:
    """The atomic runs' success function (migration 0011) when the tenants' group may not
    execute it: a deploy that migrated without running the roles command. Every atomic run
    under DB_ROLES would fail with 'permission denied' at its end."""
    public = project_settings.public_schema_name()
    function = f"{public}.{ATOMIC_FUNCTION}{ATOMIC_SIGNATURE}"
    cursor.execute(
        "SELECT NOT has_function_privilege(g.oid, f.oid, 'EXECUTE')"
        " FROM (SELECT to_regprocedure(%s) AS oid) f, (SELECT to_regrole(quote_ident(%s)) AS oid) g"
        " WHERE f.oid IS NOT NULL AND g.oid IS NOT NULL",
        [function, group_name(alias)],
    )
    row = cursor.fetchone()
    return (
        [f"function {function} (the tenants' group may not execute it)"] if row and row[0] else []
    )


def tenant_of_schema(schema: str) -> Any:
    from django_tenants.utils import get_tenant_model

    return (
        get_tenant_model().objects.filter(schema_name=schema).values_list("pk", flat=True).first()
    )


def enabled() -> bool:
    return conf.get().DB_ROLES


def hooked_schemas(schemas: Iterable[str]) -> None:
    """Grant again on these schemas after their migrations (new tables, new sequences)."""
    public = project_settings.public_schema_name()
    for schema in schemas:
        if schema == public:
            with connections[DEFAULT_DB_ALIAS].cursor() as cursor:
                ensure_group(cursor)
            continue
        pk = tenant_of_schema(schema)
        if pk is not None:
            ensure_for_tenant(pk, schema)


# --- keeping roles in step with tenants ---------------------------------------------------------
#
# django-tenants sends ``post_schema_sync`` only with ``auto_create_schema``, and
# ``schema_migrated`` after every schema's migrations (also the first ones of a schema created
# later by hand or by ``migrate_schemas``): both grant. It has no drop signal: the tenant
# model's ``post_delete`` drops the role. ``manage.py kumiko_jobs roles`` repairs anything
# these miss (a tenant deleted with a queryset's raw SQL, a role changed by hand).


def _on_schema_synced(sender: Any, tenant: Any, **kwargs: Any) -> None:
    if enabled():
        hooked_schemas([tenant.schema_name])  # the public tenant has no role of its own


def _on_schema_migrated(sender: Any, schema_name: str, **kwargs: Any) -> None:
    if enabled():
        hooked_schemas([schema_name])


def _on_tenant_deleted(sender: Any, instance: Any, **kwargs: Any) -> None:
    if not enabled() or instance.schema_name == project_settings.public_schema_name():
        return
    from django.db import DatabaseError, transaction

    try:
        # A savepoint: the tenant's deletion must not fail because its role cannot go (it
        # owns large objects, say); E012 and the command report and retry the orphan role.
        with transaction.atomic():
            drop_for_tenant(instance.pk)
    except DatabaseError as exc:
        logger.error(
            "the role of deleted tenant %s was not dropped (%s); unlink what it owns and run "
            "`manage.py kumiko_jobs roles`",
            instance.pk,
            exc,
        )


def connect_hooks() -> None:
    from django.db.models.signals import post_delete
    from django_tenants.signals import post_schema_sync, schema_migrated
    from django_tenants.utils import get_tenant_model

    post_schema_sync.connect(_on_schema_synced, dispatch_uid="kumiko_jobs.db_roles.synced")
    schema_migrated.connect(_on_schema_migrated, dispatch_uid="kumiko_jobs.db_roles.migrated")
    post_delete.connect(
        _on_tenant_deleted, sender=get_tenant_model(), dispatch_uid="kumiko_jobs.db_roles.deleted"
    )
