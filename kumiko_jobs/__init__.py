"""kumiko_jobs: safe multi-tenant background jobs for django-tenants on RQ."""

from __future__ import annotations

from typing import Any

from .enqueue.api import emit, enqueue, enqueue_at, enqueue_in, job
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
from .registry import EscapeHatch

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


def current_user() -> Any:
    """The user a job acts for inside ``ctx.act_as(user)``, else None."""
    from .context import current_user as _current_user

    return _current_user()
