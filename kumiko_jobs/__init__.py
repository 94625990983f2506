"""kumiko_jobs: safe multi-tenant background jobs for django-tenants on RQ."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .exceptions import (
    DatabaseAccessDenied,
    EnvelopeError,
    InvalidJob,
    JobNotRegistered,
    KumikoJobsError,
    TenantVisibleError,
    Unrecoverable,
)
from .registry import EscapeHatch, job

if TYPE_CHECKING:
    from .enqueue import RunHandle

__all__ = [
    "DatabaseAccessDenied",
    "EnvelopeError",
    "EscapeHatch",
    "InvalidJob",
    "JobNotRegistered",
    "KumikoJobsError",
    "TenantVisibleError",
    "Unrecoverable",
    "current_user",
    "enqueue",
    "enqueue_at",
    "enqueue_in",
    "job",
]


def enqueue(name: str, /, *, tenant: Any = None, **kwargs: Any) -> RunHandle:
    """Enqueue a job by name: ``kumiko_jobs.enqueue("billing.sync_invoice", invoice_id=7)``."""
    from .enqueue import enqueue as _enqueue

    return _enqueue(name, tenant=tenant, **kwargs)


def enqueue_in(name: str, delay: Any, /, *, tenant: Any = None, **kwargs: Any) -> RunHandle:
    from .enqueue import enqueue_in as _enqueue_in

    return _enqueue_in(name, delay, tenant=tenant, **kwargs)


def enqueue_at(name: str, when: Any, /, *, tenant: Any = None, **kwargs: Any) -> RunHandle:
    from .enqueue import enqueue_at as _enqueue_at

    return _enqueue_at(name, when, tenant=tenant, **kwargs)


def current_user() -> Any:
    """The user a job acts for inside ``ctx.act_as(user)``, else None."""
    from .context import current_user as _current_user

    return _current_user()
