"""The example project in layout (b): users shared by every tenant, as django-tenants documents
it (``django.contrib.auth``, sessions and the admin in SHARED_APPS only), with the README's
settings (``DB_ROLES`` on) and django-tenant-users' membership rule.

``KUMIKO_TEST_TENANT_MEMBERSHIP`` overrides the rule ("" leaves it unset, to see check E014).
"""

from __future__ import annotations

import os

from example_project.settings import *  # noqa: F403
from example_project.settings import KUMIKO_JOBS, SHARED_APPS

SHARED_APPS = [*SHARED_APPS, "tests.shared_auth"]
# django-tenants' documented layout: contenttypes in both, the tenants' own apps; no auth.
TENANT_APPS = ["django.contrib.contenttypes", "example_project.billing"]
INSTALLED_APPS = list(SHARED_APPS) + [a for a in TENANT_APPS if a not in SHARED_APPS]
AUTH_USER_MODEL = "shared_auth.Member"
_RULE = os.environ.get(
    "KUMIKO_TEST_TENANT_MEMBERSHIP", "kumiko_jobs.core.audience.django_tenant_users"
)
KUMIKO_JOBS = {**KUMIKO_JOBS, "TENANT_MEMBERSHIP": _RULE or None}
