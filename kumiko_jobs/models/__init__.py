"""Run history, kept in the public schema (the app belongs in SHARED_APPS).

Rows carry the tenant's schema name rather than a foreign key: history must outlive a
deleted tenant, and a reusable app cannot depend on the project's tenant model migrations.

One module per concern, every model named here (``kumiko_jobs.models.JobRun``, as Django and
the migrations know them): ``runs`` (``JobRun``, ``JobAttempt`` and the ``RunStatus``
vocabulary), ``records`` (the rows beside the runs: failures a tenant may see, the
escape-hatch audit, rejected messages, admission locks, boot markers), ``workflows`` and
``operators`` (pauses and bulk operations).
"""

from __future__ import annotations

from .operators import BulkItem, BulkKind, BulkOperation, BulkState, FlowPause
from .records import AdmissionLock, BootMarker, EscapeHatchUse, JobFailure, RejectedMessage
from .runs import (
    FINISHED_STATUSES,
    REFUSED_STATUSES,
    WAITING_STATUSES,
    DeferralKind,
    JobAttempt,
    JobRun,
    RunStatus,
)
from .workflows import StepState, Workflow, WorkflowStep

__all__ = [
    "FINISHED_STATUSES",
    "REFUSED_STATUSES",
    "WAITING_STATUSES",
    "AdmissionLock",
    "BootMarker",
    "BulkItem",
    "BulkKind",
    "BulkOperation",
    "BulkState",
    "DeferralKind",
    "EscapeHatchUse",
    "FlowPause",
    "JobAttempt",
    "JobFailure",
    "JobRun",
    "RejectedMessage",
    "RunStatus",
    "StepState",
    "Workflow",
    "WorkflowStep",
]
