"""The test suite's settings in layout (b) (see ``__init__``): ``tests.settings`` with users
shared by every tenant and django-tenant-users' membership rule."""

from __future__ import annotations

from tests.settings import *  # noqa: F403
from tests.settings import KUMIKO_JOBS, SHARED_APPS, TENANT_APPS

_SHARED_ONLY = {
    "django.contrib.auth",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.admin",
}
SHARED_APPS = [*SHARED_APPS, "tests.shared_auth"]
TENANT_APPS = [a for a in TENANT_APPS if a not in _SHARED_ONLY]
INSTALLED_APPS = list(SHARED_APPS) + [a for a in TENANT_APPS if a not in SHARED_APPS]
AUTH_USER_MODEL = "shared_auth.Member"
KUMIKO_JOBS = {**KUMIKO_JOBS, "TENANT_MEMBERSHIP": "kumiko_jobs.core.audience.django_tenant_users"}
