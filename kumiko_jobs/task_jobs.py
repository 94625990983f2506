"""The kumiko jobs that run Django tasks (``kumiko_jobs.tasks.KumikoBackend``).

A Django ``@task`` is not a kumiko ``@job``: it is a plain function with positional arguments.
Each task becomes kumiko jobs of its own, registered at start-up with the other jobs (so every
worker knows them), named by the task's module path (``billing.tasks.send_receipt``) for the
backend and queue it declares, and ``<module path>:<queue>`` (``<module path>:<alias>:<queue>``
for another kumiko backend) for the others ``using()`` may pick; their title is the task's own
docstring. The admin and the metrics tell tasks apart by these names.

Known tasks: a task is known once its module is imported, because Django validates every
``Task`` with its backend when it is made (``KumikoBackend.validate_task`` notes it here). At
start-up every installed app's ``tasks`` module is imported, so web processes and workers know
the same tasks. A run names its task (the ``task`` argument) and is resolved against the known
tasks only: nothing is ever imported because a run, a message or a row names it.

Runs and messages made before tasks had names of their own name one job per backend and queue,
``django_tasks.<alias>:<queue>`` (stored names never change: docs/design.md, "Public paths");
those jobs stay registered, and their runs resolve their ``task`` argument the same way.

Nothing here imports ``django.tasks`` at import time: on Django 5.2 (no task framework) no
kumiko task backend can be configured, so nothing is registered and nothing imported; only a
task job's run and the discovery (Django 6) reach it.
"""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass
from importlib import import_module
from importlib.util import find_spec
from inspect import iscoroutinefunction
from typing import Any

from django.apps import apps
from django.utils import timezone
from django.utils.module_loading import module_has_submodule

from .core import project_settings
from .core.exceptions import InvalidJob, Unrecoverable
from .definition.job import JobDefinition
from .definition.options import build_definition
from .definition.registry import registry
from .history import results
from .run import async_body
from .run.state import current_run

# The jobs of runs made before each task had its own (one per backend and queue).
PREFIX = "django_tasks."
_OPTION_KEYS = ("RETRIES", "TIMEOUT", "BACKOFF")


@dataclass(frozen=True, slots=True)
class TaskJob:
    """What a task job's name stands for: its backend and queue, and its task (None: a job of
    the old kind, which runs any known task of its backend)."""

    alias: str
    queue: str
    task: str | None


# module path -> the Task as declared (the first one validated: using() copies come later).
_known: dict[str, Any] = {}
# job name -> what it runs; every task job registered at start-up.
_jobs: dict[str, TaskJob] = {}
# module path -> why a known task got no job (its name is not a valid job name, say).
_refused: dict[str, str] = {}


def note_task(task: Any) -> None:
    """Remember a Django task of a kumiko backend (``KumikoBackend.validate_task``)."""
    _known.setdefault(task.module_path, task)


def known_task(path: Any) -> Any:
    """The known task at ``path`` (module path), or None; imports nothing."""
    return _known.get(path) if isinstance(path, str) else None


def job_name(alias: str, queue: str) -> str:
    """The old kind of task job's name, one per backend and queue:
    ``django_tasks.<alias>:<queue>``."""
    return f"{PREFIX}{alias}:{queue}"


def task_job_name(task: Any, alias: str, queue: str) -> str:
    """The name of ``task``'s job for ``alias`` and ``queue``: its module path for the backend
    and queue the task declares (a ``using()`` copy counts as the task it was made from), else
    the path with the queue (and the backend, when another)."""
    path = task.module_path
    declared = _known.get(path, task)
    if alias != declared.backend:
        return f"{path}:{alias}:{queue}"
    return path if queue == declared.queue_name else f"{path}:{queue}"


def task_job(name: str) -> TaskJob | None:
    """What the task job named ``name`` runs; None if it is not a task job."""
    return _jobs.get(name)


def discover_tasks() -> None:
    """Import every installed app's ``tasks`` module (kumiko's own is the backend), so that the
    tasks they declare are known in every process. Not on Django 5.2, which has no task
    framework: an app's ``tasks`` module would import ``django.tasks`` and fail start-up."""
    if find_spec("django.tasks") is None:
        return
    for config in apps.get_app_configs():
        if config.name == "kumiko_jobs" or not module_has_submodule(config.module, "tasks"):
            continue
        import_module(f"{config.name}.tasks")


def register_task_jobs() -> None:
    """The task jobs, with each backend's OPTIONS: one per (known task, backend, queue), and the
    old kind (one per backend and queue) for runs and messages made before."""
    backends = project_settings.kumiko_task_backends()
    if not backends:
        return
    options = {alias: _job_options(alias, params) for alias, params in backends.items()}
    discover_tasks()
    for alias, params in backends.items():
        for queue in params.get("QUEUES") or ["default"]:
            legacy = job_name(alias, queue)
            _register(legacy, TaskJob(alias, queue, None), options[alias], "")
            for path, task in sorted(_known.items()):
                doc = (inspect.getdoc(task.func) or "").split("\n\n")[0]
                name = task_job_name(task, alias, queue)
                try:
                    _register(name, TaskJob(alias, queue, path), options[alias], doc)
                except InvalidJob as exc:
                    # One odd task (a name no job may have) must not stop the project's
                    # start-up; its enqueue says why (tasks.KumikoBackend.enqueue).
                    _refused[path] = str(exc)


def _job_options(alias: str, params: Any) -> dict[str, Any]:
    options = dict(params.get("OPTIONS") or {})
    unknown = set(options) - set(_OPTION_KEYS)
    if unknown:
        raise InvalidJob(
            f"settings.TASKS[{alias!r}]['OPTIONS'] has unknown keys {sorted(unknown)}; "
            "kumiko's task backend takes RETRIES, TIMEOUT and BACKOFF (as @job's retries, "
            "timeout and backoff)."
        )
    return {key.lower(): options[key] for key in _OPTION_KEYS if key in options}


def _register(name: str, job: TaskJob, options: dict[str, Any], description: str) -> None:
    built = build_definition(run_django_task, {**options, "name": name, "queue": job.queue})
    # The task's own docstring is the job's title (none: its name); a task's priority orders
    # its messages in the queue (tasks.KumikoBackend).
    definition = dataclasses.replace(built, description=description, front_by_priority=True)
    registry.register(definition)
    _jobs[name] = job


def why_unregistered(task: Any) -> str:
    """Why a task known at start-up got no job, or ""."""
    return _refused.get(task.module_path, "")


def definition_for(task: Any, alias: str) -> JobDefinition | None:
    """The job a new run of ``task`` (for backend ``alias``, on its queue) is enqueued as, or
    None when the task was not known at start-up."""
    name = task_job_name(task, alias, task.queue_name)
    job = _jobs.get(name)
    if job is None or job.task != task.module_path or name not in registry:
        return None
    return registry.get(name)


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
    return call_task(ctx, resolve_task(ctx.job_name, task), args, kwargs)


def resolve_task(job: str, path: Any) -> Any:
    """The known task a run of the task job ``job`` names, before anything is imported:
    ``Unrecoverable`` for a name no known task has, or another task than the job's own."""
    runs = _jobs.get(job)
    found = known_task(path)
    if runs is None or found is None:
        raise Unrecoverable(
            f"the run names the Django task {str(path)[:200]!r}, which is not a task this "
            "process knows; tasks are known from the installed apps' tasks modules at "
            "start-up, and nothing is imported because a run names it."
        )
    if runs.task is not None and runs.task != path:
        raise Unrecoverable(
            f"the job {job!r} runs the Django task {runs.task!r} only, not {str(path)[:200]!r}."
        )
    return found.using(queue_name=runs.queue, backend=runs.alias)


def call_task(ctx: Any, task: Any, args: list[Any], kwargs: dict[str, Any]) -> Any:
    """In the worker: call the task's function, in the run's tenant and under its guard. A
    return value that is not JSON fails the run, as Django's own backends fail the task."""
    from django.tasks.base import (  # Django 5.2 has no django.tasks
        TaskContext,
        TaskResult,
        TaskResultStatus,
    )

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
        value = async_body.call_async(state, task.func, *call_args, **kwargs)
    else:
        value = task.func(*call_args, **kwargs)
    problem = results.not_json(value)
    if problem:
        # Unrecoverable: the same code returns the same value again, and a retry would repeat
        # the task's effects.
        raise Unrecoverable(
            f"the Django task {task.module_path} returned a value that {problem}; a task's "
            "return value must be JSON (dict, list, str, int, float, bool or None), as for "
            "every Django task backend."
        )
    return value
