"""Flush OpenTelemetry providers before a forked work horse exits with ``os._exit``."""

from __future__ import annotations

import logging

logger = logging.getLogger("kumiko_jobs.telemetry")


def flush(timeout_millis: int = 5000) -> None:
    """Flush the tracer and meter providers (those that can) within ``timeout_millis``, so a work
    horse's spans and metrics are not lost when it exits; a failure is only logged.
    """
    try:
        from opentelemetry import metrics, trace
    except ImportError:  # pragma: no cover - opentelemetry-api is a dependency
        return
    for provider in (trace.get_tracer_provider(), metrics.get_meter_provider()):
        force_flush = getattr(provider, "force_flush", None)
        if force_flush is None:
            continue
        try:
            force_flush(timeout_millis)
        except Exception:  # a telemetry outage must not fail the job
            logger.warning("could not flush telemetry", exc_info=True)
