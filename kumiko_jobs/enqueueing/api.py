"""The public enqueue API: ``@job``, a job's ``enqueue`` / ``enqueue_in`` / ``enqueue_at``, and
``kumiko_jobs.enqueue(name, ...)`` / ``emit``.

``kumiko_jobs/__init__`` hands these on, and Django imports ``kumiko_jobs`` while it loads the
apps, when no model can be imported yet. So this module imports only the definitions at its
top; the enqueueing itself, which writes run rows, is imported at the first call: ``enqueue``,
``enqueue_in``, ``enqueue_at`` and ``emit`` are ``submit.py``'s, handed on through one door
(``_from_submit``), and the workflow calls import ``workflows.py`` likewise.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, overload

from ..definition.job import JobDefinition
from ..definition.options import build_definition
from ..definition.registry import registry

if TYPE_CHECKING:
    from .handle import RunHandle
    from .workflows import Step


class Job(JobDefinition):
    """A job declared with ``@job``: its definition, and the calls that enqueue it."""

    def enqueue(self, *, tenant: Any = None, **kwargs: Any) -> RunHandle:
        """Run the job as soon as the current transaction commits (at once outside one)."""
        return enqueue(self, tenant=tenant, **kwargs)

    def enqueue_many(
        self, items: Sequence[Mapping[str, Any]], *, tenant: Any = None
    ) -> list[RunHandle]:
        """One run per item (a dict of keyword arguments), all checked first, written in one
        COPY (a unique job: one INSERT) and pushed in one round trip on commit; all or nothing
        on bad input."""
        from .bulk import enqueue_many  # imports models: see the module docstring

        return enqueue_many(self, items, tenant=tenant)

    def enqueue_in(
        self, delay: timedelta | float, *, tenant: Any = None, **kwargs: Any
    ) -> RunHandle:
        """Run the job ``delay`` (seconds or a timedelta) after the transaction commits."""
        return enqueue_in(self, delay, tenant=tenant, **kwargs)

    def enqueue_at(self, when: datetime, *, tenant: Any = None, **kwargs: Any) -> RunHandle:
        """Run the job at ``when`` (timezone-aware), pushed when the transaction commits."""
        return enqueue_at(self, when, tenant=tenant, **kwargs)

    def step(self, *, key: str | None = None, after: Any = (), **kwargs: Any) -> Step:
        """This job call as a workflow step (docs/workflows.md); ``after``: the steps it waits
        for; ``key``: its name in the workflow (and in ``workflow_results``)."""
        from .workflows import Step  # imports models: see the module docstring

        return Step(self, kwargs, key=key, after=after)


def define(func: Callable[..., Any], options: Mapping[str, Any]) -> Job:
    """Validate ``@job`` options for ``func`` (``build_definition``) and return its ``Job``."""
    definition = build_definition(func, options)
    return Job(**{f.name: getattr(definition, f.name) for f in dataclasses.fields(definition)})


@overload
def job(func: Callable[..., Any], /) -> Job:
    """``@job`` without options: the function becomes a registered job with the defaults."""
    ...


@overload
def job(func: None = None, /, **options: Any) -> Callable[[Callable[..., Any]], Job]:
    """``@job(retries=3, ...)``: a decorator that registers the function with these options."""
    ...


def job(
    func: Callable[..., Any] | None = None, /, **options: Any
) -> Job | Callable[[Callable[..., Any]], Job]:
    """Declare a job: ``@job`` or ``@job(retries=3, queue="default", ...)``."""

    def decorate(f: Callable[..., Any]) -> Job:
        declared = define(f, options)
        registry.register(declared)
        return declared

    if func is not None:
        return decorate(func)
    return decorate


def _from_submit(name: str) -> Callable[..., Any]:
    """``submit.<name>``, imported at its first call (see the module docstring): the one door
    through which ``enqueue``, ``enqueue_in``, ``enqueue_at`` and ``emit`` reach the code that
    writes run rows, so that each of them is written once, in ``submit.py``."""

    def call(*args: Any, **kwargs: Any) -> Any:
        from . import submit  # imports models: see the module docstring

        return getattr(submit, name)(*args, **kwargs)

    call.__name__ = call.__qualname__ = name
    call.__doc__ = f"``kumiko_jobs.enqueueing.submit.{name}``: {_SUMMARIES[name]}"
    return call


# What each one does, for ``help()`` before the first call has imported ``submit``.
_SUMMARIES = {
    "enqueue": "run a job, or a job by name, as soon as the transaction commits.",
    "enqueue_in": "``enqueue``, ``delay`` (seconds or a timedelta) later.",
    "enqueue_at": "``enqueue``, due at ``when`` (timezone-aware).",
    "emit": "run every job declared ``on=event`` (and matching its ``where=``), on commit.",
}

if TYPE_CHECKING:
    from .submit import emit as emit
    from .submit import enqueue as enqueue
    from .submit import enqueue_at as enqueue_at
    from .submit import enqueue_in as enqueue_in
else:
    enqueue = _from_submit("enqueue")
    enqueue_in = _from_submit("enqueue_in")
    enqueue_at = _from_submit("enqueue_at")
    emit = _from_submit("emit")


def chain(*parts: Any) -> Any:
    """Each part waits for the one before it (docs/workflows.md)."""
    from .workflows import chain as make  # imports models: see the module docstring

    return make(*parts)


def group(parts: Any, *, then: Any = None) -> Any:
    """Parts side by side; ``then``: a callback that runs once when all have finished."""
    from .workflows import group as make  # imports models: see the module docstring

    return make(parts, then=then)


def workflow(
    part: Any,
    *,
    name: str,
    stop_on_failure: bool = False,
    sequential: bool = False,
    sequential_key: str | None = None,
) -> Any:
    """A workflow of steps, to ``.enqueue(tenant=...)`` as one unit (docs/workflows.md);
    ``sequential``: one of this name per tenant at a time, the next waits its turn;
    ``sequential_key``: the same per tenant and key (``str(account.pk)``)."""
    from .workflows import workflow as make  # imports models: see the module docstring

    return make(
        part,
        name=name,
        stop_on_failure=stop_on_failure,
        sequential=sequential,
        sequential_key=sequential_key,
    )


def cancel_workflow(workflow_id: Any, *, by: Any = None) -> bool:
    """Cancel every step of the workflow that has not finished; False if it had finished, or
    if it is not the caller's: from a tenant's context another tenant's or a system workflow
    is answered as an unknown id (as its reads are)."""
    import uuid

    from .workflow_release import cancel  # imports models: see the module docstring

    return cancel(uuid.UUID(str(workflow_id)), by=by)
