"""Run context on log records, and secret scrubbing (the attempts' lines: kumiko_jobs.run.report).

``RunContextFilter`` is meant for handlers (a handler filter sees records propagated from
every logger, a logger filter only its own)::

    LOGGING = {
        "filters": {"kumiko_run": {"()": "kumiko_jobs.log_context.RunContextFilter"}},
        "handlers": {"console": {"class": "logging.StreamHandler", "filters": ["kumiko_run"]}},
    }

Scrubbing (kumiko_jobs.core.scrubbing) is a best effort on text whose shape we do not control
(exception messages): values after a key that matches one of ``KUMIKO_JOBS["SENSITIVE_KEYS"]``,
URL passwords and bearer tokens are hidden, in time linear in the (truncated) text. Payload
values are never logged at all.
"""

from __future__ import annotations

import logging
from typing import Any

from opentelemetry import trace

from .core import conf, scrubbing
from .core.current import current_envelope
from .core.scrubbing import DEFAULT_LIMIT, MASK
from .origin import peek_correlation_id

__all__ = ["MASK", "RunContextFilter", "context_fields", "scrub"]
# Record attributes set by RunContextFilter; "-" outside a run so that format strings such as
# "%(job)s" work for every record that reaches the handler.
FIELDS = ("job", "run_id", "tenant", "attempt", "correlation_id", "trace_id", "span_id")
_NONE = "-"


class RunContextFilter(logging.Filter):
    """Adds ``job``, ``run_id``, ``tenant``, ``attempt``, ``correlation_id``, ``trace_id`` and
    ``span_id`` to records. It never drops a record, and never overwrites an attribute the
    call site already set through ``extra=``."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Add the run's fields to ``record`` (keeping any the call site set), and keep every
        record.
        """
        for name, value in context_fields().items():
            if not hasattr(record, name):
                setattr(record, name, value)
        return True


def context_fields() -> dict[str, Any]:
    """The run (or request) this thread works for, as plain log fields."""
    values: dict[str, Any] = dict.fromkeys(FIELDS, _NONE)
    env = current_envelope.get()
    if env is not None:
        values.update(
            job=env.job,
            run_id=env.run_id,
            tenant=env.schema or "public",
            attempt=env.attempt,
            correlation_id=env.correlation_id or _NONE,
        )
    else:
        # Request code logs with the same correlation id its jobs will carry.
        correlation_id = peek_correlation_id()
        if correlation_id is not None:
            values["correlation_id"] = correlation_id
    span_context = trace.get_current_span().get_span_context()
    if span_context.is_valid:
        values["trace_id"] = format(span_context.trace_id, "032x")
        values["span_id"] = format(span_context.span_id, "016x")
    return values


# --- scrubbing ------------------------------------------------------------------------------


def scrub(text: str, patterns: tuple[str, ...] | None = None, *, limit: int = DEFAULT_LIMIT) -> str:
    """``text`` truncated to ``limit`` characters, then with the values of sensitive keys
    (``SENSITIVE_KEYS``, or ``patterns``), URL passwords and bearer tokens replaced by ``***``.

    Linear time whatever the text (see kumiko_jobs.core.scrubbing).
    """
    if not text:
        return text
    return scrubbing.scrub(
        text, conf.get().SENSITIVE_KEYS if patterns is None else patterns, limit=limit
    )
