from __future__ import annotations

from django.apps import AppConfig
from django.utils.module_loading import autodiscover_modules
from django.utils.translation import gettext_lazy as _


class KumikoJobsConfig(AppConfig):
    name = "kumiko_jobs"
    label = "kumiko_jobs"
    verbose_name = _("Background jobs")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks  # noqa: F401 - registers the system checks
        from .registry import registry

        # Every installed app's jobs.py, so web processes and workers know the same jobs.
        autodiscover_modules("jobs")
        registry.freeze()
