"""Settings of the example project: a real django-tenants SaaS using kumiko_jobs.

Services come from the environment with defaults that work on a developer machine:
``DATABASE_URL`` (PostgreSQL) and ``REDIS_URL``.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import parse_qsl, unquote, urlparse

BASE_DIR = Path(__file__).resolve().parent.parent

DATABASE_URL = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/kumiko_demo")
REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")


def _hosts(netloc: str) -> tuple[str, str]:
    """HOST and PORT of a URL's ``host[:port][,host[:port]...]``, comma-separated as libpq takes
    them (Django passes both to psycopg as they are): one host, or several to fail over between
    (``postgres://u@h1:5432,h2:5433/db?target_session_attrs=read-write``)."""
    hosts, ports = [], []
    for item in netloc.rpartition("@")[2].split(","):
        if item.startswith("["):  # [::1]:5432
            host, _, rest = item[1:].partition("]")
            port = rest.removeprefix(":")
        else:
            host, _, port = item.partition(":")
        hosts.append(unquote(host) or "127.0.0.1")
        ports.append(port or "5432")
    return ",".join(hosts), ",".join(ports)


def _database(url: str) -> dict[str, object]:
    parts = urlparse(url)
    host, port = _hosts(parts.netloc)
    database: dict[str, object] = {
        "ENGINE": "django_tenants.postgresql_backend",
        "NAME": unquote(parts.path.lstrip("/")) or "kumiko_demo",
        "USER": unquote(parts.username or "postgres"),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": host,
        "PORT": port,
        "CONN_MAX_AGE": 0,
        "TEST": {"NAME": os.environ.get("KUMIKO_TEST_DATABASE", "test_kumiko")},
    }
    # libpq's connection parameters in the query string (target_session_attrs=read-write,
    # connect_timeout=5, ...) become OPTIONS, which Django hands to psycopg as they are.
    options = dict(parse_qsl(parts.query))
    if options:
        database["OPTIONS"] = options
    return database


SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "example-only-not-secret-kumiko-jobs")
SECRET_KEY_FALLBACKS: list[str] = []
# Off unless asked for (KUMIKO_EXAMPLE_DEBUG=1): Django's debug page shows settings and local
# variables, database and Redis passwords included, to whoever triggers an error, a tenant's
# user too.
DEBUG = os.environ.get("KUMIKO_EXAMPLE_DEBUG", "") == "1"
# The operators' domain and tenants' subdomains (django-tenants picks the schema by host).
ALLOWED_HOSTS = ["localhost", ".localhost", "127.0.0.1", "testserver"]

SHARED_APPS = [
    "django_tenants",
    "example_project.customers",
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.admin",
    "django_rq",
    "kumiko_jobs",
    "example_project.catalog",
]
TENANT_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.admin",
    "example_project.billing",
]
INSTALLED_APPS = list(SHARED_APPS) + [a for a in TENANT_APPS if a not in SHARED_APPS]

TENANT_MODEL = "customers.Client"
TENANT_DOMAIN_MODEL = "customers.Domain"
PUBLIC_SCHEMA_URLCONF = "example_project.urls_public"
ROOT_URLCONF = "example_project.urls_tenant"
SHOW_PUBLIC_IF_NO_TENANT_FOUND = True
# One SET search_path per schema switch instead of one per cursor (the DB guard accepts both).
TENANT_LIMIT_SET_CALLS = True

DATABASES = {"default": _database(DATABASE_URL)}
DATABASE_ROUTERS = ("django_tenants.routers.TenantSyncRouter",)

MIDDLEWARE = [
    "django_tenants.middleware.main.TenantMainMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.locale.LocaleMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "kumiko_jobs.origin.KumikoJobsMiddleware",
]

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# JSON for every queue: kumiko's workers force it anyway, but django-rq's pages load jobs with
# the serializer configured here (pickle by default), and a job hash someone planted in Redis
# would run code in the web process (system check kumiko_jobs.E010).
_JSON = "rq.serializers.JSONSerializer"


def _redis_connection() -> dict[str, object]:
    """REDIS_URL, or Redis behind Sentinel when REDIS_SENTINELS is set ("host:port,host:port";
    the primary's name in REDIS_SENTINEL_MASTER, the database number from REDIS_URL's path).

    The keys are django-rq's own (docs/settings.md, "Redis behind Sentinel"). SOCKET_TIMEOUT
    matters there: without it a client waits forever on a primary that is frozen rather than
    gone, and never asks the Sentinels for the promoted one.
    """
    sentinels = os.environ.get("REDIS_SENTINELS", "")
    if not sentinels:
        return {"URL": REDIS_URL}
    timeout = float(os.environ.get("REDIS_SOCKET_TIMEOUT", "2"))
    return {
        "SENTINELS": [
            (host, int(port)) for host, port in (a.rsplit(":", 1) for a in sentinels.split(","))
        ],
        "MASTER_NAME": os.environ.get("REDIS_SENTINEL_MASTER", "mymaster"),
        "DB": int(urlparse(REDIS_URL).path.lstrip("/") or 0),
        "SOCKET_TIMEOUT": timeout,
        "SENTINEL_KWARGS": {"socket_timeout": timeout},
    }


RQ_QUEUES = {
    "default": {**_redis_connection(), "DEFAULT_TIMEOUT": 600, "SERIALIZER": _JSON},
    "low": {**_redis_connection(), "DEFAULT_TIMEOUT": 1800, "SERIALIZER": _JSON},
}
# django-rq's admin link would put its pages on admin.site, which tenants' domains serve too,
# behind is_staff only; urls_public.py serves them guarded instead (kumiko_jobs.E008).
RQ_SHOW_ADMIN_LINK = False
# Django 6's task framework on kumiko (docs/tasks.md): @task functions run as kumiko runs.
# Django 5.2 has no task framework (and no TASKS setting).
TASKS = {
    "default": {
        "BACKEND": "kumiko_jobs.tasks.KumikoBackend",
        "QUEUES": ["default", "low"],
        "OPTIONS": {"RETRIES": 2, "BACKOFF": {"type": "fixed", "delay": 0}},
    }
}
RQ = {
    # kumiko's SimpleWorker-based worker: JSON messages, per-run hygiene.
    "WORKER_CLASS": "kumiko_jobs.worker.Worker",
    # rq-scheduler that reads kumiko's JSON messages (deferrals, retries, cron).
    "SCHEDULER_CLASS": "kumiko_jobs.transport.Scheduler",
}

KUMIKO_JOBS = {
    "DB_GUARD": "enforce",
    "DEFAULT_RETRIES": 0,
    # The second wall: tenant job bodies log in as their tenant's own PostgreSQL role
    # (docs/guard.md, "Two walls"; `manage.py kumiko_jobs roles` creates them).
    "DB_ROLES": True,
}

LANGUAGE_CODE = "en"
LANGUAGES = [("en", "English"), ("de", "Deutsch")]
LOCALE_PATHS = [BASE_DIR / "example_project" / "locale"]
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "/static/"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {
        "kumiko_jobs": {"handlers": ["console"], "level": os.environ.get("KUMIKO_LOG", "WARNING")},
        "rq.worker": {"handlers": ["console"], "level": os.environ.get("RQ_LOG", "WARNING")},
    },
}
