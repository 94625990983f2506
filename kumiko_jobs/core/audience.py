"""Who a web request is for: the operators, one tenant's members, or nobody.

The domain says which audience a request could be (``connection.schema_name``, which
django-tenants' middleware sets from the host); the user says whether it is:

* the public schema's domain is the operators' view of every tenant, for users holding
  ``kumiko_jobs.view_all_tenants`` only (``view_jobrun`` is not enough: with shared users a
  tenant's staff user may hold it too);
* a tenant's domain shows that tenant's runs to its members only. Membership is decided by
  ``KUMIKO_JOBS["TENANT_MEMBERSHIP"]`` when it is set; otherwise it is implied when the user
  model is a tenant app (each tenant's users live in its own schema), and with shared users and
  no rule nobody is a member (check E014 names the fix).

A tenant's superuser is still a tenant: nothing here reads ``is_superuser`` except through
``has_perm``, which Django answers for the request's own auth tables.

Acting on runs is the operators' (``view_all_tenants`` and ``change_jobrun``), and on a tenant's
domain that tenant's members holding ``kumiko_jobs.operate_tenant_runs``: retry and cancel of
that tenant's runs only (``operates_tenant_runs``). A superuser holds every permission, so a
tenant's superuser (auth in the tenants' schemas) may; with shared users a superuser is global,
and acts on a tenant's domain only as a member of that tenant, on that tenant's runs.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any

from django.contrib.auth import get_user_model
from django.core.exceptions import FieldDoesNotExist, ImproperlyConfigured
from django.db import connection
from django.http import HttpRequest
from django.utils.module_loading import import_string

from . import conf, project_settings

# Operators holding this may use django-rq's queue pages (see kumiko_jobs.urls).
MANAGE_QUEUES = "kumiko_jobs.manage_queues"
# Operators holding this see every tenant's runs on the public schema's domain.
VIEW_ALL_TENANTS = "kumiko_jobs.view_all_tenants"
# A tenant's members holding this retry and cancel that tenant's runs, on its domain only.
OPERATE_TENANT_RUNS = "kumiko_jobs.operate_tenant_runs"
# The rule for django-tenant-users' layout, as a user names it in TENANT_MEMBERSHIP, and the
# user model's field it reads (django-tenant-users' UserProfile.tenants).
DJANGO_TENANT_USERS = "kumiko_jobs.core.audience.django_tenant_users"
TENANTS_FIELD: str = "tenants"

# The request attribute that keeps this request's membership answer: the admin asks several
# times per page (the index, the model's permission, its queryset) and a rule may query.
_MEMBER_ATTRIBUTE = "_kumiko_jobs_member"

Membership = Callable[[Any, Any], bool]


def is_operator_request() -> bool:
    """True on the public schema's domain (operators), False on a tenant's domain."""
    return getattr(connection, "schema_name", project_settings.public_schema_name()) == (
        project_settings.public_schema_name()
    )


def tenant_schema() -> str:
    """The schema of the tenant this request is for (``""`` if the connection has none): what the
    admin limits a tenant's rows to.
    """
    return str(getattr(connection, "schema_name", ""))


def sees_all_tenants(request: HttpRequest) -> bool:
    """An operator: on the public schema's domain and holding ``kumiko_jobs.view_all_tenants``
    (superusers of the public schema's auth tables hold every permission)."""
    return is_operator_request() and bool(request.user.has_perm(VIEW_ALL_TENANTS))


def is_tenant_member(request: HttpRequest) -> bool:
    """On a tenant's domain, whether the request's user belongs to that tenant (the module's
    docstring says how that is decided). False on the operators' domain and for anonymous
    users."""
    if is_operator_request() or not request.user.is_authenticated:
        return False
    key = (tenant_schema(), request.user.pk)
    known = getattr(request, _MEMBER_ATTRIBUTE, None)
    if known is not None and known[0] == key:
        return bool(known[1])
    answer = _decide_membership(request.user)
    setattr(request, _MEMBER_ATTRIBUTE, (key, answer))
    return answer


def operates_tenant_runs(request: HttpRequest) -> bool:
    """On a tenant's domain, a member of that tenant holding ``kumiko_jobs.operate_tenant_runs``:
    may retry and cancel that tenant's runs (and no other's: the admin scopes every run it
    acts on to ``tenant_schema()``). False on the operators' domain, whose acts take
    ``view_all_tenants`` and ``change_jobrun`` instead."""
    return is_tenant_member(request) and bool(request.user.has_perm(OPERATE_TENANT_RUNS))


def _decide_membership(user: Any) -> bool:
    tenant = getattr(connection, "tenant", None)
    # The tenant django-tenants set for this request, and no other: a connection whose tenant
    # and schema disagree answers no.
    if tenant is None or getattr(tenant, "schema_name", None) != tenant_schema():
        return False
    rule = membership_rule()
    if rule is not None:
        return bool(rule(user, tenant))
    return users_live_in_tenants()


def membership_rule() -> Membership | None:
    """The callable ``KUMIKO_JOBS["TENANT_MEMBERSHIP"]`` names, or None when it is not set.
    Raises ``ImproperlyConfigured`` for a path that cannot be imported or is not callable
    (check E015 reports the same at start-up)."""
    path = conf.get().TENANT_MEMBERSHIP
    return None if path is None else _load_rule(path)


@cache
def _load_rule(path: str) -> Membership:
    try:
        rule = import_string(path)
    except ImportError as exc:
        raise ImproperlyConfigured(
            f"settings.KUMIKO_JOBS['TENANT_MEMBERSHIP'] is {path!r}, which cannot be imported: "
            f"{exc}"
        ) from exc
    if not callable(rule):
        raise ImproperlyConfigured(
            f"settings.KUMIKO_JOBS['TENANT_MEMBERSHIP'] is {path!r}, which is not callable: "
            "name a function (user, tenant) -> bool."
        )
    return rule  # type: ignore[no-any-return]  # import_string returns Any


def users_live_in_tenants() -> bool:
    """Is the user model a tenant app (listed in ``TENANT_APPS``)? Then a tenant's domain
    authenticates against that tenant's own user table, and its users are its members."""
    config = get_user_model()._meta.app_config
    if config is None:
        return False
    _, tenant_apps = project_settings.shared_apps()
    config_path = f"{type(config).__module__}.{type(config).__qualname__}"
    return config.name in tenant_apps or config_path in tenant_apps


def tenant_users_field() -> Any:
    """The user model's ``tenants`` many-to-many field to the tenant model (django-tenant-users'
    ``UserProfile.tenants``), or None when the user model has no such field."""
    try:
        field = get_user_model()._meta.get_field(TENANTS_FIELD)
    except FieldDoesNotExist:
        return None
    related = getattr(field, "related_model", None)
    tenant_label = project_settings.tenant_model_label().lower()
    if not field.many_to_many or related is None or related._meta.label_lower != tenant_label:
        return None
    return field


def django_tenant_users(user: Any, tenant: Any) -> bool:
    """The membership rule of django-tenant-users' layout: the user's ``tenants`` many-to-many
    (``tenant.add_user`` adds to it, ``remove_user`` removes) holds the tenant. One indexed
    query on the link table in the public schema; the package itself is not imported, so any
    user model with that field works. Raises ``ImproperlyConfigured`` without the field
    (check E015 reports it at start-up)."""
    field = tenant_users_field()
    if field is None:
        raise ImproperlyConfigured(
            f"KUMIKO_JOBS['TENANT_MEMBERSHIP'] is {DJANGO_TENANT_USERS!r}, but the user model "
            f"{get_user_model()._meta.label} has no 'tenants' many-to-many field to "
            f"{project_settings.tenant_model_label()} (django-tenant-users' UserProfile has one)."
        )
    return bool(getattr(user, field.name).filter(pk=tenant.pk).exists())
