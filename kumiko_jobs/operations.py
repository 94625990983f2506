"""Operator actions on runs: retry, cancel, run a ``manual=True`` job by hand.

The admin calls these, and so can a management command or a project's own views. Each action
goes through the public enqueue path (validation, history row, push on commit), so a run
started by an operator is indistinguishable from any other run except for its ``trigger``.
An action that does not apply raises ``OperationRefused``, defined with the other errors in
core/exceptions.py and re-exported here: operators' code catches it under this module's name
(docs/reference.md).

``retry_run`` and ``cancel_run`` do not ask who may act (nor read ``@job(tenant_operable=...)``):
the audience check is the caller's. The admin's run actions and a run page's buttons, the only
callers a tenant's member reaches, ask admin/tenant_acts.py first (admin/actions.py,
``refuse_member``); the others are the operators' (bulk.py, started from the operators' bulk
page only; the CLI, management/cli/jobs.py).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from . import transport
from .core import conf
from .core.exceptions import OperationRefused as OperationRefused
from .definition.job import JobDefinition
from .definition.registry import registry
from .enqueueing.handle import RunHandle, resolve
from .enqueueing.submit import submit
from .history import transitions
from .models import WAITING_STATUSES, JobRun, RunStatus

logger = logging.getLogger("kumiko_jobs.operations")

RETRYABLE_STATUSES = (RunStatus.FAILED, RunStatus.CANCELLED)


def _who(by: Any) -> str:
    if isinstance(by, str):
        return by  # a label (the CLI: "manage.py (<os user>)")
    if by is None or not getattr(by, "is_authenticated", False):
        return ""
    username = by.get_username() if hasattr(by, "get_username") else ""
    return str(username or by.pk)


def actor(by: Any) -> str:
    """Who ``by`` is, as the history records it: a user's username, a label as given, or ``""``."""
    return _who(by)


def _trigger(base: str, by: Any) -> str:
    # The envelope's triggered_by comes from the request (KumikoJobsMiddleware). Outside a
    # request (a management command) nothing would record who asked, so the trigger says it.
    who = _who(by)
    return (f"{base} by {who}" if who else base)[: transitions.TRIGGER_LIMIT]


def retry_run(run: JobRun, *, by: Any = None) -> RunHandle:
    """Start a new run of ``run``'s job for the same tenant with the same arguments.

    Only failed or cancelled runs can be retried; the old run stays as it was (history is
    never rewritten). Raises ``OperationRefused`` when the run does not qualify (or is already
    being retried), and the enqueue errors (``InvalidJob``) when the tenant is gone or the
    job's signature changed.

    Two retries at once (two operators, a double POST, two bulk actions) start one run: the
    source run's row is locked (``SELECT ... FOR UPDATE``) before the check for a pending retry
    and held until the new run's row commits, so the second retry waits, then sees the first
    one's run (PostgreSQL settles it, not the order of two SELECTs and two INSERTs).
    """
    with transaction.atomic():
        locked = (
            JobRun.objects.select_for_update()
            .filter(pk=run.pk)
            .values_list("status", flat=True)
            .first()
        )
        if locked is None:
            raise OperationRefused(
                f"Run {run.run_id} no longer exists (deleted by retention or by hand).",
                reason=_("run no longer exists"),
            )
        run.status = locked
        return _retry_locked(run, by)


def _retry_locked(run: JobRun, by: Any) -> RunHandle:
    """``retry_run`` once the source run's row is locked: the checks, then the new run."""
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
    # A second click on "retry" (or two operators at once, serialised by the lock above)
    # would start the same work twice. Filtering on job and tenant first keeps this on the
    # kj_run_job_tenant index.
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
        flow=run.flow_schema or None,  # a tenant's run started it: still that tenant's
    )
    logger.info("run %s retried as %s by %s", run.run_id, handle.run_id, _who(by) or "-")
    return handle


CANCELLED = "cancelled"
CANCEL_REQUESTED = "requested"


def cancel_run(run: JobRun, *, by: Any = None) -> str:
    """Cancel a run: ``"cancelled"`` (it had not started), ``"requested"`` (it is running),
    or ``""`` (it has finished; nothing to do). Truthy when something was done.

    A waiting run (``queued`` or ``deferred``) is cancelled at once: a single conditional
    UPDATE decides the race with a worker (whichever of this and the runner's start commits
    first wins); the queue message stays in Redis and the runner drops it.

    A running run gets a request: who and when on the row, and a Redis key that the worker
    executing it reads with its liveness beat (``cancellation``). The job sees it through
    ``ctx.cancel_requested`` / ``ctx.check_cancelled()``; a forking worker kills the work
    horse ``CANCEL_GRACE`` seconds later; an in-process worker cannot stop a job that never
    checks, which then runs to its end or its timeout. The run ends ``cancelled`` unless its
    body had completed (success wins that race; docs/reliability.md, Cancellation).
    """
    who = _who(by)
    now = timezone.now()
    if transitions.cancel_waiting(run.pk, who, now):
        run.refresh_from_db()
        logger.info("run %s cancelled by %s", run.run_id, who or "-")
        return CANCELLED
    # The first request's time and author stand; a second click only re-sends the flag.
    transitions.request_cancel([run.pk], who, now)
    if not JobRun.objects.filter(pk=run.pk, status=RunStatus.RUNNING).exists():
        return ""
    run.refresh_from_db()
    run_hex = uuid.UUID(str(run.run_id)).hex
    ttl = _cancel_flag_ttl(run.job_name)
    transaction.on_commit(
        lambda: _publish_cancel(run_hex, run.cancel_requested_by or who, ttl), robust=True
    )
    logger.info("run %s: cancellation requested by %s", run.run_id, who or "-")
    return CANCEL_REQUESTED


def _cancel_flag_ttl(job_name: str) -> int:
    """Long enough to outlive the attempt (its timeout, the watchdog's kill, a beat or two)."""
    settings = conf.get()
    timeout = settings.DEFAULT_TIMEOUT
    if job_name in registry:
        timeout = registry.get(job_name).timeout_seconds
    return (
        timeout
        + settings.TIMEOUT_KILL_AFTER
        + settings.CANCEL_GRACE
        + 2 * settings.WORKER_DEAD_AFTER
    )


def _publish_cancel(run_hex: str, who: str, ttl: int) -> None:
    try:
        transport.request_cancel(
            transport.connection_for(conf.get().DEFAULT_QUEUE), run_hex, who, ttl
        )
    except Exception as exc:
        # The request is on the row; only its way to the worker failed. Asking again re-sends it.
        logger.error("could not send the cancellation of run %s to the workers: %r", run_hex, exc)


def enqueue_manual(
    definition: JobDefinition | str,
    tenant_schema: str | None,
    kwargs: Mapping[str, Any],
    *,
    by: Any = None,
    request_id: str | None = None,
) -> RunHandle:
    """Enqueue a job declared ``manual=True`` for a tenant (None for a system job).

    Arguments are validated exactly as for any enqueue; nothing is written when they do not
    fit. Jobs without ``manual=True`` are refused: running arbitrary jobs by hand could
    repeat side effects their authors never meant to be triggered from outside.

    ``request_id`` (a UUID, e.g. the "Run a job" form's, one per form shown) makes the request
    idempotent: the run's id is derived from it, so a second submission of the same request,
    however simultaneous, fails on the run's primary key in PostgreSQL and is refused as
    already queued, instead of starting the job twice.
    """
    definition = resolve(definition)
    if not definition.manual:
        raise OperationRefused(
            f"Job {definition.name!r} is not declared @job(manual=True); it cannot be run by hand.",
            reason=_("not a manual job"),
        )
    run_id = manual_run_id(request_id) if request_id is not None else None
    try:
        # A savepoint: a duplicate's failed INSERT must not abort the caller's transaction.
        with transaction.atomic():
            return submit(
                definition,
                tenant_schema or None,
                dict(kwargs),
                delay=0.0,
                trigger=_trigger("manual", by),
                run_id=run_id,
            )
    except IntegrityError:
        if run_id is None or not JobRun.objects.filter(pk=run_id).exists():
            raise
        raise OperationRefused(
            f"This request was already submitted: it queued run {uuid.UUID(run_id)}.",
            reason=_("already submitted"),
        ) from None


def manual_run_id(request_id: str) -> str:
    """The run id a "run by hand" request makes (``enqueue_manual``): derived, so that the same
    request always names the same run; ``OperationRefused`` for text that is not a UUID."""
    try:
        request = uuid.UUID(str(request_id))
    except ValueError:
        raise OperationRefused(
            f"request_id {request_id!r} is not a UUID.", reason=_("not a request id")
        ) from None
    return uuid.uuid5(request, "kumiko_jobs.enqueue_manual").hex
