"""The kumiko jobs that run Django tasks (``kumiko_jobs.tasks.KumikoBackend``).

A Django ``@task`` is not a kumiko ``@job``: it is a plain function, declared anywhere, with
positional arguments. Each queue of each kumiko task backend in ``settings.TASKS`` gets one
kumiko job, ``django_tasks.<alias>:<queue>``, registered at start-up with the other jobs (so
every worker knows it), whose arguments name the task and carry its call. Its runs are
ordinary kumiko runs: history, tenant, guard, retries, timeouts.

Nothing here imports ``django.tasks`` at import time: on Django 5.2 (no task framework) no
kumiko task backend can be configured, so nothing is registered and nothing imported; only a
task job's run (``call_task``) imports it.
"""

from __future__ import annotations

import dataclasses
from inspect import iscoroutinefunction
from typing import Any

from django.utils import timezone
from django.utils.module_loading import import_string

from .core import project_settings
from .core.exceptions import InvalidJob, Unrecoverable
from .definition.options import build_definition
from .definition.registry import registry
from .run import async_body
from .run.state import current_run

PREFIX = "django_tasks."


def job_name(alias: str, queue: str) -> str:
    """The name of the job registered for a task backend's queue
    (``django_tasks.<alias>:<queue>``).
    """
    return f"{PREFIX}{alias}:{queue}"


def register_task_jobs() -> None:
    """One job per (kumiko task backend, queue), with the backend's OPTIONS."""
    for alias, params in project_settings.kumiko_task_backends().items():
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
    return call_task(ctx, task, args, kwargs)


def task_at(path: str) -> Any:
    """The Django task (``@task``) at the dotted ``path``; TypeError if it is something else.

    Typed Any: ``django.tasks.Task`` does not exist on Django 5.2."""
    from django.tasks import Task  # Django 5.2 has no django.tasks

    found = import_string(path)
    if not isinstance(found, Task):
        raise TypeError(f"{path} is not a Django task (@task)")
    return found


def call_task(ctx: Any, path: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
    """In the worker: call the task's function, in the run's tenant and under its guard."""
    from django.tasks.base import (  # Django 5.2 has no django.tasks
        TaskContext,
        TaskResult,
        TaskResultStatus,
    )

    try:
        task = task_at(path)
    except (ImportError, TypeError) as exc:
        raise Unrecoverable(f"the Django task {path} cannot be loaded: {exc}") from exc
    call_args = list(args)
    if task.takes_context:
        running: TaskResult[Any, Any] = TaskResult(
            task=task,
            id=ctx.run_id,
            status=TaskResultStatus.RUNNING,
            enqueued_at=None,
            started_at=timezone.now(),
            finished_at=None,
            last_attempted_at=timezone.now(),
            args=args,
            kwargs=kwargs,
            backend=task.backend,
            errors=[],
            # TaskContext.attempt is len(worker_ids): the run's attempt number.
            worker_ids=[""] * ctx.attempt,
        )
        call_args.insert(0, TaskContext(task_result=running))
    if iscoroutinefunction(task.func):
        state = current_run.get()
        if state is None:  # pragma: no cover - call_task runs only inside a run
            raise Unrecoverable("a Django task ran outside a kumiko run")
        return async_body.call_async(state, task.func, *call_args, **kwargs)
    return task.func(*call_args, **kwargs)
