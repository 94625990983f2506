"""System checks of the project's settings as the foundation reads them: ``KUMIKO_JOBS`` itself
(E001: every other check stays quiet while it cannot be read), the apps and the database
engine kumiko needs (E002 to E005), and messages that would outlive their run's history (E011).

Registered at import (``kumiko_jobs.checks`` imports this module at start-up); each layer
above registers its own beside the rules it checks.
"""

from __future__ import annotations

from typing import Any

from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from . import conf, project_settings

TENANT_ENGINE = "django_tenants.postgresql_backend"


@checks.register()
def check_project_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Unreadable settings (E001, alone), missing django-tenants or django-rq, the engine, the
    history outside the public schema, and messages that outlive retention (E011)."""
    try:
        settings = conf.get()
    except ImproperlyConfigured as exc:
        return [
            checks.Error(
                str(exc),
                hint="Fix settings.KUMIKO_JOBS (see docs/settings.md).",
                id="kumiko_jobs.E001",
            )
        ]
    return [*_app_errors(), *_message_age_errors(settings)]


def _app_errors() -> list[checks.CheckMessage]:
    errors: list[checks.CheckMessage] = []
    apps = project_settings.installed_apps()
    if "django_tenants" not in apps:
        errors.append(
            checks.Error(
                "kumiko_jobs needs django-tenants.",
                hint="Add 'django_tenants' first in SHARED_APPS and INSTALLED_APPS.",
                id="kumiko_jobs.E002",
            )
        )
    if "django_rq" not in apps:
        errors.append(
            checks.Error(
                "kumiko_jobs needs django-rq.",
                hint="Add 'django_rq' to SHARED_APPS.",
                id="kumiko_jobs.E003",
            )
        )
    engines = project_settings.database_engines()
    if engines.get("default") != TENANT_ENGINE:
        errors.append(
            checks.Error(
                f"DATABASES['default']['ENGINE'] is {engines.get('default')!r}; runs are switched "
                "between tenant schemas by django-tenants' backend.",
                hint=f"Set it to {TENANT_ENGINE!r}.",
                id="kumiko_jobs.E004",
            )
        )
    shared, tenant = project_settings.shared_apps()
    if project_settings.has_tenant_settings() and (
        "kumiko_jobs" not in shared or "kumiko_jobs" in tenant
    ):
        errors.append(
            checks.Error(
                "kumiko_jobs keeps run history in the public schema.",
                hint="List 'kumiko_jobs' in SHARED_APPS and not in TENANT_APPS.",
                id="kumiko_jobs.E005",
            )
        )
    return errors


def _message_age_errors(settings: conf.KumikoSettings) -> list[checks.CheckMessage]:
    """A message must expire before retention can delete the run it belongs to.

    Otherwise a copy of a finished run's message outlives the run's history row, and nothing
    but the missing row would tell a replay from a first delivery.
    """
    retention = settings.RETENTION_DAYS * 24 * 3600
    if retention == 0 or retention > settings.MESSAGE_MAX_AGE:
        return []
    return [
        checks.Error(
            f"KUMIKO_JOBS['MESSAGE_MAX_AGE'] is {settings.MESSAGE_MAX_AGE} s, not less than "
            f"RETENTION_DAYS={settings.RETENTION_DAYS} ({retention} s): a copy of a message "
            "would still be accepted after retention deleted its run's history.",
            hint=(
                f"Lower MESSAGE_MAX_AGE below {retention} (e.g. {7 * 24 * 3600}, seven days) "
                "or raise RETENTION_DAYS."
            ),
            id="kumiko_jobs.E011",
        )
    ]


def names_subclass(path: Any, base: type) -> bool:
    """Whether a setting that names a class (a dotted path, or the class itself) names ``base``
    or a subclass of it; a path that does not import names none."""
    try:
        cls = import_string(path) if isinstance(path, str) else path
        return isinstance(cls, type) and issubclass(cls, base)
    except ImportError:
        return False
