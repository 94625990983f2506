"""kumiko_jobs: safe multi-tenant background jobs for django-tenants on RQ."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

# The enqueue package is loaded here, before the enqueue() function below is defined: loading a
# submodule binds its name on this package, which would replace the function if it came later.
from . import enqueue as _enqueue_package  # noqa: F401
from .core.current import current_user
from .exceptions import (
    DatabaseAccessDenied,
    EnvelopeError,
    InvalidJob,
    JobCancelled,
    JobNotRegistered,
    KumikoJobsError,
    TenantVisibleError,
    Unrecoverable,
)
from .registry import EscapeHatch, job

if TYPE_CHECKING:
    from .enqueueing import RunHandle

__all__ = [
    "DatabaseAccessDenied",
    "EnvelopeError",
    "EscapeHatch",
    "InvalidJob",
    "JobCancelled",
    "JobNotRegistered",
    "KumikoJobsError",
    "TenantVisibleError",
    "Unrecoverable",
    "current_user",
    "emit",
    "enqueue",
    "enqueue_at",
    "enqueue_in",
    "job",
]


def enqueue(name: str, /, *, tenant: Any = None, **kwargs: Any) -> RunHandle:
    """Enqueue a job by name: ``kumiko_jobs.enqueueing("billing.sync_invoice", invoice_id=7)``."""
    from .enqueueing import enqueue as _enqueue

    return _enqueue(name, tenant=tenant, **kwargs)


def enqueue_in(name: str, delay: Any, /, *, tenant: Any = None, **kwargs: Any) -> RunHandle:
    from .enqueueing import enqueue_in as _enqueue_in

    return _enqueue_in(name, delay, tenant=tenant, **kwargs)


def enqueue_at(name: str, when: Any, /, *, tenant: Any = None, **kwargs: Any) -> RunHandle:
    from .enqueueing import enqueue_at as _enqueue_at

    return _enqueue_at(name, when, tenant=tenant, **kwargs)


def emit(event: str, /, *, tenant: Any = None, **payload: Any) -> list[RunHandle]:
    """Run every job declared ``on=event`` (and matching its ``where=``), on commit."""
    from .enqueueing import emit as _emit

    return _emit(event, tenant=tenant, **payload)
