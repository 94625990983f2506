"""Operator actions on runs: retry, cancel, run a ``manual=True`` job by hand.

The admin calls these, and so can a management command or a project's own views. Each action
goes through the public enqueue path (validation, history row, push on commit), so a run
started by an operator is indistinguishable from any other run except for its ``trigger``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from .enqueueing import RunHandle, resolve, submit
from .exceptions import KumikoJobsError
from .models import WAITING_STATUSES, JobRun, RunStatus
from .registry import JobDefinition, registry

logger = logging.getLogger("kumiko_jobs.operations")

RETRYABLE_STATUSES = (RunStatus.FAILED, RunStatus.CANCELLED)
_TRIGGER_MAX = JobRun._meta.get_field("trigger").max_length or 200


class OperationRefused(KumikoJobsError):
    """An operator action that does not apply to this run.

    ``reason`` is a short, translatable phrase ("not failed or cancelled") that the admin
    groups and counts; the message says the same thing about one run in full.
    """

    def __init__(self, message: str, *, reason: Any):
        super().__init__(message)
        self.reason = reason


def _who(by: Any) -> str:
    if by is None or not getattr(by, "is_authenticated", False):
        return ""
    username = by.get_username() if hasattr(by, "get_username") else ""
    return str(username or by.pk)


def _trigger(base: str, by: Any) -> str:
    # The envelope's triggered_by comes from the request (KumikoJobsMiddleware). Outside a
    # request (a management command) nothing would record who asked, so the trigger says it.
    who = _who(by)
    return (f"{base} by {who}" if who else base)[:_TRIGGER_MAX]


def retry_run(run: JobRun, *, by: Any = None) -> RunHandle:
    """Start a new run of ``run``'s job for the same tenant with the same arguments.

    Only failed or cancelled runs can be retried; the old run stays as it was (history is
    never rewritten). Raises ``OperationRefused`` when the run does not qualify, and the
    enqueue errors (``InvalidJob``) when the tenant is gone or the job's signature changed.
    """
    if run.status not in RETRYABLE_STATUSES:
        raise OperationRefused(
            f"Run {run.run_id} is {run.status}; only failed or cancelled runs can be retried.",
            reason=_("not failed or cancelled"),
        )
    if run.job_name not in registry:
        raise OperationRefused(
            f"Run {run.run_id}: job {run.job_name!r} is no longer registered, so it cannot "
            "be retried. Deploy the job again or enqueue its replacement.",
            reason=_("job no longer registered"),
        )
    base = f"retry:{run.run_id}"
    # A second click on "retry" (or two operators at once) would start the same work twice.
    # Filtering on job and tenant first keeps this on the kj_run_job_tenant index.
    pending = (
        JobRun.objects.filter(
            job_name=run.job_name,
            schema_name=run.schema_name,
            status__in=(*WAITING_STATUSES, RunStatus.RUNNING),
            trigger__startswith=base,
        )
        .values_list("run_id", flat=True)
        .first()
    )
    if pending is not None:
        raise OperationRefused(
            f"Run {run.run_id} is already being retried by run {pending}.",
            reason=_("already being retried"),
        )
    handle = submit(
        registry.get(run.job_name),
        run.schema_name or None,
        dict(run.payload),
        delay=0.0,
        trigger=_trigger(base, by),
    )
    logger.info("run %s retried as %s by %s", run.run_id, handle.run_id, _who(by) or "-")
    return handle


def cancel_run(run: JobRun, *, by: Any = None) -> bool:
    """Cancel a run that has not started (``queued`` or ``deferred``); True if it was.

    A single conditional UPDATE decides the race with a worker: whichever of this and the
    runner's start (``UPDATE ... WHERE status IN (queued, deferred)``) commits first wins.
    The queue message stays in Redis; the runner drops messages of cancelled runs.
    """
    who = _who(by)
    updated = JobRun.objects.filter(pk=run.pk, status__in=WAITING_STATUSES).update(
        status=RunStatus.CANCELLED,
        finished_at=timezone.now(),
        scheduled_for=None,
        error_type="",
        error_message=f"Cancelled by {who}." if who else "Cancelled by an operator.",
    )
    if updated:
        run.refresh_from_db()
        logger.info("run %s cancelled by %s", run.run_id, who or "-")
    return bool(updated)


def enqueue_manual(
    definition: JobDefinition | str,
    tenant_schema: str | None,
    kwargs: Mapping[str, Any],
    *,
    by: Any = None,
) -> RunHandle:
    """Enqueue a job declared ``manual=True`` for a tenant (None for a system job).

    Arguments are validated exactly as for any enqueue; nothing is written when they do not
    fit. Jobs without ``manual=True`` are refused: running arbitrary jobs by hand could
    repeat side effects their authors never meant to be triggered from outside.
    """
    definition = resolve(definition)
    if not definition.manual:
        raise OperationRefused(
            f"Job {definition.name!r} is not declared @job(manual=True); it cannot be run by hand.",
            reason=_("not a manual job"),
        )
    return submit(
        definition,
        tenant_schema or None,
        dict(kwargs),
        delay=0.0,
        trigger=_trigger("manual", by),
    )
