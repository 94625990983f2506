"""kumiko_jobs: safe multi-tenant background jobs for django-tenants on RQ."""

from __future__ import annotations

from .core.current import current_user
from .core.exceptions import (
    DatabaseAccessDenied,
    EnvelopeError,
    InvalidJob,
    JobCancelled,
    JobNotRegistered,
    KumikoJobsError,
    TenantVisibleError,
    Unrecoverable,
    WaitTimeout,
)
from .definition.job import EscapeHatch
from .enqueueing.api import (
    cancel_workflow,
    chain,
    emit,
    enqueue,
    enqueue_at,
    enqueue_in,
    group,
    job,
    workflow,
)

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
    "WaitTimeout",
    "cancel_workflow",
    "chain",
    "current_user",
    "emit",
    "enqueue",
    "enqueue_at",
    "enqueue_in",
    "group",
    "job",
    "workflow",
]
