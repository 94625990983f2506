"""System checks: configuration mistakes fail at ``manage.py check``, naming the fix.

Each layer's checks live beside the rules they check and register themselves, as Django
registers checks per app: the settings as the foundation reads them in ``core/checks.py``
(E001 to E005, E011), the jobs' queues and the tenant rate callable in ``enqueueing/checks.py``
(E006, E010, E017, W002), Redis and the scheduler in ``transport/checks.py`` (E007, E018,
W003, W006), the worker class in ``worker/checks.py`` (W001), the roles and poolers in
``guard/checks.py``, django-rq's pages in ``urls.py`` (E008, E009), the admin's audiences in
``admin/checks.py`` (registered with the admin), the metrics token in
``admin/dashboard/metrics_access.py``.

This module only collects them: importing it (``apps.ready`` does) registers every check, the
names below are the paths tests and users know, and ``check_settings`` returns the settings'
checks of every layer as one list.
"""

from __future__ import annotations

from typing import Any

from django.core import checks

from .core.checks import TENANT_ENGINE, check_project_settings
from .enqueueing.checks import check_job_queues, check_queue_serializers
from .guard.checks import check_db_roles, check_db_roles_in_step, check_project_user_not_superuser
from .transport.checks import (
    check_queue_names,
    check_redis_sentinel,
    check_scheduler_class,
    check_scheduler_running,
)
from .urls import check_django_rq_exposure
from .worker.checks import check_worker_class

__all__ = [
    "TENANT_ENGINE",
    "check_db_roles",
    "check_db_roles_in_step",
    "check_django_rq_exposure",
    "check_job_queues",
    "check_project_settings",
    "check_project_user_not_superuser",
    "check_queue_names",
    "check_queue_serializers",
    "check_redis_sentinel",
    "check_scheduler_class",
    "check_scheduler_running",
    "check_settings",
    "check_worker_class",
]


def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """The configuration mistakes that would break runs, each with its fix, from every layer's
    check of the settings: unreadable settings (E001, alone), missing django-tenants or
    django-rq, the history outside the public schema, queues not in ``RQ_QUEUES`` or named
    like a lane, pickle-reading scheduler or worker classes. Not registered itself: Django runs
    each layer's check."""
    return [
        *check_project_settings(),
        *check_job_queues(),
        *check_queue_names(),
        *check_scheduler_class(),
        *check_worker_class(),
    ]
