"""Dotted paths that live outside the code keep resolving, whatever the package's layout.

They are stored in Redis (every queued message and cron entry names the runner), written in
users' settings (RQ's WORKER_CLASS and SCHEDULER_CLASS, MIDDLEWARE, LOGGING, TASKS) and in
their code (``from kumiko_jobs import job``, signal receivers, type hints). Moving a module must
leave each of these importable at its old path; docs/design.md, "Public paths", lists them.
"""

from __future__ import annotations

import importlib.util

import django
import pytest
from django.utils.module_loading import import_string

# Django's task framework arrived in 6.0: on Django 5.2 the backend's paths cannot resolve, and
# kumiko_jobs.tasks says so when imported (tests/unit/test_tasks_import.py).
HAS_DJANGO_TASKS = importlib.util.find_spec("django.tasks") is not None
NEEDS_DJANGO_TASKS = {"kumiko_jobs.tasks.KumikoBackend", "kumiko_jobs.tasks.TaskCancelled"}

# (dotted path, who names it)
PUBLIC_PATHS = [
    ("kumiko_jobs.runner.execute", "every queued RQ message and cron entry (transport.RUNNER)"),
    ("kumiko_jobs.worker.Worker", "RQ['WORKER_CLASS'], manage.py rqworker --worker-class"),
    ("kumiko_jobs.worker.ForkingWorker", "RQ['WORKER_CLASS']"),
    ("kumiko_jobs.transport.Scheduler", "RQ['SCHEDULER_CLASS'] for manage.py rqscheduler"),
    ("kumiko_jobs.origin.KumikoJobsMiddleware", "MIDDLEWARE"),
    ("kumiko_jobs.origin.public_intake", "views of webhooks (docs/guard.md)"),
    ("kumiko_jobs.log_context.RunContextFilter", "LOGGING['filters']"),
    ("kumiko_jobs.tasks.KumikoBackend", "TASKS['BACKEND'] (Django 6)"),
    ("kumiko_jobs.tasks.TaskCancelled", "code of django.tasks users"),
    ("kumiko_jobs.context.JobContext", "type hints of job bodies (example_project/billing)"),
    ("kumiko_jobs.operations.OperationRefused", "operators' code (docs/reference.md)"),
    ("kumiko_jobs.operations.retry_run", "operators' code (docs/reference.md)"),
    ("kumiko_jobs.operations.cancel_run", "operators' code (docs/reference.md)"),
    ("kumiko_jobs.urls.django_rq_urls", "project urlconfs"),
    (
        "kumiko_jobs.core.audience.django_tenant_users",
        "KUMIKO_JOBS['TENANT_MEMBERSHIP'] (docs/settings.md)",
    ),
    ("kumiko_jobs.conf.public_schema_name", "migration 0011 (a landed migration never changes)"),
    ("kumiko_jobs.models.JobRun", "users' queries"),
    ("kumiko_jobs.models.RunStatus", "users' queries"),
    ("kumiko_jobs.signals.job_succeeded", "signal receivers"),
    ("kumiko_jobs.signals.job_failed", "signal receivers"),
    ("kumiko_jobs.testing.run_jobs", "users' tests (pytest_plugins = ['kumiko_jobs.testing'])"),
    ("kumiko_jobs.job", "`from kumiko_jobs import job` in every jobs.py"),
    ("kumiko_jobs.enqueue", "enqueue by name"),
    ("kumiko_jobs.emit", "events"),
    ("kumiko_jobs.EscapeHatch", "@job(escape_hatches=...)"),
    ("kumiko_jobs.DatabaseAccessDenied", "users' except clauses"),
    ("kumiko_jobs.Unrecoverable", "job bodies"),
]


@pytest.mark.parametrize(
    ("path", "named_by"),
    [
        pytest.param(
            path,
            named_by,
            id=path,
            marks=pytest.mark.skipif(
                path in NEEDS_DJANGO_TASKS and not HAS_DJANGO_TASKS,
                reason=f"Django {django.get_version()} has no django.tasks",
            ),
        )
        for path, named_by in PUBLIC_PATHS
    ],
)
def test_the_public_path_resolves(path: str, named_by: str) -> None:
    assert import_string(path) is not None, named_by


def test_the_runner_path_is_the_one_messages_carry() -> None:
    from kumiko_jobs import transport

    assert import_string(transport.RUNNER) is import_string("kumiko_jobs.runner.execute")
