"""System checks: configuration mistakes fail at ``manage.py check``, naming the fix.

Each layer's checks live beside the rules they check, as Django registers checks per app:
the guard's roles and poolers in ``guard/checks.py``, Redis and the scheduler in
``transport/checks.py``, the admin's audiences in ``admin/checks.py`` (registered with the
admin), the metrics token in ``admin/dashboard/metrics_access.py``. This module holds the
checks of the settings and the wiring that span the layers (queues known to the registry,
RQ's classes, django-rq's routes), and imports the others so that ``apps.ready`` registers
every check by importing it.
"""

from __future__ import annotations

from typing import Any

from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from . import transport
from .core import conf, project_settings
from .definition.registry import registry
from .enqueueing.messages import import_rate_callable
from .guard.checks import check_db_roles, check_db_roles_in_step, check_project_user_not_superuser
from .transport.checks import check_redis_sentinel, check_scheduler_running
from .urls import is_guarded

# Registered where they are defined; named here too, at the paths tests and users know.
__all__ = [
    "check_db_roles",
    "check_db_roles_in_step",
    "check_django_rq_exposure",
    "check_project_user_not_superuser",
    "check_queue_serializers",
    "check_redis_sentinel",
    "check_scheduler_running",
    "check_settings",
]

TENANT_ENGINE = "django_tenants.postgresql_backend"


@checks.register()
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """The configuration mistakes that would break runs, each with its fix: unreadable settings
    (E001), missing django-tenants or django-rq, the history outside the public schema, queues not
    in ``RQ_QUEUES``, pickle-reading scheduler or worker classes, and django-rq's pages left
    unguarded.
    """
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
    errors += _message_age_errors(settings)
    errors += _tenant_rate_errors(settings)
    errors += _queue_errors(settings.DEFAULT_QUEUE)
    errors += _rq_class_errors()
    return errors


def _tenant_rate_errors(settings: conf.KumikoSettings) -> list[checks.CheckMessage]:
    """A ``TENANT_RATE_LIMIT`` callable that cannot be imported fails here, at start-up, not at
    the first enqueue (E017)."""
    if not isinstance(settings.TENANT_RATE_LIMIT, str):
        return []
    try:
        import_rate_callable(settings.TENANT_RATE_LIMIT)
    except ImproperlyConfigured as exc:
        return [
            checks.Error(
                str(exc),
                hint="Fix settings.KUMIKO_JOBS['TENANT_RATE_LIMIT'] (see docs/settings.md).",
                id="kumiko_jobs.E017",
            )
        ]
    return []


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


def _queue_errors(default_queue: str) -> list[checks.CheckMessage]:
    known = set(project_settings.rq_queue_names())
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
    scheduler = project_settings.rq_option("SCHEDULER_CLASS")
    if not _subclass_of(scheduler, "kumiko_jobs.transport.Scheduler"):
        errors.append(
            checks.Error(
                f"RQ['SCHEDULER_CLASS'] is {scheduler!r}; rqscheduler would try to unpickle "
                "kumiko's JSON messages and crash.",
                hint="Set RQ = {'SCHEDULER_CLASS': 'kumiko_jobs.transport.Scheduler', ...}.",
                id="kumiko_jobs.E007",
            )
        )
    worker = project_settings.rq_option("WORKER_CLASS")
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


# --- django-rq's web pages and serializers (issue 17) -------------------------------------------


@checks.register(checks.Tags.security, checks.Tags.urls)
def check_django_rq_exposure(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """django-rq's pages show and delete every tenant's messages: operators only.

    Its views admit any ``is_staff`` user, and django-tenants serves the same admin site and the
    same views on every tenant's domain; ``kumiko_jobs.urls.django_rq_urls()`` is the guarded way
    to serve them.
    """
    from django.contrib.admin.sites import all_sites

    errors: list[checks.CheckMessage] = []
    for site in list(all_sites):
        if any(model._meta.app_label == "django_rq" for model in site._registry):
            errors.append(
                checks.Error(
                    f"django-rq's pages are registered on the admin site {site.name!r} "
                    "(RQ_SHOW_ADMIN_LINK defaults to True): any staff user, a tenant's too on "
                    "the tenant's domain, can read, delete and empty every tenant's queue.",
                    hint="Set RQ_SHOW_ADMIN_LINK = False and serve the pages with "
                    'path("django-rq/", kumiko_jobs.urls.django_rq_urls()) in the public '
                    "schema's URLconf.",
                    id="kumiko_jobs.E008",
                )
            )
    for urlconf in project_settings.urlconf_names():
        exposed = sorted(set(_unguarded_django_rq_routes(urlconf)))
        if exposed:
            errors.append(
                checks.Error(
                    f"{urlconf} serves django-rq's views without kumiko's guard "
                    f"({', '.join(exposed[:3])}{', ...' if len(exposed) > 3 else ''}): they "
                    "admit any staff user, on tenants' domains too.",
                    hint='Replace include("django_rq.urls") with '
                    "kumiko_jobs.urls.django_rq_urls() (operators' domain, permission "
                    "kumiko_jobs.manage_queues).",
                    id="kumiko_jobs.E009",
                )
            )
    return errors


def _unguarded_django_rq_routes(urlconf: str) -> list[str]:
    from django.urls import URLPattern, URLResolver, get_resolver

    found: list[str] = []

    def walk(patterns: Any, prefix: str) -> None:
        for entry in patterns:
            if isinstance(entry, URLResolver):
                walk(entry.url_patterns, prefix + str(entry.pattern))
            elif isinstance(entry, URLPattern):
                module = getattr(entry.callback, "__module__", "") or ""
                if module.startswith("django_rq") and not is_guarded(entry.callback):
                    found.append(prefix + str(entry.pattern))

    try:
        walk(get_resolver(urlconf).url_patterns, "")
    except Exception:  # a broken URLconf is reported by Django's own checks
        return []
    # Views of django-rq's admin link are reported by E008.
    return [route for route in found if "django_rq/dashboard" not in route]


@checks.register()
def check_queue_serializers(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Every queue kumiko uses reads and writes JSON, in every process, django-rq's pages too.

    kumiko's own processes force JSON, but django-rq's views and any plain RQ tool load jobs
    with the queue's configured serializer, pickle by default: a job hash planted in Redis would
    run code in the web process when a queue page lists it.
    """

    try:
        default_queue = conf.get().DEFAULT_QUEUE
    except ImproperlyConfigured:
        return []  # reported by check_settings
    used = {default_queue, *((d.queue or default_queue) for d in registry)}
    errors: list[checks.CheckMessage] = []
    for name in project_settings.rq_queue_names():
        if transport.is_json_serializer(project_settings.rq_queue_config(name).get("SERIALIZER")):
            continue
        fix = f'Add "SERIALIZER": "{transport.JSON_SERIALIZER_PATH}" to RQ_QUEUES[{name!r}].'
        if name in used:
            errors.append(
                checks.Error(
                    f"RQ_QUEUES[{name!r}] has no JSON SERIALIZER: django-rq's pages and plain "
                    "RQ tools would unpickle what Redis holds for this kumiko queue.",
                    hint=fix,
                    id="kumiko_jobs.E010",
                )
            )
        else:
            errors.append(
                checks.Warning(
                    f"RQ_QUEUES[{name!r}] has no JSON SERIALIZER: django-rq's pages unpickle "
                    "its jobs, so whoever can write to that Redis can run code in the web "
                    "process.",
                    hint=fix,
                    id="kumiko_jobs.W002",
                )
            )
    return errors
