"""``KumikoBackend``: Django 6's task framework (``django.tasks``) on kumiko_jobs.

``settings.TASKS = {"default": {"BACKEND": "kumiko_jobs.tasks.KumikoBackend"}}`` makes every
``@task`` function enqueue a kumiko run of its own job (named by its module path,
``task_jobs``): in the current tenant (never silently public), with its history, the database
guard, retries (``OPTIONS["RETRIES"]``), timeouts and the push on commit. docs/tasks.md
describes the mapping; in short:

- ``enqueue()`` returns a ``TaskResult`` whose ``id`` is the run id; ``get_result(id)`` reads
  the run, in the caller's tenant only (``history.run_reads``: another tenant's run does not
  exist for a tenant's context, and only operators get tracebacks): queued or deferred ->
  READY, running -> RUNNING, succeeded -> SUCCESSFUL (with the kept result as
  ``return_value``), failed and cancelled -> FAILED (one ``TaskError`` per failed attempt, and
  one ``TaskCancelled`` for a cancellation). A return value that is not JSON fails the run.
- ``priority`` is the run's priority level in its queue (kumiko's fair dequeue: higher first,
  FIFO within a level, fair between tenants within a level), for every message of the run.
- ``queue_name`` is the RQ queue (one of the backend's ``QUEUES``); ``run_after`` delays the run
  through rq-scheduler; ``takes_context`` passes a ``TaskContext`` whose ``attempt`` is the
  run's attempt.

This module needs Django >= 6.0; on Django 5.2 importing it raises ImportError, and nothing
else in kumiko_jobs imports it.
"""

from __future__ import annotations

import builtins
from datetime import datetime
from typing import Any

import django

try:
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import (
        Task,
        TaskError,
        TaskResult,
        TaskResultStatus,
    )
    from django.tasks.exceptions import InvalidTask, TaskException, TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued
except ImportError as exc:  # Django 5.2: no task framework
    raise ImportError(
        "kumiko_jobs.tasks.KumikoBackend needs Django's task framework (django.tasks, Django "
        f"6.0 or later); this is Django {django.get_version()}. Remove it from "
        "settings.TASKS, or declare the work as a kumiko @job."
    ) from exc

from django.db import connection
from django.utils import timezone
from django.utils.json import normalize_json

from . import task_jobs
from .core.exceptions import InvalidJob
from .core.project_settings import public_schema_name
from .enqueueing import submit as enqueueing
from .history import run_reads
from .models import JobAttempt, JobRun, RunStatus

__all__ = ["KumikoBackend", "TaskCancelled"]


class TaskCancelled(TaskException):
    """The error of a task whose run was cancelled (by an operator, or replaced)."""


_STATUS = {
    RunStatus.QUEUED: TaskResultStatus.READY,
    RunStatus.DEFERRED: TaskResultStatus.READY,
    RunStatus.RUNNING: TaskResultStatus.RUNNING,
    RunStatus.SUCCEEDED: TaskResultStatus.SUCCESSFUL,
    RunStatus.FAILED: TaskResultStatus.FAILED,
    RunStatus.CANCELLED: TaskResultStatus.FAILED,
}


class KumikoBackend(BaseTaskBackend):
    """Django's task backend on kumiko runs: a ``@task`` enqueues a run of the job registered for
    its backend and queue, in the current tenant, and its result is read back from the run's
    history.
    """

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def validate_task(self, task: Task[Any, Any]) -> None:
        """Django's checks, then the task is known: runs resolve their task against the known
        ones, never by importing what they name (``task_jobs``)."""
        super().validate_task(task)
        task_jobs.note_task(task)

    def enqueue(self, task: Task[Any, Any], args: Any, kwargs: Any) -> TaskResult[Any, Any]:
        """Enqueue the task as a run in the current tenant (delayed by ``run_after``) and return its
        ``TaskResult``, whose id is the run id; a task enqueued from public, with no tenant, is
        refused.
        """
        self.validate_task(task)
        _refuse_public_schema(task)
        definition = task_jobs.definition_for(task, self.alias)
        if definition is None and task_jobs.why_unregistered(task):
            raise InvalidTask(
                f"The task {task.module_path} has no kumiko job: {task_jobs.why_unregistered(task)}"
            )
        if definition is None:
            raise InvalidTask(
                f"The task {task.module_path} (backend {self.alias!r}, queue "
                f"{task.queue_name!r}) was not known when kumiko_jobs started: tasks are found "
                "in the installed apps' tasks modules (<app>/tasks.py) at start-up, in every "
                "process. Declare it there (or import its module from there), and restart "
                "after changing settings.TASKS."
            )
        call_args: Any = normalize_json(list(args))  # tuples to lists, as Django does
        call_kwargs: Any = normalize_json(dict(kwargs))
        call = {
            "task": task.module_path,
            "args": call_args,
            "kwargs": call_kwargs,
            "priority": task.priority,
            "run_after": task.run_after.isoformat() if task.run_after else None,
        }
        try:
            if task.run_after is not None:
                handle = enqueueing.enqueue_at(definition, task.run_after, **call)
            else:
                handle = enqueueing.enqueue(definition, **call)
        except InvalidJob as exc:  # Django's callers catch InvalidTask
            raise InvalidTask(str(exc)) from exc
        result: TaskResult[Any, Any] = TaskResult(
            task=task,
            id=handle.run_id,
            status=TaskResultStatus.READY,
            enqueued_at=timezone.now(),
            started_at=None,
            finished_at=None,
            last_attempted_at=None,
            args=call_args,
            kwargs=call_kwargs,
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )
        task_enqueued.send(type(self), task_result=result)
        return result

    def get_result(self, result_id: str) -> TaskResult[Any, Any]:
        """The task's result read from its run's row: status, kept return value, and one error per
        failed attempt (or a ``TaskCancelled``).

        From a tenant's context only that tenant's runs are found: another tenant's run raises
        ``TaskResultDoesNotExist``, as an unknown id does, and the errors carry no traceback
        (operators only). Operators (the public schema) read any run, tracebacks included."""
        operator = run_reads.reader_schema() is None
        run, attempts = run_reads.load_run_and_attempts(result_id, with_traceback=operator)
        job = task_jobs.task_job(run.job_name) if run is not None else None
        if run is None or job is None or job.alias != self.alias:
            raise TaskResultDoesNotExist(result_id)
        payload = run.payload if isinstance(run.payload, dict) else {}
        known = task_jobs.known_task(payload.get("task"))
        if known is None or (job.task is not None and job.task != payload.get("task")):
            # Resolved against the known tasks, never imported by the name the row holds.
            raise TaskResultDoesNotExist(f"{result_id}: its task is not a known task")
        try:
            task = known.using(
                priority=payload.get("priority", 0),
                queue_name=run.queue,
                run_after=_parse(payload.get("run_after")),
                backend=self.alias,
            )
        except (TypeError, ValueError, InvalidTask) as exc:
            raise TaskResultDoesNotExist(f"{result_id}: its task cannot be loaded ({exc})") from exc
        result: TaskResult[Any, Any] = TaskResult(
            task=task,
            id=run.run_id.hex,
            status=_STATUS[RunStatus(run.status)],
            enqueued_at=run.queued_at,
            started_at=run.started_at,
            finished_at=run.finished_at,
            last_attempted_at=run.started_at,
            args=payload.get("args", []),
            kwargs=payload.get("kwargs", {}),
            backend=self.alias,
            errors=_errors(run, attempts, operator),
            worker_ids=[
                worker
                for outcome, _, _, _, worker in attempts
                if outcome != JobAttempt.Outcome.DEFERRED and outcome != JobAttempt.Outcome.DROPPED
            ],
        )
        if run.status == RunStatus.SUCCEEDED:
            object.__setattr__(result, "_return_value", run.result)
        return result


def _refuse_public_schema(task: Task[Any, Any]) -> None:
    """A task runs in a tenant; from the public schema there is none, and Django's ``enqueue()``
    takes no ``tenant=``: the way in is the tenant's context around the call."""
    public = public_schema_name()
    if getattr(connection, "schema_name", public) != public:
        return
    raise InvalidTask(
        f"The task {task.module_path} was enqueued from the public schema, where no tenant is "
        "current: a task runs in a tenant, and enqueue() takes no tenant=. Enqueue it inside "
        "the tenant: `with tenant_context(tenant): task.enqueue(...)` or `with "
        "schema_context('<schema>'): ...` (django_tenants.utils), or from the tenant's "
        "request. Work for no tenant belongs in a @job(system=True)."
    )


def _errors(
    run: JobRun, attempts: list[tuple[str, str, str, str, str]], operator: bool
) -> list[TaskError]:
    """One ``TaskError`` per failed attempt (and one for a cancellation or a failure without an
    attempt). Tracebacks and error messages are the operators' (the admin shows them to
    operators only): a tenant's context gets the exception's class and a pointer instead."""
    withheld = f"(traceback kept for operators: kumiko_jobs run {run.run_id.hex})"
    errors = [
        TaskError(
            exception_class_path=_class_path(kind, text),
            traceback=(text or message) if operator else f"{_class_path(kind, '')} {withheld}",
        )
        for outcome, text, kind, message, _ in attempts
        if outcome in (JobAttempt.Outcome.FAILED, JobAttempt.Outcome.RETRYING)
    ]
    if run.status == RunStatus.CANCELLED:
        reason = (run.error_message or "cancelled") if operator else "cancelled"
        errors.append(
            TaskError(
                exception_class_path=f"{__name__}.TaskCancelled",
                traceback=f"TaskCancelled: {reason}",
            )
        )
    elif run.status == RunStatus.FAILED and not errors:  # failed closed without an attempt
        path = _class_path(run.error_type, "")
        errors.append(
            TaskError(
                exception_class_path=path,
                traceback=f"{run.error_type}: {run.error_message}"
                if operator
                else f"{path} {withheld}",
            )
        )
    return errors


def _parse(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value) if value else None


def _class_path(type_name: str, traceback: str) -> str:
    """The exception's dotted path: Python's traceback names it (``module.Class: message``)
    unless it is a builtin; the run keeps only the class name."""
    lines = [line for line in traceback.splitlines() if line.strip()]
    head = lines[-1].split(":", 1)[0].strip() if lines else type_name
    if "." in head and " " not in head:
        return head
    name = head or type_name
    if isinstance(getattr(builtins, name, None), type):
        return f"builtins.{name}"
    return "builtins.Exception"  # unknown: still a class TaskError.exception_class resolves
