"""The kumiko jobs that run Django tasks (``kumiko_jobs.tasks.KumikoBackend``).

A Django ``@task`` is not a kumiko ``@job``: it is a plain function, declared anywhere, with
positional arguments. Each queue of each kumiko task backend in ``settings.TASKS`` gets one
kumiko job, ``django_tasks.<alias>:<queue>``, registered at start-up with the other jobs (so
every worker knows it), whose arguments name the task and carry its call. Its runs are
ordinary kumiko runs: history, tenant, guard, retries, timeouts.

Nothing here imports ``django.tasks`` at import time: on Django 5.2 (no task framework) no
kumiko task backend can be configured, so nothing is registered and nothing imported.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from . import conf
from .exceptions import InvalidJob
from .registry import build_definition, registry

PREFIX = "django_tasks."


def job_name(alias: str, queue: str) -> str:
    return f"{PREFIX}{alias}:{queue}"


def register_task_jobs() -> None:
    """One job per (kumiko task backend, queue), with the backend's OPTIONS."""
    for alias, params in conf.kumiko_task_backends().items():
        options = dict(params.get("OPTIONS") or {})
        unknown = set(options) - {"RETRIES", "TIMEOUT", "BACKOFF"}
        if unknown:
            raise InvalidJob(
                f"settings.TASKS[{alias!r}]['OPTIONS'] has unknown keys {sorted(unknown)}; "
                "kumiko's task backend takes RETRIES, TIMEOUT and BACKOFF (as @job's retries, "
                "timeout and backoff)."
            )
        for queue in params.get("QUEUES") or ["default"]:
            job_options: dict[str, Any] = {"name": job_name(alias, queue), "queue": queue}
            for key in ("RETRIES", "TIMEOUT", "BACKOFF"):
                if key in options:
                    job_options[key.lower()] = options[key]
            definition = build_definition(run_django_task, job_options)
            # A task's priority orders its messages in the queue (tasks.KumikoBackend).
            registry.register(dataclasses.replace(definition, front_by_priority=True))


def run_django_task(
    ctx: Any,
    *,
    task: str,
    args: list[Any],
    kwargs: dict[str, Any],
    priority: int = 0,
    run_after: str | None = None,
) -> Any:
    """Call the Django task named ``task`` (its module path) with its arguments."""
    from .tasks import call_task  # imports django.tasks: only reached on Django >= 6.0

    return call_task(ctx, task, args, kwargs)
