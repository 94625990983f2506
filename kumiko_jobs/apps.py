from __future__ import annotations

from django.apps import AppConfig
from django.utils.module_loading import autodiscover_modules
from django.utils.translation import gettext_lazy as _


def conf_has_tenants() -> bool:
    from . import conf

    return conf.has_tenant_settings()


class KumikoJobsConfig(AppConfig):
    name = "kumiko_jobs"
    label = "kumiko_jobs"
    verbose_name = _("Background jobs")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks, db_roles  # noqa: F401 - checks registers the system checks
        from .registry import registry

        # Every installed app's jobs.py, so web processes and workers know the same jobs.
        autodiscover_modules("jobs")
        registry.freeze()
        if conf_has_tenants():
            db_roles.connect_hooks()  # each receiver does nothing unless DB_ROLES is on
