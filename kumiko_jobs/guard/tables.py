"""Which tables the guard treats specially: shared, protected, holding personal data.

Read from the installed apps' models (and ``EXTRA_SHARED_TABLES``), once per process. The
guard's policy (``guard.wrapper``) and the tenant roles' grants (``role_grants``) both use these
answers, so the classifier and PostgreSQL's privileges draw the same lines.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache

from django.apps import apps
from django_tenants.utils import get_tenant_domain_model, get_tenant_model

from ..core import conf, project_settings

# The model attribute that lists a model's personal-data fields (docs/guard.md).
PERSONAL_DATA_ATTRIBUTE = "kumiko_personal_data"


@cache
def shared_tables() -> frozenset[str]:
    """Tables that exist only in public: models of SHARED_APPS that are not also TENANT_APPS."""
    shared, tenant = project_settings.shared_apps()
    tables = set(conf.get().EXTRA_SHARED_TABLES)
    for config in apps.get_app_configs():
        if config.name in shared and config.name not in tenant:
            for model in config.get_models(include_auto_created=True):
                tables.add(model._meta.db_table.lower())
    return frozenset(tables)


@cache
def protected_tables() -> frozenset[str]:
    """kumiko_jobs' own tables and the tenant and domain tables: no grant writes them."""
    models = [
        *apps.get_app_config("kumiko_jobs").get_models(),
        get_tenant_model(),
        get_tenant_domain_model(),
    ]
    return frozenset(model._meta.db_table.lower() for model in models)


@cache
def personal_data_columns() -> Mapping[str, frozenset[str]]:
    """``{table: columns}`` from models that list ``kumiko_personal_data = ["field", ...]``."""
    found: dict[str, frozenset[str]] = {}
    for model in apps.get_models():
        names = getattr(model, PERSONAL_DATA_ATTRIBUTE, None)
        if names:
            columns = {
                str(getattr(model._meta.get_field(name), "column", name)).lower() for name in names
            }
            found[model._meta.db_table.lower()] = frozenset(columns)
    return found
