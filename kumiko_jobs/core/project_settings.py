"""The readers of other projects' settings: Django's, RQ's and django-tenants'.

kumiko_jobs reads settings it does not own (``DATABASES``, ``RQ_QUEUES``, ``SHARED_APPS``,
``PUBLIC_SCHEMA_NAME``, ``TASKS``...) in many places: the checks, the guard, the transport, the
run history. Reading them here, and only here (with ``conf.py``, which owns ``KUMIKO_JOBS``),
gives each one a single default and a single spelling, and lets a test override it with
Django's ``override_settings``: nothing is cached except ``shared_apps`` (read on every guarded
statement), which forgets itself on ``setting_changed``.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from typing import Any

from django.conf import settings
from django.core.signals import setting_changed
from django.db import connections
from django.dispatch import receiver

# settings.TASKS entries whose BACKEND is this path are kumiko's (task_jobs.py, checks.py).
KUMIKO_TASK_BACKEND = "kumiko_jobs.tasks.KumikoBackend"


# --- RQ (django-rq's RQ_QUEUES and RQ) ----------------------------------------------------------


def rq_queue_names() -> tuple[str, ...]:
    """The queues ``RQ_QUEUES`` declares (empty when the setting is missing)."""
    return tuple(getattr(settings, "RQ_QUEUES", {}) or {})


def rq_queue_config(name: str) -> Mapping[str, Any]:
    """One ``RQ_QUEUES`` entry (a copy; empty for an undeclared queue)."""
    return dict((getattr(settings, "RQ_QUEUES", {}) or {}).get(name, {}))


def rq_option(name: str, default: Any = None) -> Any:
    """One key of django-rq's ``RQ`` setting (``WORKER_CLASS``, ``SCHEDULER_CLASS``...)."""
    return (getattr(settings, "RQ", {}) or {}).get(name, default)


# --- Django ----------------------------------------------------------------------------------


def installed_apps() -> tuple[str, ...]:
    """``INSTALLED_APPS`` as written (the checks look for django_rq and django_tenants)."""
    return tuple(settings.INSTALLED_APPS)


def database_engines() -> dict[str, str]:
    """Each database alias's ENGINE: the guard needs PostgreSQL everywhere it wraps."""
    return {alias: str(cfg.get("ENGINE", "")) for alias, cfg in settings.DATABASES.items()}


def database_settings(alias: str) -> dict[str, Any]:
    """The alias's connection settings as Django completed them (a copy).

    The tenant-role connections (guard/) open with the same host, port and options as the
    alias they stand in for; ``connections.settings`` has Django's defaults filled in.
    """
    return dict(connections.settings[alias])


def secret_key() -> str:
    """``SECRET_KEY``: the tenant roles' passwords derive from it (guard/roles/names.py)."""
    return str(settings.SECRET_KEY)


def debug() -> bool:
    """``DEBUG``: a development project is not warned that ``DB_ROLES`` is off (check W005)."""
    return bool(settings.DEBUG)


def urlconf_names() -> tuple[str, ...]:
    """The URLconfs the project serves: tenants' (ROOT_URLCONF) and the public schema's."""
    names = (
        getattr(settings, "ROOT_URLCONF", None),
        getattr(settings, "PUBLIC_SCHEMA_URLCONF", None),
    )
    return tuple(dict.fromkeys(str(n) for n in names if n))


def kumiko_task_backends() -> dict[str, Mapping[str, Any]]:
    """``settings.TASKS`` entries (Django 6's task framework) that use kumiko's backend."""
    configured = getattr(settings, "TASKS", None) or {}
    return {
        str(alias): params
        for alias, params in configured.items()
        if isinstance(params, Mapping) and params.get("BACKEND") == KUMIKO_TASK_BACKEND
    }


# --- django-tenants -------------------------------------------------------------------------


@cache
def shared_apps() -> tuple[frozenset[str], frozenset[str]]:
    """(SHARED_APPS, TENANT_APPS) as sets of dotted names.

    Cached: the guard's table classifier asks on every statement it checks.
    """
    return (
        frozenset(getattr(settings, "SHARED_APPS", ()) or ()),
        frozenset(getattr(settings, "TENANT_APPS", ()) or ()),
    )


@receiver(setting_changed)
def _forget_shared_apps(*, setting: str, **_: object) -> None:
    if setting in {"SHARED_APPS", "TENANT_APPS"}:
        shared_apps.cache_clear()


def has_tenant_settings() -> bool:
    """Is this a django-tenants project (``TENANT_MODEL`` and ``SHARED_APPS`` set)?"""
    return hasattr(settings, "TENANT_MODEL") and hasattr(settings, "SHARED_APPS")


def tenant_model_label() -> str:
    """``TENANT_MODEL`` ("app_label.Model"), or "" outside a django-tenants project."""
    return str(getattr(settings, "TENANT_MODEL", ""))


def public_schema_name() -> str:
    """django-tenants' ``PUBLIC_SCHEMA_NAME``: the shared schema, where kumiko's tables live."""
    return str(getattr(settings, "PUBLIC_SCHEMA_NAME", "public"))


def extra_search_paths() -> tuple[str, ...]:
    """django-tenants' ``PG_EXTRA_SEARCH_PATHS``: schemas appended to every search path."""
    return tuple(str(s) for s in getattr(settings, "PG_EXTRA_SEARCH_PATHS", ()) or ())


def limit_set_calls() -> bool:
    """django-tenants' ``TENANT_LIMIT_SET_CALLS``: it sets the search path once per request
    instead of before every query. guard/roles/search_path.py sets a tenant login's path ahead of an
    atomic run's transaction only then (without it this would add a statement)."""
    return bool(getattr(settings, "TENANT_LIMIT_SET_CALLS", False))
