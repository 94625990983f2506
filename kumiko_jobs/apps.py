"""The one place where kumiko_jobs wires itself into Django: ``KumikoJobsConfig.ready``.

Everything else in the package is called; this module connects. At start-up, in this order:
the system checks are registered (importing ``checks``), the cron domain's hooks are handed to
the scheduler in the transport (which sits below it and cannot import it), then, only when
``KUMIKO_JOBS`` is valid, every installed app's ``jobs.py`` is discovered and the registry
frozen (web processes and workers know the same jobs), the tenant-deletion receiver is
connected (history rows forget a deleted tenant), and with django-tenants' settings present
the role-sync receivers (they act only under ``DB_ROLES``). Nothing here runs per request or
per run.
"""

from __future__ import annotations

from django.apps import AppConfig
from django.utils.module_loading import autodiscover_modules
from django.utils.translation import gettext_lazy as _


class KumikoJobsConfig(AppConfig):
    """The app's start-up: checks registered, cron hooks installed, every app's ``jobs.py``
    discovered and the registry frozen, and the tenant-deletion and role-sync receivers connected.
    """

    name = "kumiko_jobs"
    label = "kumiko_jobs"
    verbose_name = _("Background jobs")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        """Wire the app up once Django has loaded every app; with broken ``KUMIKO_JOBS`` settings it
        stops before discovering jobs, so the mistake surfaces as the clean system check E001
        instead of a traceback inside ``django.setup()``.
        """
        # Imported here, not at the top: Django imports apps.py while it is still loading the
        # apps, before the package's modules (which reach models and settings) are safe to import.
        # Importing checks registers the system checks.
        from . import checks, transport  # noqa: F401
        from .core import conf, project_settings
        from .definition.registry import registry
        from .enqueueing import schedules
        from .guard.roles import sync as role_sync

        # The scheduler (transport) sits below the cron domain and cannot import it.
        transport.install_cron_hooks(schedules.CRON_HOOKS)

        if conf.get_or_none() is None:
            # A broken KUMIKO_JOBS (a typo'd key, a wrong type) is the system check
            # kumiko_jobs.E001, which `manage.py check` and every command that runs the checks
            # (runserver, migrate, rqworker, rqscheduler, kumiko_jobs, ...) print as one clean
            # error with its did-you-mean. Discovering the jobs now would raise it inside
            # django.setup() instead, as a traceback before any command starts. Nothing can run
            # a job meanwhile: every use of the settings (enqueue, the worker) raises the same
            # ImproperlyConfigured.
            return
        # Every installed app's jobs.py, so web processes and workers know the same jobs.
        autodiscover_modules("jobs")
        registry.freeze()
        self._forget_deleted_tenants()
        if project_settings.has_tenant_settings():
            role_sync.connect_hooks()  # each receiver does nothing unless DB_ROLES is on

    def _forget_deleted_tenants(self) -> None:
        # History rows outlive a tenant's schema; when the tenant goes, so does its data in
        # them (retention.forget_tenant: purged or anonymised, TENANT_DELETION).
        # Imported at ready(), like the rest: the history imports the models.
        from django.db.models.signals import post_delete
        from django_tenants.utils import get_tenant_model

        from .history.retention import on_tenant_deleted  # (see above)
        from .worker import pauses  # (see above)

        post_delete.connect(
            on_tenant_deleted, sender=get_tenant_model(), dispatch_uid="kumiko_jobs.tenant_gone"
        )
        # Its pauses too, or its waiting messages stay parked for good (worker/pauses.py).
        post_delete.connect(
            pauses.on_tenant_deleted,
            sender=get_tenant_model(),
            dispatch_uid="kumiko_jobs.tenant_gone.pauses",
        )
