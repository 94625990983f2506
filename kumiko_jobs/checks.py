"""System checks: configuration mistakes fail at ``manage.py check``, naming the fix."""

from __future__ import annotations

from typing import Any

from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from . import conf
from .registry import registry

TENANT_ENGINE = "django_tenants.postgresql_backend"


@checks.register()
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    errors: list[checks.CheckMessage] = []
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
    apps = conf.installed_apps()
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
    engines = conf.database_engines()
    if engines.get("default") != TENANT_ENGINE:
        errors.append(
            checks.Error(
                f"DATABASES['default']['ENGINE'] is {engines.get('default')!r}; runs are switched "
                "between tenant schemas by django-tenants' backend.",
                hint=f"Set it to {TENANT_ENGINE!r}.",
                id="kumiko_jobs.E004",
            )
        )
    shared, tenant = conf.shared_apps()
    if conf.has_tenant_settings() and ("kumiko_jobs" not in shared or "kumiko_jobs" in tenant):
        errors.append(
            checks.Error(
                "kumiko_jobs keeps run history in the public schema.",
                hint="List 'kumiko_jobs' in SHARED_APPS and not in TENANT_APPS.",
                id="kumiko_jobs.E005",
            )
        )
    errors += _message_age_errors(settings)
    errors += _queue_errors(settings.DEFAULT_QUEUE)
    errors += _rq_class_errors()
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
            id="kumiko_jobs.E008",
        )
    ]


def _queue_errors(default_queue: str) -> list[checks.CheckMessage]:
    known = set(conf.rq_queue_names())
    wanted: dict[str, list[str]] = {}
    for definition in registry:
        wanted.setdefault(definition.queue or default_queue, []).append(definition.name)
    errors: list[checks.CheckMessage] = []
    for queue, jobs in sorted(wanted.items()):
        if queue not in known:
            errors.append(
                checks.Error(
                    f"Queue {queue!r} used by {', '.join(jobs[:5])} is not in RQ_QUEUES.",
                    hint=f"Add RQ_QUEUES[{queue!r}] or change the job's queue=.",
                    id="kumiko_jobs.E006",
                )
            )
    if default_queue not in known and not errors:
        errors.append(
            checks.Error(
                f"KUMIKO_JOBS['DEFAULT_QUEUE'] is {default_queue!r}, which is not in RQ_QUEUES.",
                hint="Add it to RQ_QUEUES or set DEFAULT_QUEUE to one that is.",
                id="kumiko_jobs.E006",
            )
        )
    return errors


def _subclass_of(path: Any, base_path: str) -> bool:
    try:
        cls = import_string(path) if isinstance(path, str) else path
        return isinstance(cls, type) and issubclass(cls, import_string(base_path))
    except ImportError:
        return False


def _rq_class_errors() -> list[checks.CheckMessage]:
    errors: list[checks.CheckMessage] = []
    scheduler = conf.rq_option("SCHEDULER_CLASS")
    if not _subclass_of(scheduler, "kumiko_jobs.transport.Scheduler"):
        errors.append(
            checks.Error(
                f"RQ['SCHEDULER_CLASS'] is {scheduler!r}; rqscheduler would try to unpickle "
                "kumiko's JSON messages and crash.",
                hint="Set RQ = {'SCHEDULER_CLASS': 'kumiko_jobs.transport.Scheduler', ...}.",
                id="kumiko_jobs.E007",
            )
        )
    worker = conf.rq_option("WORKER_CLASS")
    if not (
        _subclass_of(worker, "kumiko_jobs.worker.Worker")
        or _subclass_of(worker, "kumiko_jobs.worker.ForkingWorker")
    ):
        errors.append(
            checks.Warning(
                f"RQ['WORKER_CLASS'] is {worker!r}; a plain RQ worker reads pickle unless "
                "started with --serializer rq.serializers.JSONSerializer, and skips kumiko's "
                "per-run hygiene.",
                hint="Set RQ['WORKER_CLASS'] = 'kumiko_jobs.worker.Worker' (or ForkingWorker).",
                id="kumiko_jobs.W001",
            )
        )
    return errors
