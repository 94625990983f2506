"""Which tables the guard treats specially: shared, the operators', protected, personal data.

Read from the installed apps' models (and ``EXTRA_SHARED_TABLES``), once per process. The
guard's policy (``guard.wrapper``) and the tenant roles' privileges (``guard.roles.privileges``)
both use these answers, so the classifier and PostgreSQL's privileges draw the same lines.

Names are kept exactly as PostgreSQL stores them: Django always quotes ``db_table``, so a model
with ``db_table = "Catalog_Notice"`` is the relation ``Catalog_Notice``, and the parse tree the
guard reads spells it that way too (``"Catalog_Notice"`` quoted; an unquoted ``Catalog_Notice``
folds to ``catalog_notice``, another relation). Lower-casing one side made honest ORM writes to
such a table look like writes to some other table (issue 22).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from typing import Any

from django.apps import apps
from django_tenants.utils import get_tenant_domain_model, get_tenant_model

from ..core import conf, project_settings
from ..core.db import TABLES_WITHOUT_MODELS

# The model attribute that lists a model's personal-data fields (docs/guard.md).
PERSONAL_DATA_ATTRIBUTE = "kumiko_personal_data"


def _models_of_apps(*, also_tenant: bool) -> list[Any]:
    shared, tenant = project_settings.shared_apps()
    return [
        model
        for config in apps.get_app_configs()
        if config.name in shared and (config.name in tenant) is also_tenant
        for model in config.get_models(include_auto_created=True)
    ]


def _tables_of_apps(*, also_tenant: bool) -> frozenset[str]:
    return frozenset(model._meta.db_table for model in _models_of_apps(also_tenant=also_tenant))


def _id_sequences(models: list[Any]) -> frozenset[str]:
    """The id sequences of ``models``' tables: PostgreSQL names an identity (or serial) column's
    sequence ``<table>_<column>_seq``."""
    return frozenset(
        f"{m._meta.db_table}_{m._meta.pk.column}_seq"
        for m in models
        if m._meta.pk is not None and m._meta.pk.get_internal_type().endswith("AutoField")
    )


# Besides sessions, the models (app label, model name) whose rows are logins or the operators'
# records of every user when their app is shared only: the admin's log (every admin action,
# with the object's text, on whichever tenant's domain it was taken) and the API credentials of
# the common auth apps (a token read is a login taken). Others: OPERATOR_RECORD_TABLES.
_OPERATOR_RECORD_MODELS = frozenset(
    {
        ("admin", "logentry"),
        ("authtoken", "token"),  # Django REST framework
        ("knox", "authtoken"),  # django-rest-knox
        ("oauth2_provider", "accesstoken"),  # django-oauth-toolkit
        ("oauth2_provider", "refreshtoken"),
        ("oauth2_provider", "grant"),
        ("oauth2_provider", "idtoken"),
        ("oauth2_provider", "application"),  # client secrets
    }
)


def _is_operator_record(model: Any) -> bool:
    """A model whose rows are the operators' records of every user: a session (its key is a
    login: ``AbstractBaseSession``, so a project's own session model too), the admin's log or
    an API credential (``_OPERATOR_RECORD_MODELS``)."""
    from django.contrib.sessions.base_session import AbstractBaseSession

    meta = model._meta
    return (
        issubclass(model, AbstractBaseSession)
        or (meta.app_label, meta.model_name) in _OPERATOR_RECORD_MODELS
    )


def _operator_record_models() -> list[Any]:
    return [m for m in _models_of_apps(also_tenant=False) if _is_operator_record(m)]


@cache
def operator_record_tables() -> frozenset[str]:
    """Shared-only tables of the operators' records of every user: the sessions, the admin's
    log and API credentials when their app is in SHARED_APPS only (django-tenants'
    shared-users layout: one table for every tenant's users and the operators), and the
    project's ``OPERATOR_RECORD_TABLES``. A session key or a token read is a login taken, the
    operators' too, and the log holds every tenant's admin actions: no tenant run names them,
    in any schema, read or written, whatever its grants; the tenant roles hold no privilege on
    them. (In SHARED_APPS and TENANT_APPS they are ``operator_tables()``: each tenant has its
    own copy.)"""
    models = _operator_record_models()
    named = frozenset(conf.get().OPERATOR_RECORD_TABLES)
    return frozenset(m._meta.db_table for m in models) | _id_sequences(models) | named


@cache
def guarded_sequences() -> tuple[frozenset[str], frozenset[str], frozenset[str]]:
    """The id sequences of the shared, the operators' and the protected tables, judged as their
    tables are (``nextval``/``setval`` are writes): an unqualified ``setval`` on a sequence only
    public has resolves there, and would make the operators' next inserts collide. For the
    guard's policy only; the roles' privileges are granted on the tables themselves."""
    shared = _models_of_apps(also_tenant=False)
    operators = _models_of_apps(also_tenant=True)
    protected = [*_kumiko_models(), get_tenant_model(), get_tenant_domain_model()]
    shared_names = _id_sequences(shared)
    return shared_names, _id_sequences(operators) - shared_names, _id_sequences(protected)


@cache
def shared_tables() -> frozenset[str]:
    """Tables that exist only in public: models of SHARED_APPS that are not also TENANT_APPS
    (the operators' records among them, which ``operator_record_tables()`` refuses first)."""
    return _tables_of_apps(also_tenant=False) | frozenset(conf.get().EXTRA_SHARED_TABLES)


@cache
def operator_tables() -> frozenset[str]:
    """Tables of apps in both SHARED_APPS and TENANT_APPS: every tenant has its own copy (the
    unqualified name), and the copy in public is the operators' own (their sessions, users,
    admin log). No tenant run reads or writes ``public.<table>``, whatever its grants; the
    tenant roles hold no privilege on them."""
    return _tables_of_apps(also_tenant=True) - shared_tables()


def _kumiko_models() -> list[Any]:
    return list(apps.get_app_config("kumiko_jobs").get_models(include_auto_created=True))


@cache
def kumiko_tables() -> frozenset[str]:
    """kumiko_jobs' own tables (every tenant's runs, attempts, failures, audit, the dashboard's
    rollups) and their id sequences: no tenant run names them, read or written, whatever its
    grants; the tenant roles hold no privilege on them."""
    models = _kumiko_models()
    names = {m._meta.db_table for m in models} | set(TABLES_WITHOUT_MODELS)
    # PostgreSQL names an identity column's sequence ``<table>_<column>_seq``: ``setval()`` on
    # one would make kumiko's next inserts collide.
    return frozenset(names) | _id_sequences(models)


@cache
def protected_tables() -> frozenset[str]:
    """kumiko_jobs' own tables and the tenant and domain tables: no grant writes them."""
    models = [*_kumiko_models(), get_tenant_model(), get_tenant_domain_model()]
    return frozenset(model._meta.db_table for model in models) | frozenset(TABLES_WITHOUT_MODELS)


@cache
def personal_data_columns() -> Mapping[str, frozenset[str]]:
    """``{table: columns}`` from models that list ``kumiko_personal_data = ["field", ...]``."""
    found: dict[str, frozenset[str]] = {}
    for model in apps.get_models():
        names = getattr(model, PERSONAL_DATA_ATTRIBUTE, None)
        if names:
            columns = {str(getattr(model._meta.get_field(name), "column", name)) for name in names}
            found[model._meta.db_table] = frozenset(columns)
    return found
