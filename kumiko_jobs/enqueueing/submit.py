"""enqueue / enqueue_in / enqueue_at / emit: validate now, write the run, push on commit.

Everything that can be wrong with a call (unknown job, wrong arguments, values JSON cannot
carry, a missing tenant) raises here, in the caller's code, never later in a worker
(``validate``). The run row is written in the caller's transaction (``messages.row_for``); the
push to Redis happens on commit (``outbox``), so a rolled-back request leaves neither a row nor
a message. Inside a run, enqueues become the run's follow-ups (``followups``) instead.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from .. import signals, telemetry
from ..core import project_settings
from ..core.exceptions import InvalidJob
from ..definition.job import JobDefinition
from ..definition.registry import registry
from ..models import JobRun, RunStatus
from . import followups, outbox, unique
from .admission import admission
from .handle import RunHandle, existing_handle, resolve
from .messages import message_for, new_envelope, row_for
from .validate import check_size, resolve_schema, validated


def enqueue(job: JobDefinition | str, /, *, tenant: Any = None, **kwargs: Any) -> RunHandle:
    """Run a job, or a job by name, as soon as the current transaction commits (at once outside
    one): ``kumiko_jobs.enqueue("billing.sync_invoice", invoice_id=7)``. Also
    ``kumiko_jobs.enqueue`` and a job's ``.enqueue()`` (``api.py``)."""
    return submit(resolve(job), tenant, kwargs, delay=0.0)


def enqueue_in(
    job: JobDefinition | str, delay: timedelta | float, /, *, tenant: Any = None, **kwargs: Any
) -> RunHandle:
    """Run ``job`` ``delay`` (seconds or a timedelta) after the current transaction commits."""
    seconds = delay.total_seconds() if isinstance(delay, timedelta) else delay
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds < 0:
        raise InvalidJob(f"enqueue_in() needs a delay >= 0 (seconds or timedelta), got {delay!r}.")
    return submit(resolve(job), tenant, kwargs, delay=float(seconds))


def enqueue_at(
    job: JobDefinition | str, when: datetime, /, *, tenant: Any = None, **kwargs: Any
) -> RunHandle:
    """Run ``job`` at ``when`` (timezone-aware; at once if past), pushed on commit."""
    if not isinstance(when, datetime) or timezone.is_naive(when):
        raise InvalidJob(f"enqueue_at() needs a timezone-aware datetime, got {when!r}.")
    return submit(
        resolve(job), tenant, kwargs, delay=max(0.0, (when - timezone.now()).total_seconds())
    )


def submit(
    definition: JobDefinition,
    tenant: Any,
    kwargs: dict[str, Any],
    *,
    delay: float,
    trigger: str | None = None,
    run_id: str | None = None,
    flow: str | None = None,
) -> RunHandle:
    """The enqueue path. ``run_id``: a deterministic id (boot jobs), so that a second submit
    of the same run fails on the primary key instead of starting it twice. ``flow``: the
    tenant a system run counts against (an operator's retry of one a tenant's run started;
    admitted as that run's follow-up was, without the system's admission)."""
    batch = followups.current()
    if batch is not None:
        # Inside a run the guard forbids writes to shared tables: follow-ups are recorded and
        # pushed by the runner once the attempt has succeeded.
        return followups.prepare_followup(batch, definition, kwargs, delay=delay, tenant=tenant)
    subject = validated(definition, kwargs)
    schema = resolve_schema(definition, tenant)
    if definition.concurrency == "debounce":
        delay = max(delay, definition.debounce)
    key = unique.key_of(definition, schema, kwargs, flow)
    if key is not None:
        covering = unique.covering_run(definition, key)
        if covering is not None:
            return existing_handle(covering)
    with admission(definition, schema, flow) as refused:
        if refused is not None:
            return record_refusal(
                definition, schema, kwargs, subject, trigger, refused, run_id=run_id
            )
        return _submit_admitted(definition, schema, kwargs, subject, delay, trigger, run_id, flow)


_REFUSAL_REASONS = {
    RunStatus.SKIPPED: 'concurrency="skip": a run of this job is already waiting or running',
    RunStatus.CAPPED: "max_per_tenant: the job's waiting and running runs reached the cap",
}


def record_refusal(
    definition: JobDefinition,
    schema: str | None,
    kwargs: dict[str, Any],
    subject: str,
    trigger: str | None,
    status: RunStatus,
    *,
    run_id: str | None = None,
    tick: str | None = None,
) -> RunHandle:
    """An enqueue the concurrency options refused: a finished run row (``skipped`` or
    ``capped``) so the admin shows it, and ``job_dropped`` with that outcome on commit. No
    message is built or pushed. Written in the caller's transaction, like an admitted run."""
    env = new_envelope(definition, schema, kwargs, run_id, trigger, tick=tick)
    row = row_for(definition, env, subject, 0.0)
    row.status = status
    row.finished_at = row.queued_at
    row.rq_job_id = ""
    row.error_message = _REFUSAL_REASONS[status]
    outbox.save(
        row,
        functools.partial(
            signals.send,
            signals.job_dropped,
            run_id=env.run_id,
            job_name=definition.name,
            schema_name=schema,
            attempt=0,
            outcome=str(status),
            error=None,
            reason=row.error_message,
        ),
    )
    return RunHandle(run_id=env.run_id, job_name=definition.name, schema_name=schema, status=status)


def _submit_admitted(
    definition: JobDefinition,
    schema: str | None,
    kwargs: dict[str, Any],
    subject: str,
    delay: float,
    trigger: str | None,
    run_id: str | None = None,
    flow: str | None = None,
) -> RunHandle:
    with telemetry.producer_span(definition.queue_name, definition.name, trigger) as trace_context:
        env = new_envelope(
            definition, schema, kwargs, run_id, trigger, trace=trace_context, flow_schema=flow
        )
        telemetry.describe_message(env)
        message = message_for(definition, env, delay)
        check_size(definition, env, message)
        row = row_for(definition, env, subject, delay)
        if row.unique_key is not None:
            covering = _save_unique(definition, row, lambda: outbox.push_committed(message, row))
            if covering is not None:
                return existing_handle(covering)
        else:
            outbox.save(row, lambda: outbox.push_committed(message, row))
    return RunHandle(
        run_id=env.run_id,
        job_name=definition.name,
        schema_name=schema,
        scheduled_for=row.scheduled_for,
    )


def emit(event: str, /, *, tenant: Any = None, **payload: Any) -> list[RunHandle]:
    """Enqueue every job declared ``on=event`` whose ``where=`` matches the payload.

    An event belongs to the tenant it was emitted in (the current tenant, or ``tenant=``), and
    so does every run it starts: a ``per_tenant=True`` listener runs once, in that tenant,
    never as a fan-out to every tenant with this tenant's payload. Fan-out and system
    listeners run only for events emitted in the public schema (no tenant: a management
    command, a system or cron job); a tenant's event never starts a system listener
    (``InvalidJob``). Inside a run, listeners are follow-ups of the run, in its tenant.
    Pushed when the transaction commits; the jobs see the event name as ``ctx.trigger_name``.
    """
    if not isinstance(event, str) or not event:
        raise InvalidJob(f"emit() needs an event name, got {event!r}.")
    listeners = [
        definition
        for definition in registry.listeners(event)
        if all(payload.get(key) == value for key, value in definition.where.items())
    ]
    if not listeners:
        return []
    batch = followups.current()
    # Inside a run, listeners are its follow-ups (prepare_followup keeps them in its tenant),
    # and a tenant run's event is still a tenant's event.
    owner = batch.parent.schema if batch is not None else _event_tenant(tenant)
    # Every listener is checked before any is enqueued: an emit starts all of its runs or none.
    for definition in listeners:
        if batch is None and owner is None and not (definition.system or definition.per_tenant):
            raise InvalidJob(
                f"emit({event!r}) in the public schema: listener {definition.name!r} runs in a "
                "tenant. Pass tenant=<Tenant or schema name>, or emit inside the tenant."
            )
        if owner is not None and definition.system:
            raise InvalidJob(
                f"emit({event!r}) in a tenant: listener {definition.name!r} is a system job, "
                "and a tenant's event never starts work outside its tenant. Emit the event "
                "from the public schema, or make the listener a tenant job."
            )
    target = tenant if batch is not None else owner
    return [
        submit(definition, target, dict(payload), delay=0.0, trigger=event)
        for definition in listeners
    ]


def _event_tenant(tenant: Any) -> Any:
    """The tenant an event belongs to (a tenant or a schema name), None for the public schema."""
    public = project_settings.public_schema_name()
    if tenant is not None:
        schema = tenant if isinstance(tenant, str) else getattr(tenant, "schema_name", None)
        return None if schema == public else tenant
    schema = getattr(connection, "schema_name", public)
    if schema == public:
        return None
    current = getattr(connection, "tenant", None)
    return current if getattr(current, "schema_name", None) == schema else str(schema)


def _save_unique(
    definition: JobDefinition, row: JobRun, on_commit: Callable[[], None]
) -> JobRun | None:
    """Insert a unique job's row, or the run that covers its key when a concurrent enqueue got
    there first (None: inserted). The INSERT is in a savepoint so that the caller's transaction
    goes on after the index refused it; its ``on_commit`` is dropped with the savepoint."""
    assert row.unique_key is not None
    for _ in range(3):
        try:
            with transaction.atomic():
                outbox.save(row, on_commit)
            return None
        except IntegrityError as exc:
            if not unique.is_duplicate(exc):
                raise
        # The other transaction has committed (the INSERT waited for it): its run is active
        # now, unless it finished in between, and then this enqueue tries once more.
        covering = unique.covering_run(definition, row.unique_key)
        if covering is not None:
            return covering
    raise InvalidJob(
        f"Job {definition.name!r}: the run of this unique key kept finishing and starting "
        "again while this enqueue waited; enqueue again."
    )
