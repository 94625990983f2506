"""Keeping the tenants' roles in step with the tenants: every one on deploy, each on its hooks.

``sync_all`` (``manage.py kumiko_jobs roles``) creates or repairs every tenant's role and drops
the roles of deleted tenants; ``out_of_date`` (check E012) finds what it would change, in one
query; django-tenants' signals and the tenant model's ``post_delete`` keep roles current
between deploys (``connect_hooks``, connected by the app config). The statements themselves
are ``guard.roles.privileges``'; the names ``guard.roles.names``'. The logger keeps the name
``kumiko_jobs.db_roles`` (users' LOGGING names it).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections, transaction

from ...core import conf, project_settings
from ...core.db import ATOMIC_FUNCTION, ATOMIC_SIGNATURE
from ..tables import operator_record_tables, operator_tables
from .names import (
    READER_SUFFIX,
    WRITER_SUFFIX,
    group_name,
    logins_of,
    role_name,
    writers_group_name,
)
from .privileges import drop_role, ensure_group, ensure_tenant_role, our_roles

logger = logging.getLogger("kumiko_jobs.db_roles")

# Tenants whose roles ``sync_all`` creates or repairs in one transaction.
SYNC_CHUNK = 100


@dataclass
class SyncResult:
    """What ``sync_all`` did: roles ensured and dropped, tenants skipped (no schema yet)."""

    ensured: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # tenants whose schema does not exist


def _tenants(alias: str = DEFAULT_DB_ALIAS) -> list[tuple[Any, str]] | None:
    """(pk, schema) of every tenant, or None while the tenant table does not exist: a new
    database before ``migrate_schemas --shared``, whose checks (E012) and ``kumiko_jobs roles``
    must not crash on it."""
    from django_tenants.utils import get_tenant_model  # a model: importable once apps loaded

    public = project_settings.public_schema_name()
    model = get_tenant_model()
    with connections[alias].cursor() as cursor:
        # Qualified with the public schema: the tenant table is a shared app's.
        cursor.execute(
            "SELECT to_regclass(format('%%I.%%I', %s, %s))", [public, model._meta.db_table]
        )
        row = cursor.fetchone()
    if row is None or row[0] is None:
        return None
    return [
        (pk, schema)
        for pk, schema in model.objects.using(alias).values_list("pk", "schema_name")
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
        tenants = _tenants(alias)
        if tenants is None:
            # Not migrated yet: no tenants to give roles, and no telling which of this
            # database's roles are orphans; nothing is dropped.
            logger.info("kumiko_jobs roles: no tenant table yet (run migrate_schemas --shared)")
            return result
        for start in range(0, len(tenants), SYNC_CHUNK):
            # One transaction per chunk of tenants, not one per statement: about 30 statements
            # a tenant, each its own commit (and WAL flush) in autocommit, made provisioning
            # 10,000 tenants take hours (bench/README.md, "Many tenants"). A chunk is short:
            # a failure rolls back only its own tenants, and the command can be run again.
            with transaction.atomic(using=alias):
                for pk, schema in tenants[start : start + SYNC_CHUNK]:
                    role = role_name(pk, alias)
                    expected.update(logins_of(role))
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
    """Create or repair one tenant's role (and the group): a tenant's schema was migrated."""
    with connections[alias].cursor() as cursor:
        ensure_group(cursor, alias)
        return ensure_tenant_role(cursor, tenant_pk, schema, alias)


def drop_for_tenant(tenant_pk: Any, alias: str = DEFAULT_DB_ALIAS) -> bool:
    """Drop one tenant's role and its two logins (the tenant was deleted)."""
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
    tenants = _tenants(alias)
    if tenants is None:
        return []  # not migrated yet: no tenant needs a role
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
        expected = {login for role in roles for login in logins_of(role)}
        orphans = sorted(set(our_roles(cursor, alias)) - expected)
        door = _atomic_success_ungranted(cursor, alias)
        exposed = _operator_tables_readable(cursor, alias)
    return [*stale, *door, *exposed, *(f"role {role} (no such tenant)" for role in orphans)]


def _operator_tables_readable(cursor: Any, alias: str) -> list[str]:
    """The operators' own tables in public (apps in SHARED_APPS and TENANT_APPS: sessions,
    users, admin log; and the operators' records shared by every tenant when their app is in
    SHARED_APPS only), and their id sequences, that the tenants' group or the shared writers
    (whom an escape hatch's login is) may use, by a grant to them or to PUBLIC: every tenant
    role could read the operators' sessions (issue 22), or rewind a sequence. The command
    revokes it."""
    cursor.execute(
        "SELECT DISTINCT c.relkind = 'S', c.relname"
        " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " LEFT JOIN pg_depend d ON d.objid = c.oid AND c.relkind = 'S'"
        "  AND d.deptype IN ('a', 'i')"
        " LEFT JOIN pg_class t ON t.oid = d.refobjid,"
        " (SELECT oid FROM pg_roles WHERE rolname = ANY(%s)) g"
        " WHERE n.nspname = %s AND (c.relname = ANY(%s) OR t.relname = ANY(%s))"
        " AND CASE WHEN c.relkind = 'S'"
        "  THEN has_sequence_privilege(g.oid, c.oid, 'USAGE, SELECT, UPDATE')"
        "  ELSE has_table_privilege(g.oid, c.oid, 'SELECT, INSERT, UPDATE, DELETE') END"
        " ORDER BY 1, 2",
        [
            [group_name(alias), writers_group_name(alias)],
            project_settings.public_schema_name(),
            sorted(operator_tables() | operator_record_tables()),
            sorted(operator_tables() | operator_record_tables()),
        ],
    )
    return [
        f"sequence public.{name} (tenant roles may use it)"
        if is_sequence
        else f"table public.{name} (tenant roles may read it)"
        for is_sequence, name in cursor.fetchall()
    ]


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
    """The primary key of the tenant whose schema is ``schema``, or None."""
    from django_tenants.utils import get_tenant_model  # a model: importable once apps loaded

    return (
        get_tenant_model().objects.filter(schema_name=schema).values_list("pk", flat=True).first()
    )


def enabled() -> bool:
    """Whether tenant runs log in as their tenant's role (``KUMIKO_JOBS["DB_ROLES"]``)."""
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
    """Keep roles in step with tenants (called once by ``apps.ready``; each receiver does
    nothing unless DB_ROLES is on)."""
    # Here, not at the top: apps.ready calls this, and the tenant model exists only then.
    from django.db.models.signals import post_delete
    from django_tenants.signals import post_schema_sync, schema_migrated
    from django_tenants.utils import get_tenant_model

    post_schema_sync.connect(_on_schema_synced, dispatch_uid="kumiko_jobs.db_roles.synced")
    schema_migrated.connect(_on_schema_migrated, dispatch_uid="kumiko_jobs.db_roles.migrated")
    post_delete.connect(
        _on_tenant_deleted, sender=get_tenant_model(), dispatch_uid="kumiko_jobs.db_roles.deleted"
    )
