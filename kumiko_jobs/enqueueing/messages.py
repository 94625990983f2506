"""The one owner of the conversions between an envelope, a run row and a queue message.

A run exists twice: as its history row (``JobRun``), the outbox and the truth, and as the
signed message RQ delivers. Every path that makes one from the other comes here: an enqueue
(``new_envelope``, ``row_for``, ``message_for``), a fan-out, a cron tick, a boot gate, and the
relay, the sweep and ``kumiko_jobs.testing``, which push a waiting run's message again from its
row (``envelope_of``, ``waiting_envelope``). Written once, the row and the message cannot drift
apart (a field the row keeps and a rebuilt message drops).
"""

from __future__ import annotations

import logging
import uuid
from datetime import timedelta
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.utils import timezone
from django_tenants.utils import get_tenant_model

from .. import origin, transport
from ..core import conf
from ..core.envelope import Envelope, encode
from ..core.run_ids import new_run_id
from ..definition.job import JobDefinition
from ..models import DeferralKind, JobRun, RunStatus
from . import unique
from .admission import concurrency_owner
from .tenant_settings import tenant_rate_of, weight_of

logger = logging.getLogger("kumiko_jobs.enqueueing")


def new_envelope(
    definition: JobDefinition,
    schema: str | None,
    kwargs: dict[str, Any],
    run_id: str | None,
    trigger: str | None,
    *,
    trace: dict[str, str] | None = None,
    tick: str | None = None,
    flow_schema: str | None = None,
) -> Envelope:
    """A new run's envelope, with the request's correlation, actor and write origin (none of
    which a follow-up reads: it takes its parent's, ``Envelope.followup``). ``flow_schema``:
    an operator's retry of a system run a tenant's run started keeps that tenant."""
    return Envelope(
        job=definition.name,
        schema=schema,
        kwargs=kwargs,
        run_id=run_id or new_run_id(),
        correlation_id=origin.correlation_id(),
        triggered_by=origin.triggered_by(),
        trigger=trigger,
        trace=trace or {},
        origin=origin.request_origin(),
        tick=tick,
        flow_schema=flow_schema,
    )


def row_for(definition: JobDefinition, env: Envelope, subject: str, delay: float) -> JobRun:
    """The history row of a new run (queued), written before its message is pushed."""
    now = timezone.now()
    return JobRun(
        run_id=uuid.UUID(env.run_id),
        job_name=definition.name,
        schema_name=env.schema or "",
        subject=subject,
        status=RunStatus.QUEUED,
        queue=definition.queue_name,
        max_attempts=definition.max_attempts,
        queued_at=now,
        scheduled_for=now + timedelta(seconds=delay) if delay else None,
        triggered_by=env.triggered_by or "",
        trigger=env.trigger or "",
        correlation_id=env.correlation_id,
        trace_id=env.trace_id,
        trace_context=env.trace,
        parent_run_id=uuid.UUID(env.parent_run_id) if env.parent_run_id else None,
        payload=env.kwargs,
        origin=env.origin,
        rq_job_id=env.rq_job_id,
        unique_key=unique.key_of(definition, env.schema, env.kwargs, env.flow_schema),
        priority=priority_of(definition, env),
        flow_schema=env.flow_schema or "",
    )


def envelope_of(
    run: JobRun, *, attempt: int, defers: int | None = None, gate_defers: int | None = None
) -> Envelope:
    """Rebuild the message of a run from its history row (the row holds what the envelope held).

    The inverse of ``row_for``, beside it: the sweep pushes a retry's message from its row;
    ``waiting_envelope`` rebuilds the one a waiting run waits for."""
    return Envelope(
        job=run.job_name,
        schema=run.schema_name or None,
        kwargs=run.payload,
        run_id=uuid.UUID(str(run.run_id)).hex,
        attempt=attempt,
        defers=run.defer_count if defers is None else defers,
        gate_defers=run.gate_defer_count if gate_defers is None else gate_defers,
        correlation_id=run.correlation_id,
        triggered_by=run.triggered_by or None,
        trigger=run.trigger or None,
        origin=run.origin,
        parent_run_id=run.parent_run_id.hex if run.parent_run_id else None,
        trace=dict(run.trace_context or {}),
        flow_schema=run.flow_schema or None,
    )


def message_for(
    definition: JobDefinition, envelope: Envelope, delay: float, *, priority: int | None = None
) -> transport.Message:
    """The queue message of ``envelope``: signed now, due after ``delay`` seconds, on the job's
    queue, with its timeout, and what the fair dequeue files it by (the bucket and weight of
    the tenant it counts against, ``Envelope.flow_tenant``; the priority: ``priority`` when
    given, else the job's) and holds it back by (its rate windows and caps)."""
    return transport.Message(
        # Signed now, due after the delay: the message expires MESSAGE_MAX_AGE after that.
        body=encode(envelope, delay=delay),
        queue=definition.queue_name,
        job_id=envelope.rq_job_id,
        timeout=definition.timeout_seconds,
        delay=delay,
        bucket=transport.bucket_of(envelope.flow_tenant),
        weight=weight_of(envelope.flow_tenant),
        priority=priority if priority is not None else priority_of(definition, envelope),
        job=definition.name,
        rates=rates_of(definition, envelope),
        caps=caps_of(definition, envelope.schema, flow=envelope.flow_schema),
    )


def sibling_message(
    definition: JobDefinition, envelope: Envelope, first: transport.Message | None
) -> transport.Message:
    """``message_for`` of one run of an ``enqueue_many`` call, due now, whose first message
    is ``first``: the runs of one call share their job, tenant and moment, so what the fair
    dequeue files and holds them by (bucket, weight, priority, rate windows, caps) is the
    first's, unless the item's own arguments choose it (``front_by_priority``,
    ``rate_limit_by``). Resolved once, ``TENANT_WEIGHT``'s and ``TENANT_RATE_LIMIT``'s
    callables are called once per call, not per item, as for any other push."""
    if first is None or not shares_fields(definition):
        return message_for(definition, envelope, 0.0)
    return transport.Message(
        body=encode(envelope, delay=0.0),
        queue=first.queue,
        job_id=envelope.rq_job_id,
        timeout=first.timeout,
        bucket=first.bucket,
        weight=first.weight,
        priority=first.priority,
        job=first.job,
        rates=first.rates,
        caps=first.caps,
    )


def shares_fields(definition: JobDefinition) -> bool:
    """Do the runs of one ``enqueue_many`` call of ``definition`` share their messages' fair
    fields (``sibling_message``)? Not when an item's arguments choose its priority or its
    rate window."""
    return not definition.front_by_priority and definition.rate_limit_by is None


def rates_of(definition: JobDefinition, envelope: Envelope) -> tuple[tuple[str, int, int], ...]:
    """The rate-limit windows a start of this run counts in, as (key, starts, seconds): the
    job's across tenants (one per value of ``rate_limit_by``), the job's per tenant (a system
    job's: the system's), and ``TENANT_RATE_LIMIT`` across the runs of the tenant the run counts
    against (``Envelope.flow_tenant``: none for a system run no tenant's run started). Decided
    at the push like the fair field, so the dequeue script asks no one."""
    rates: list[tuple[str, int, int]] = []
    if definition.rate_limit is not None:
        key = transport.job_window(definition.name)
        if definition.rate_limit_by is not None:
            value = envelope.kwargs.get(definition.rate_limit_by)
            key = transport.value_window(definition.name, value)
        rates.append((key, definition.rate_limit.limit, definition.rate_limit.per))
    bucket = transport.bucket_of(envelope.schema)
    if definition.tenant_rate_limit is not None:
        limit = definition.tenant_rate_limit
        rates.append((f"jt:{definition.name}\t{bucket}", limit.limit, limit.per))
    tenant = envelope.flow_tenant
    tenant_limit = tenant_rate_of(tenant) if tenant is not None else None
    if tenant is not None and tenant_limit is not None:
        rates.append((f"t:{transport.bucket_of(tenant)}", tenant_limit.limit, tenant_limit.per))
    return tuple(rates)


def priority_of(definition: JobDefinition, envelope: Envelope) -> int:
    """The priority level of a run's messages, the same for every push of the run: inside a
    run, the level of the message executing (a retry or deferral keeps what the first message
    had, ``using(priority=...)`` included); else a Django task's own ``priority``
    (kumiko_jobs.tasks); else the job's (``@job(priority=...)`` or its ``using`` copy). The
    relay and the sweep pass the run row's instead."""
    inherited = transport.current_priority(envelope.run_id)
    if inherited is not None:
        return inherited
    if definition.front_by_priority:
        priority = envelope.kwargs.get("priority", 0)
        valid = transport.valid_priority(priority)
        if valid is not None:
            return valid
    return definition.priority


def pushable(
    definition: JobDefinition,
    envelope: Envelope,
    delay: float,
    *,
    priority: int | None = None,
    failed: set[str | None] | None = None,
) -> transport.Message | None:
    """``message_for``, or None (logged) when the run's tenant's ``TENANT_WEIGHT`` or
    ``TENANT_RATE_LIMIT`` cannot be resolved: for pushes made on behalf of many tenants (the
    relay, a fan-out's children, the sweep's retries), whose runs are written already. The run
    stays waiting in PostgreSQL, the relay pushes it once the setting works, and the other
    tenants' runs go on; an enqueue's caller gets the error instead (fails closed).

    ``failed``: the tenants that failed earlier in the same pass, filled here; their other
    runs wait too, without calling the project's callable again or logging again."""
    if failed is not None and envelope.flow_tenant in failed:
        return None
    try:
        return message_for(definition, envelope, delay, priority=priority)
    except ImproperlyConfigured as exc:
        if failed is not None:
            failed.add(envelope.flow_tenant)
        logger.error(
            "the runs of tenant %s wait (first: run %s of %s): their messages cannot be made: %s",
            envelope.flow_tenant,
            envelope.run_id,
            definition.name,
            exc,
        )
        return None


def caps_of(
    definition: JobDefinition, schema: str | None, *, flow: str | None = None
) -> tuple[tuple[str, int, str], ...]:
    """The concurrency caps a run's start takes a slot of, as (key, limit, scope), which the
    fair dequeue enforces (transport/fair_caps.py): the job's own per tenant (scope ``j``:
    ``sequential`` is 1, ``tenant_concurrency=N`` is N; only that job's messages wait), else
    the tenant's ``TENANT_CONCURRENCY`` across its jobs (scope ``t``: the tenant's messages
    wait). A job's own cap replaces the tenant's, as its per-job override.

    Keyed per tenant, never per job only, so one busy tenant cannot hold back the others. The
    tenant of a system job is the system (its bucket); ``TENANT_CONCURRENCY`` is a fairness cap
    between tenants and does not hold system runs back; a system job's own
    ``tenant_concurrency=`` caps the system's runs. A fan-out parent has no tenant: no cap.
    A system run a tenant's run started (``flow``: that tenant, ``Envelope.flow_schema``)
    takes a slot of that tenant's ``TENANT_CONCURRENCY`` too, besides its job's own cap (the
    system's, which is no per-tenant override): a tenant at its cap gets no extra run through
    a system job.
    """
    if concurrency_owner(definition, schema) is None:
        return ()
    caps: list[tuple[str, int, str]] = []
    limits = [n for n in (definition.tenant_concurrency,) if n]
    if definition.concurrency == "sequential":
        limits.append(1)
    if limits:
        caps.append((f"j:{definition.name}\t{transport.bucket_of(schema)}", min(limits), "j"))
    tenant, tenant_limit = schema if schema is not None else flow, conf.get().TENANT_CONCURRENCY
    if tenant_limit and tenant is not None and not (limits and schema is not None):
        caps.append((f"t:{transport.bucket_of(tenant)}", tenant_limit, "t"))
    return tuple(caps)


def pending_counters(
    status: str, attempts: int, defers: int, gate_defers: int
) -> list[tuple[int, int, int]]:
    """(attempt, defers, gate defers) of the message a waiting run waits for (candidates)."""
    if status == RunStatus.QUEUED:
        return [(attempts + 1, defers, gate_defers)]
    attempt = max(attempts, 1)
    return [(attempt, defers + 1, gate_defers), (attempt, defers, gate_defers + 1)]


def deferred_by_gate(run: JobRun) -> bool:
    """Was this deferral the inactive-tenant gate's?

    The row says so (``waiting_for``) for every deferral recorded since migration 0012. A row
    without it was deferred by a worker of an earlier release (during a rolling deploy, or
    before the upgrade): for those the answer is the old guess from the tenant's state now. The
    gate defers only runs of inactive tenants under ``INACTIVE_TENANT="defer"``, so a tenant
    reactivated since then gets a ``ctx.defer()`` resumption instead, which costs the run one
    of its ``max_defers`` but runs it all the same.
    """
    if run.waiting_for:
        return run.waiting_for == DeferralKind.GATE
    settings = conf.get()
    field = settings.TENANT_ACTIVE_FIELD
    if not (field and settings.INACTIVE_TENANT == "defer" and run.schema_name):
        return False
    tenant = get_tenant_model().objects.filter(schema_name=run.schema_name).first()
    return tenant is not None and not getattr(tenant, field, True)


def waiting_envelope(run: JobRun) -> Envelope:
    """The envelope of the message a waiting (queued or deferred) run waits for, rebuilt from
    its row: the next attempt of a queued run; for a deferred one, the next deferral of the
    kind it is waiting for (``deferred_by_gate``)."""
    counters = pending_counters(run.status, run.attempts, run.defer_count, run.gate_defer_count)
    choice = counters[1] if len(counters) == 2 and deferred_by_gate(run) else counters[0]
    attempt, defers, gate_defers = choice
    return envelope_of(run, attempt=attempt, defers=defers, gate_defers=gate_defers)
