"""System checks of the admin's audiences (core/audience.py): registered when the admin is
loaded (``admin/__init__``), so a project that serves no admin gets none of them.

A tenant's domain shows its runs to its members only. With shared users that takes
``KUMIKO_JOBS["TENANT_MEMBERSHIP"]``: without it, E014 (the admin then shows tenants nothing);
a rule that cannot work, E015.
"""

from __future__ import annotations

from typing import Any

from django.contrib.admin.sites import all_sites
from django.contrib.auth import get_user_model
from django.core import checks
from django.core.exceptions import ImproperlyConfigured

from ..core import audience, conf, project_settings
from ..models import JobRun


@checks.register(checks.Tags.security, checks.Tags.admin)
def check_admin_audiences(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """A tenant's domain shows its runs to its members only (core/audience.py): with shared users
    that takes ``TENANT_MEMBERSHIP`` (E014 without it; the admin then shows tenants nothing), and
    a rule that cannot work is E015."""
    if not any(JobRun in site._registry for site in list(all_sites)):
        return []  # kumiko's admin is not served: no audience to decide
    try:
        path = conf.get().TENANT_MEMBERSHIP
    except ImproperlyConfigured:
        return []  # E001 says why
    if path is not None:
        return _membership_rule_errors(path)
    if audience.users_live_in_tenants():
        return []
    user_model = get_user_model()._meta.label
    if audience.tenant_users_field() is not None:
        fix = f"Set KUMIKO_JOBS['TENANT_MEMBERSHIP'] = {audience.DJANGO_TENANT_USERS!r} (the "
        fix += f"tenants many-to-many field of {user_model}, django-tenant-users' layout)."
    else:
        fix = "Set KUMIKO_JOBS['TENANT_MEMBERSHIP'] to the dotted path of a function (user, "
        fix += "tenant) -> bool that says who belongs to a tenant (docs/settings.md)."
    return [
        checks.Error(
            f"Users are shared between tenants ({user_model} is not in TENANT_APPS) and "
            "KUMIKO_JOBS['TENANT_MEMBERSHIP'] is not set, so nothing tells which tenant a user "
            "belongs to: the admin shows no runs on any tenant's domain.",
            hint=fix,
            id="kumiko_jobs.E014",
        )
    ]


def _membership_rule_errors(path: str) -> list[checks.CheckMessage]:
    try:
        audience.membership_rule()
    except ImproperlyConfigured as exc:
        problem = str(exc)
    else:
        if path != audience.DJANGO_TENANT_USERS or audience.tenant_users_field() is not None:
            return []
        problem = (
            f"KUMIKO_JOBS['TENANT_MEMBERSHIP'] is {path!r}, but {get_user_model()._meta.label} "
            f"has no 'tenants' many-to-many field to {project_settings.tenant_model_label()}."
        )
    return [
        checks.Error(
            problem + " Every request on a tenant's domain would fail.",
            hint="Name a function (user, tenant) -> bool, or use "
            f"{audience.DJANGO_TENANT_USERS!r} with django-tenant-users' user model "
            "(docs/settings.md, TENANT_MEMBERSHIP).",
            id="kumiko_jobs.E015",
        )
    ]
