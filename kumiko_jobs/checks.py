"""System checks: configuration mistakes fail at ``manage.py check``, naming the fix."""

from __future__ import annotations

from typing import Any

from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import DEFAULT_DB_ALIAS, DatabaseError, transaction
from django.utils.module_loading import import_string

from . import transport
from .core import conf, project_settings
from .definition.registry import registry
from .enqueueing.messages import import_rate_callable
from .guard import role_sync
from .transport.scheduler_liveness import overdue_problem
from .urls import is_guarded

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


@checks.register(checks.Tags.compatibility, deploy=True)
def check_scheduler_running(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """``manage.py check --deploy``: delayed work overdue because no rqscheduler moves it.

    A deploy check because it reads Redis, which a plain ``check`` (run by every command)
    should not need; it says nothing when Redis cannot be read.
    """

    if conf.get_or_none() is None:
        return []  # E001 says why
    problem = overdue_problem()
    if not problem:
        return []
    return [
        checks.Warning(
            problem,
            hint="Run `python manage.py rqscheduler` next to the workers (README, Quickstart); "
            "KUMIKO_JOBS['SCHEDULER_OVERDUE_AFTER'] sets how late is overdue.",
            id="kumiko_jobs.W003",
        )
    ]


@checks.register(checks.Tags.security)
def check_db_roles(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """The database guard's posture: a transaction pooler (unsafe without ``DB_ROLES``, fragile with
    it) and ``DB_ROLES`` off in production, where isolation would rest on the guard's classifier
    alone.
    """
    try:
        settings = conf.get()
    except ImproperlyConfigured:
        return []  # E001 says so
    found: list[checks.CheckMessage] = []
    if settings.DB_POOLER == "transaction":
        if not settings.DB_ROLES:
            found.append(
                checks.Error(
                    "KUMIKO_JOBS['DB_POOLER'] is 'transaction' without DB_ROLES: the pooler "
                    "hands one server session to many clients, so a search path or setting a "
                    "run left in its session reaches the statements of another tenant's run.",
                    hint="Point the workers at PostgreSQL directly or through session pooling, "
                    "or turn DB_ROLES on (docs/guard.md, 'Poolers').",
                    id="kumiko_jobs.E013",
                )
            )
        else:
            found.append(
                checks.Warning(
                    "KUMIKO_JOBS['DB_POOLER'] is 'transaction': tenant isolation holds (the "
                    "pooler keeps a pool per login role), but django-tenants' search path and "
                    "kumiko's session reset are per session and may land on another one.",
                    hint="Use session pooling for workers (docs/guard.md, 'Poolers').",
                    id="kumiko_jobs.W004",
                )
            )
    if not settings.DB_ROLES:
        if project_settings.debug() or settings.DB_GUARD == "off":
            return found
        found.append(
            checks.Warning(
                "KUMIKO_JOBS['DB_ROLES'] is off: tenant isolation rests on the DB guard's "
                "classifier alone; job bodies run as the project's database user.",
                hint="Follow docs/guard.md ('Two walls', set-up) and set "
                "KUMIKO_JOBS['DB_ROLES'] = True.",
                id="kumiko_jobs.W005",
            )
        )
    return found


@checks.register(checks.Tags.database)
def check_db_roles_in_step(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """Tenants whose role is missing or lacks a grant (one catalog query; ``--database``)."""
    if not databases or "default" not in databases:
        return []
    try:
        if not conf.get().DB_ROLES:
            return []
    except ImproperlyConfigured:
        return []

    try:
        # In a savepoint, so that a failed statement leaves no caller's transaction aborted.
        with transaction.atomic(using=DEFAULT_DB_ALIAS):
            stale = role_sync.out_of_date()  # no tenant table yet (not migrated): []
    except DatabaseError as exc:
        # Say what can be said and let the command go on: `migrate` runs this check first.
        return [
            checks.Warning(
                f"Could not read the tenants' database roles: {exc}".strip(),
                hint="Run `manage.py migrate_schemas --shared` and `manage.py kumiko_jobs roles`.",
                id="kumiko_jobs.W008",
            )
        ]
    if not stale:
        return []
    shown = ", ".join(stale[:10]) + (f" and {len(stale) - 10} more" if len(stale) > 10 else "")
    return [
        checks.Error(
            f"{len(stale)} tenant database role(s) missing or out of date: {shown}. Their "
            "runs would fail with 'permission denied' or a failed login.",
            hint="Run `manage.py kumiko_jobs roles` (safe on every deploy).",
            id="kumiko_jobs.E012",
        )
    ]


@checks.register(checks.Tags.compatibility)
def check_redis_sentinel(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """A queue behind Sentinel without a socket timeout hangs on a frozen primary.

    A primary that is gone refuses connections, and redis-py asks the Sentinels again; one that
    is frozen (a stopped process, a paused VM, a partition) keeps the TCP connection open and
    answers nothing, so a client without ``SOCKET_TIMEOUT`` waits forever and never learns of
    the promotion (docs/reliability.md, "Redis failover").
    """
    found: list[checks.CheckMessage] = []
    for name in project_settings.rq_queue_names():
        config = project_settings.rq_queue_config(name)
        if "SENTINELS" not in config or config.get("SOCKET_TIMEOUT"):
            continue
        found.append(
            checks.Warning(
                f"RQ_QUEUES[{name!r}] uses Sentinel without SOCKET_TIMEOUT: a frozen primary "
                "holds every client of this queue (requests that enqueue, rqscheduler, the "
                "workers' bookkeeping) until it wakes up, whatever the Sentinels promoted.",
                hint=f'Add "SOCKET_TIMEOUT": 2 (seconds) to RQ_QUEUES[{name!r}], and '
                '"SENTINEL_KWARGS": {"socket_timeout": 2} (docs/settings.md, "Redis behind '
                'Sentinel").',
                id="kumiko_jobs.W006",
            )
        )
    return found


@checks.register(checks.Tags.security, checks.Tags.database)
def check_project_user_not_superuser(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """``DB_ROLES`` with a superuser as the project user (``--database``, as E012).

    docs/guard.md ("Two walls", set-up) forbids it: a superuser passes every privilege check,
    so a job body that reaches the project's connection (``ctx.system_db()``, a connection
    opened by hand) holds every tenant's data and the server's files, and the tenant roles it
    creates are all the wall there is.
    """
    if not databases or "default" not in databases:
        return []
    try:
        if not conf.get().DB_ROLES:
            return []
    except ImproperlyConfigured:
        return []  # E001 says why
    from django.db import DatabaseError, connections

    try:
        with connections["default"].cursor() as cursor:
            # current_user: the identity that holds the privileges (after "assume_role")
            cursor.execute(
                "SELECT current_user, rolsuper FROM pg_roles WHERE rolname = current_user"
            )
            row = cursor.fetchone()
    except DatabaseError:
        return []  # no database to ask: Django's own checks and E012 report it
    if row is None or not row[1]:
        return []
    return [
        checks.Warning(
            f"KUMIKO_JOBS['DB_ROLES'] is on and the project's database user {row[0]!r} is a "
            "superuser: it passes every privilege check, so whatever a job reaches with the "
            "project's credentials is outside the second wall.",
            hint="Connect as a user with LOGIN and CREATEROLE that owns the database, not a "
            "superuser (docs/guard.md, 'Two walls', set-up).",
            id="kumiko_jobs.W007",
        )
    ]
