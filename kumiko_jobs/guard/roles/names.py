"""The names and passwords of the tenants' PostgreSQL roles: derived, never stored.

Roles are cluster-wide, so every name carries a per-database prefix
``kj_<10 hex of sha256(database name)>`` (a test database, a development database and another
project on the same server never collide) and the tenant's primary key, not its schema name
(schemas can be renamed; the key is stable and short): ``kj_0123456789_t42``. All tenant roles
are members of ``kj_0123456789_tenants``, which holds the read access to the shared tables once.
Names stay far below PostgreSQL's 63 bytes (``ROLE_NAME_BYTES``).

Passwords are derived, never stored: HMAC-SHA256(SECRET_KEY, role name). The server only ever
receives a SCRAM-SHA-256 verifier computed here (with a salt derived the same way, so running
the command again changes nothing); rotating SECRET_KEY and running ``manage.py kumiko_jobs
roles`` gives every role its new password. Both the login (``guard.roles.connections``) and the
grants (``guard.roles.privileges``) derive from these functions, so they can never disagree; they
touch no database. The HMAC labels (``kumiko_jobs.db_roles.password:``/``salt:``) keep the
module's old name: changing them would change every role's password.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
from typing import Any

from django.db import DEFAULT_DB_ALIAS
from psycopg import sql

from ...core import project_settings

ROLE_NAME_BYTES = 63
SCRAM_ITERATIONS = 4096
_SIMPLE_KEY = re.compile(r"[0-9a-z_]{1,32}")


def prefix(alias: str = DEFAULT_DB_ALIAS) -> str:
    """``kj_`` and 10 hex digits of the database's name: cluster-wide unique per database."""
    return prefix_of(str(project_settings.database_settings(alias)["NAME"]))


def prefix_of(database: str) -> str:
    """The prefix of the roles of ``database`` (also one that is gone: its roles outlive it)."""
    return "kj_" + hashlib.sha256(database.encode()).hexdigest()[:10]


def role_name(tenant_pk: Any, alias: str = DEFAULT_DB_ALIAS) -> str:
    """The login of the tenant with primary key ``tenant_pk``: the prefix and the key."""
    key = str(tenant_pk).lower()
    if not _SIMPLE_KEY.fullmatch(key):  # a UUID or odd text: a hash keeps the name short
        key = hashlib.sha256(str(tenant_pk).encode()).hexdigest()[:24]
    return f"{prefix(alias)}_t{key}"


def group_name(alias: str = DEFAULT_DB_ALIAS) -> str:
    """The group every tenant role is a member of: it holds the shared tables' reads once."""
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
    """The tenant's login for another tenant's ``cross_tenant_reads`` block (SELECT only)."""
    return role_name(tenant_pk, alias) + READER_SUFFIX


def writer_name(tenant_pk: Any, alias: str = DEFAULT_DB_ALIAS) -> str:
    """The tenant's login for its own ``global_writes`` blocks."""
    return role_name(tenant_pk, alias) + WRITER_SUFFIX


def logins_of(role: str) -> list[str]:
    """A tenant role and its two escape-hatch logins: what one tenant holds in the cluster."""
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


def drop_roles_of_dropped_database(cursor: Any, database: str) -> list[str]:
    """After ``DROP DATABASE``: its roles hold nothing anywhere any more (grants and default
    privileges lived in that database), so they drop cleanly. For test and benchmark
    databases, whose roles would otherwise outlive them in the cluster.

    Here, beside the names, and not with the grants: it imports nothing that needs Django's
    settings, so a benchmark can drop its database's roles before it configures Django."""
    cursor.execute(
        "SELECT rolname FROM pg_roles WHERE rolname LIKE %s ORDER BY rolname DESC",
        [prefix_of(database) + r"\_%"],
    )
    roles = [row[0] for row in cursor.fetchall()]
    for role in roles:
        cursor.execute(
            sql.SQL("DROP ROLE {}").format(sql.Identifier(role)).as_string(cursor.connection)
        )
    return roles
