"""What the current thread works for: the run's envelope, the user a job acts as, the alarm.

Context variables that modules low in the house read (signals, log_context, audit): they need
to know which run (if any) is executing, not its state, so they read these instead of the run
side's ``RunState`` (kumiko_jobs.context). The run side sets them.

Every context variable of kumiko is named ``kumiko_jobs_...`` (``OWN_PREFIX``): each attempt runs
in a fresh context (``attempt_context``) where none of them is set but the worker's alarm, so
nothing one run sets, by mistake or on purpose, reaches the next (docs/guard.md, "Nothing
outlives a run").
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from django.utils import timezone, translation

if TYPE_CHECKING:
    from .envelope import Envelope

# The envelope of the run executing in this thread (set beside context.current_run).
current_envelope: ContextVar[Envelope | None] = ContextVar(
    "kumiko_jobs_current_envelope", default=None
)
# Cancels the job's timeout alarm; set by a kumiko worker's death penalty while it is armed. The
# runner calls it when the job body is done: the timeout bounds the job's code, and must not
# interrupt the history writes after it.
job_alarm: ContextVar[Callable[[], None] | None] = ContextVar("kumiko_jobs_job_alarm", default=None)
# The user app code acts for inside ``ctx.act_as(user)``; read with kumiko_jobs.current_user().
_acting_user: ContextVar[Any] = ContextVar("kumiko_jobs_acting_user", default=None)


# The name every context variable of kumiko starts with (tests/integration/test_outlives_run.py
# checks that each one does).
OWN_PREFIX = "kumiko_jobs_"


def attempt_context() -> contextvars.Context:
    """A copy of the caller's context for one attempt, minus every kumiko variable but the alarm.

    What the job sets in it (a ``ContextVar`` of its own, ``translation.activate()``,
    ``timezone.activate()``: Django keeps both in context-local storage) ends with the attempt.
    kumiko's own variables start unset whatever the caller's context holds: the worker's outer
    context is never the run's, and a variable the job's code set there (it cannot from inside
    the copy) must not steer the next run. The worker's alarm (``job_alarm``, set by its death
    penalty around the run) is the one kept.
    """
    fresh = contextvars.Context()
    for var, value in contextvars.copy_context().items():
        if var.name.startswith(OWN_PREFIX) and var is not job_alarm:
            continue
        fresh.run(var.set, value)
    return fresh


def reset_locale() -> None:
    """Django's active translation and time zone back to the settings' defaults (before and
    after each attempt, in the worker's own context)."""
    translation.deactivate()
    timezone.deactivate()


def current_user() -> Any:
    """The user a job acts for inside ``ctx.act_as(user)``, else None."""
    return _acting_user.get()


@contextlib.contextmanager
def acting_as(user: Any) -> Iterator[None]:
    """``current_user()`` is ``user`` inside the block (``JobContext.act_as``)."""
    token = _acting_user.set(user)
    try:
        yield
    finally:
        _acting_user.reset(token)


@contextlib.contextmanager
def running(envelope: Envelope) -> Iterator[None]:
    """``current_envelope`` is ``envelope`` inside the block (the run's pipeline)."""
    token = current_envelope.set(envelope)
    try:
        yield
    finally:
        current_envelope.reset(token)
