"""The pure parts of the second wall: role names, derived passwords, settings and checks.

No database: names and verifiers are computed, settings validated, checks run on settings.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from kumiko_jobs import checks
from kumiko_jobs.core import project_settings
from kumiko_jobs.core.conf import _validate
from kumiko_jobs.guard.roles import names as role_names
from kumiko_jobs.guard.roles import privileges as role_grants


def _databases(name: str) -> dict[str, Any]:
    from django.conf import settings

    default = dict(settings.DATABASES["default"])
    return {"default": {**default, "NAME": name}}


def test_role_names_carry_the_database_prefix_and_the_primary_key():
    role = role_names.role_name(42)
    prefix = role_names.prefix()
    assert role == f"{prefix}_t42"
    assert prefix.startswith("kj_") and len(prefix) == 13
    assert role_names.group_name() == f"{prefix}_tenants"


def test_two_databases_never_share_a_role_name(monkeypatch):
    names = {}
    for database in ("test_kumiko_1", "test_kumiko_2", "kumiko_demo"):
        monkeypatch.setattr(
            project_settings, "database_settings", lambda alias, d=database: {"NAME": d}
        )
        names[database] = role_names.role_name(1)
    assert len(set(names.values())) == 3


@pytest.mark.parametrize("pk", [1, 10**18, "0f8e5a2c-6a1b-4c77-9d7e-8d1c2b3a4f5e", "Ä" * 200])
def test_role_names_stay_within_postgresql_s_63_bytes(pk):
    role = role_names.role_name(pk)
    assert len(role.encode()) <= role_names.ROLE_NAME_BYTES
    assert role.startswith(role_names.prefix() + "_t")


def test_odd_keys_are_hashed_not_spliced_into_the_name():
    assert role_names.role_name('x"; DROP ROLE postgres; --').isascii()
    assert '"' not in role_names.role_name('x"; DROP ROLE postgres; --')


def test_passwords_are_derived_from_the_secret_key_and_differ_per_role():
    first, second = role_names.password("kj_a_t1"), role_names.password("kj_a_t2")
    assert first != second and len(first) == 64
    with override_settings(SECRET_KEY="rotated"):
        assert role_names.password("kj_a_t1") != first


def test_the_server_gets_a_scram_verifier_that_proves_the_password():
    """RFC 5802: StoredKey = H(HMAC(SaltedPassword, "Client Key")); recomputed here."""
    verifier = role_names.scram_verifier("kj_a_t1")
    scheme, rest = verifier.split("$", 1)
    iterations_salt, keys = rest.split("$")
    iterations, salt = iterations_salt.split(":")
    stored, server = (base64.b64decode(k) for k in keys.split(":"))
    assert scheme == "SCRAM-SHA-256" and int(iterations) == 4096
    salted = hashlib.pbkdf2_hmac(
        "sha256", role_names.password("kj_a_t1").encode(), base64.b64decode(salt), 4096
    )
    assert stored == hashlib.sha256(hmac.new(salted, b"Client Key", "sha256").digest()).digest()
    assert server == hmac.new(salted, b"Server Key", "sha256").digest()
    assert role_names.password("kj_a_t1") not in verifier
    assert role_names.scram_verifier("kj_a_t1") == verifier  # the command changes nothing


def test_kumiko_s_history_is_not_readable_the_tenant_registry_is():
    readable = role_grants.readable_shared_tables()
    assert "kumiko_jobs_jobrun" not in readable and "kumiko_jobs_escapehatchuse" not in readable
    assert {"customers_client", "catalog_plan"} <= readable


# --- settings and checks ------------------------------------------------------------------------


def test_db_roles_settings_defaults_and_validation():
    defaults = _validate({})
    assert (defaults.DB_ROLES, defaults.DB_ROLE_POOL_SIZE, defaults.DB_POOLER) == (False, 32, None)
    assert _validate({"DB_ROLES": True, "DB_ROLE_POOL_SIZE": 1}).DB_ROLE_POOL_SIZE == 1
    for raw, message in (
        ({"DB_ROLES": "yes"}, "must be True or False"),
        ({"DB_ROLE_POOL_SIZE": 0}, "must be an integer >= 1"),
        ({"DB_POOLER": "statement"}, "use one of"),
    ):
        with pytest.raises(ImproperlyConfigured, match=message):
            _validate(raw)


def _ids(**kumiko: Any) -> list[str]:
    base = {"DB_GUARD": "enforce"}
    with override_settings(KUMIKO_JOBS={**base, **kumiko}, DEBUG=False):
        return [str(m.id) for m in checks.check_db_roles()]


def test_roles_off_in_production_warn_that_the_classifier_stands_alone():
    assert _ids(DB_ROLES=False) == ["kumiko_jobs.W005"]
    assert _ids(DB_ROLES=True) == []
    with override_settings(KUMIKO_JOBS={"DB_ROLES": False}, DEBUG=True):
        assert checks.check_db_roles() == []


def test_transaction_pooling_is_refused_without_roles_and_warned_with_them():
    assert _ids(DB_ROLES=False, DB_POOLER="transaction") == [
        "kumiko_jobs.E013",
        "kumiko_jobs.W005",
    ]
    assert _ids(DB_ROLES=True, DB_POOLER="transaction", HISTORY_PREPARED_STATEMENTS=False) == [
        "kumiko_jobs.W004"
    ]
    assert _ids(DB_ROLES=True, DB_POOLER="session") == []


def test_transaction_pooling_with_prepared_history_statements_names_the_setting():
    """The history's prepared statements need a pooler that keeps them (W009, naming the
    setting that turns them off); a session pooler or a direct connection keeps them anyway."""
    assert _ids(DB_ROLES=True, DB_POOLER="transaction") == [
        "kumiko_jobs.W004",
        "kumiko_jobs.W009",
    ]
    with override_settings(
        KUMIKO_JOBS={"DB_GUARD": "enforce", "DB_ROLES": True, "DB_POOLER": "transaction"},
        DEBUG=False,
    ):
        (warning,) = [m for m in checks.check_db_roles() if m.id == "kumiko_jobs.W009"]
    assert "HISTORY_PREPARED_STATEMENTS" in str(warning.hint)
    assert "max_prepared_statements" in str(warning.hint)
    assert _ids(DB_ROLES=True, DB_POOLER="session") == []
    assert _ids(DB_ROLES=True, DB_POOLER=None) == []


def test_the_roles_check_needs_the_database_and_is_silent_without_it():
    with override_settings(KUMIKO_JOBS={"DB_ROLES": True}):
        assert checks.check_db_roles_in_step(databases=None) == []


def test_tenant_connections_log_in_as_the_role_without_the_project_s_assume_role(monkeypatch):
    """Django's ``assume_role`` would SET ROLE to the project's role after login (the tenant
    role may not, and must not); a psycopg pool would hand out the project's connections."""
    from kumiko_jobs.guard.roles import connections as tenant_connections

    def settings_with_options(alias: str) -> dict[str, Any]:
        from django.conf import settings

        base = dict(settings.DATABASES["default"])
        return {**base, "OPTIONS": {"assume_role": "project_owner", "pool": True, "sslmode": "x"}}

    monkeypatch.setattr(project_settings, "database_settings", settings_with_options)
    wrapper = tenant_connections._new_wrapper("default", "kj_0123456789_t7")
    assert wrapper.settings_dict["USER"] == "kj_0123456789_t7"
    assert wrapper.settings_dict["PASSWORD"] == role_names.password("kj_0123456789_t7")
    assert wrapper.settings_dict["OPTIONS"] == {"sslmode": "x"}
    assert getattr(wrapper, tenant_connections.ROLE_ATTRIBUTE) == "kj_0123456789_t7"
    assert wrapper.connection is None  # made, not connected
