"""Spans whose telemetry cannot fail the work they describe.

The OpenTelemetry SDK calls the project's span processors inside ``start_span`` and
``span.end()`` and lets what they raise through: a processor that raised made every enqueue
and every run fail (issue 23; an exporter is caught by the SDK's own processors, a processor
is not). ``GuardedTracer`` starts and ends kumiko's spans so that such an error is logged and
the work goes on, without a span when none could be started. The body's own exceptions pass
through unchanged.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from opentelemetry import trace

logger = logging.getLogger("kumiko_jobs.telemetry")


class GuardedTracer:
    """``start_as_current_span`` of ``tracer``, where telemetry errors are logged, not raised."""

    def __init__(self, tracer: trace.Tracer) -> None:
        self.tracer = tracer

    @contextmanager
    def start_as_current_span(self, name: str, **kwargs: Any) -> Iterator[trace.Span]:
        try:
            manager: AbstractContextManager[trace.Span] = self.tracer.start_as_current_span(
                name, **kwargs
            )
            span = manager.__enter__()
        except Exception:
            logger.warning(
                "span %s not started: telemetry failed; the work goes on", name, exc_info=True
            )
            yield trace.INVALID_SPAN
            return
        try:
            yield span
        except BaseException as exc:
            _close(manager, name, exc)
            raise
        _close(manager, name, None)


def _close(
    manager: AbstractContextManager[trace.Span], name: str, exc: BaseException | None
) -> None:
    """End the span (recording ``exc`` as the SDK does); a telemetry error is only logged."""
    try:
        if exc is None:
            manager.__exit__(None, None, None)
        else:
            manager.__exit__(type(exc), exc, exc.__traceback__)
    except Exception as error:
        if error is exc:
            return  # the SDK re-raised the body's own exception: the caller raises it
        logger.warning(
            "span %s not ended cleanly: telemetry failed; the work goes on", name, exc_info=True
        )
