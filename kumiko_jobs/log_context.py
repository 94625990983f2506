"""Run context on log records, the failure line of every failed attempt, and secret scrubbing.

``RunContextFilter`` is meant for handlers (a handler filter sees records propagated from
every logger, a logger filter only its own)::

    LOGGING = {
        "filters": {"kumiko_run": {"()": "kumiko_jobs.log_context.RunContextFilter"}},
        "handlers": {"console": {"class": "logging.StreamHandler", "filters": ["kumiko_run"]}},
    }

Scrubbing (kumiko_jobs.scrubbing) is a best effort on text whose shape we do not control
(exception messages): values after a key that matches one of ``KUMIKO_JOBS["SENSITIVE_KEYS"]``,
URL passwords and bearer tokens are hidden, in time linear in the (truncated) text. Payload
values are never logged at all.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

from opentelemetry import trace

from . import conf, scrubbing
from .context import current_run
from .scrubbing import DEFAULT_LIMIT, MASK

if TYPE_CHECKING:
    from .context import RunState

logger = logging.getLogger("kumiko_jobs.runs")

__all__ = ["MASK", "RunContextFilter", "context_fields", "log_failed_attempt", "scrub"]
# Record attributes set by RunContextFilter; "-" outside a run so that format strings such as
# "%(job)s" work for every record that reaches the handler.
FIELDS = ("job", "run_id", "tenant", "attempt", "correlation_id", "trace_id", "span_id")
_NONE = "-"
_MAX_MESSAGE = 1000


class RunContextFilter(logging.Filter):
    """Adds ``job``, ``run_id``, ``tenant``, ``attempt``, ``correlation_id``, ``trace_id`` and
    ``span_id`` to records. It never drops a record, and never overwrites an attribute the
    call site already set through ``extra=``."""

    def filter(self, record: logging.LogRecord) -> bool:
        for name, value in context_fields().items():
            if not hasattr(record, name):
                setattr(record, name, value)
        return True


def context_fields() -> dict[str, Any]:
    """The run (or request) this thread works for, as plain log fields."""
    values: dict[str, Any] = dict.fromkeys(FIELDS, _NONE)
    state = current_run.get()
    if state is not None:
        env = state.envelope
        values.update(
            job=env.job,
            run_id=env.run_id,
            tenant=env.schema or "public",
            attempt=env.attempt,
            correlation_id=env.correlation_id or _NONE,
        )
    else:
        # Request code logs with the same correlation id its jobs will carry. Read without
        # creating one: origin.correlation_id() would invent a fresh id outside a request.
        from .origin import _current as request_origin

        origin = request_origin.get()
        if origin is not None:
            values["correlation_id"] = origin.correlation_id
    span_context = trace.get_current_span().get_span_context()
    if span_context.is_valid:
        values["trace_id"] = format(span_context.trace_id, "032x")
        values["span_id"] = format(span_context.span_id, "016x")
    return values


# --- scrubbing ------------------------------------------------------------------------------


def scrub(text: str, patterns: tuple[str, ...] | None = None, *, limit: int = DEFAULT_LIMIT) -> str:
    """``text`` truncated to ``limit`` characters, then with the values of sensitive keys
    (``SENSITIVE_KEYS``, or ``patterns``), URL passwords and bearer tokens replaced by ``***``.

    Linear time whatever the text (see kumiko_jobs.scrubbing).
    """
    if not text:
        return text
    return scrubbing.scrub(
        text, conf.get().SENSITIVE_KEYS if patterns is None else patterns, limit=limit
    )


# --- the outcome lines ----------------------------------------------------------------------


def log_attempt_outcome(state: RunState, outcome: str, duration_ms: float) -> None:
    """One INFO line for an attempt that did not fail: what ran, for whom, and how it ended.

    It replaces RQ's own lines, which name the message by its RQ id and a truncated JSON
    envelope and say "Job OK" even after a failed attempt (kumiko records the failure and
    returns normally; the worker hides those lines). Failed attempts get the line below.
    """
    env = state.envelope
    tenant = env.schema or "public"
    logger.info(
        "run %s: job=%s tenant=%s run_id=%s attempt=%d/%d duration_ms=%.0f",
        outcome,
        env.job,
        tenant,
        env.run_id,
        env.attempt,
        state.max_attempts,
        duration_ms,
        extra={
            "kumiko_job": env.job,
            "kumiko_run_id": env.run_id,
            "kumiko_tenant": tenant,
            "kumiko_attempt": env.attempt,
            "kumiko_outcome": outcome,
        },
    )


# --- the failure line -----------------------------------------------------------------------


def log_failed_attempt(state: RunState, outcome: str) -> None:
    """One line per failed attempt: WARNING when it will be retried, ERROR when it is final.

    Only names, counters and the scrubbed error reach the log: the arguments of the job (its
    payload) and the traceback stay in the operator-only attempt record.
    """
    env, described = state.envelope, state.described_error()
    final = outcome == "failed"
    error_type = described.type_name if described is not None else _NONE
    # Truncated before it is scrubbed: the text may be megabytes (scrubbing.py).
    message = scrub(described.message, limit=_MAX_MESSAGE) if described is not None else ""
    fields = {
        "kumiko_job": env.job,
        "kumiko_run_id": env.run_id,
        "kumiko_tenant": env.schema or "public",
        "kumiko_attempt": env.attempt,
        "kumiko_max_attempts": state.max_attempts,
        "kumiko_final": final,
        "kumiko_error_type": error_type,
        "kumiko_error_message": message,
    }
    logger.log(
        logging.ERROR if final else logging.WARNING,
        # logfmt-style and one line whatever the error text: json.dumps escapes newlines.
        "attempt failed: job=%s run_id=%s tenant=%s attempt=%d/%d final=%s error_type=%s error=%s",
        env.job,
        env.run_id,
        fields["kumiko_tenant"],
        env.attempt,
        state.max_attempts,
        "true" if final else "false",
        error_type,
        json.dumps(message),
        extra=fields,
    )
