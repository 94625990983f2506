"""Signals sent as runs move through their states.

Receivers get ``run_id``, ``job_name``, ``schema_name`` (None for system runs), ``attempt``,
``outcome`` and ``error`` (the exception, or None); ``job_dropped`` also gets ``reason``.
``job_dropped``'s outcome says why: ``dropped`` (a message not run: duplicate, stale, replaced,
inactive tenant), ``cancelled`` (an operator cancelled the running run), ``skipped``
(``concurrency="skip"`` refused an enqueue) or ``capped`` (``max_per_tenant`` refused one);
the words are ``models.RunStatus`` / ``JobAttempt.Outcome`` values. A
receiver that raises is logged and ignored: a broken receiver never changes a run's outcome.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from django.dispatch import Signal

from .core.current import current_envelope
from .core.exceptions import InvalidJob

logger = logging.getLogger("kumiko_jobs.signals")


class RunSignal(Signal):
    """A signal whose receivers cannot be changed from inside a run.

    Receivers run for every later run, after its guard and tenant are gone: one connected by a
    job would run with every other tenant's run ids and errors, outside any guard, and one
    disconnected by a job would silence the project's own receivers for every tenant.
    """

    def connect(
        self,
        receiver: Callable[..., Any],
        sender: object | None = None,
        weak: bool = True,
        dispatch_uid: Any | None = None,
    ) -> None:
        """Django's ``connect``, refused inside a run: a receiver connected by a job would see every
        later run, of every tenant, outside any guard.
        """
        _refuse_inside_a_run("connect")
        super().connect(receiver, sender, weak, dispatch_uid)

    def disconnect(
        self,
        receiver: Callable[..., Any] | None = None,
        sender: object | None = None,
        dispatch_uid: Any | None = None,
    ) -> bool:
        """Django's ``disconnect``, refused inside a run: a job must not silence the project's
        receivers for every tenant.
        """
        _refuse_inside_a_run("disconnect")
        return bool(super().disconnect(receiver, sender, dispatch_uid))


def _refuse_inside_a_run(action: str) -> None:
    envelope = current_envelope.get()
    if envelope is not None:
        raise InvalidJob(
            f"Job {envelope.job!r} tried to {action} a kumiko_jobs signal receiver during "
            "its run. Connect receivers once, at start-up (in an AppConfig.ready()), never "
            "inside a job."
        )


job_queued = RunSignal()
job_started = RunSignal()
job_succeeded = RunSignal()
job_failed = RunSignal()
job_deferred = RunSignal()
job_dropped = RunSignal()


def send(signal: Signal, **kwargs: Any) -> None:
    """Send ``signal`` to its receivers, if any; a receiver that raises is logged and ignored, so a
    broken receiver never changes a run's outcome.
    """
    if not signal.receivers:
        return
    for receiver, result in signal.send_robust(sender=None, **kwargs):
        if isinstance(result, BaseException):
            logger.error(
                "kumiko_jobs signal receiver %r raised %r",
                receiver,
                result,
                exc_info=(type(result), result, result.__traceback__),
            )
