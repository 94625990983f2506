"""What the current thread works for: the run's envelope, the user a job acts as, the alarm.

Context variables that modules low in the house read (signals, log_context, audit): they need
to know which run (if any) is executing, not its state, so they read these instead of the run
side's ``RunState`` (kumiko_jobs.context). The run side sets them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

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
