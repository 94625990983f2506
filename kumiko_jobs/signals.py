"""Signals sent as runs move through their states.

Receivers get ``run_id``, ``job_name``, ``schema_name`` (None for system runs), ``attempt``,
``outcome`` and ``error`` (the exception, or None); ``job_dropped`` also gets ``reason``. A
receiver that raises is logged and ignored: a broken receiver never changes a run's outcome.
"""

from __future__ import annotations

import logging
from typing import Any

from django.dispatch import Signal

logger = logging.getLogger("kumiko_jobs.signals")

job_queued = Signal()
job_started = Signal()
job_succeeded = Signal()
job_failed = Signal()
job_deferred = Signal()
job_dropped = Signal()


def send(signal: Signal, **kwargs: Any) -> None:
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
