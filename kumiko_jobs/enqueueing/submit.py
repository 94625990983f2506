"""enqueue / enqueue_in / enqueue_at: validate now, write the run, push on commit.

Everything that can be wrong with a call (unknown job, wrong arguments, values JSON cannot
carry, a missing tenant) raises here, in the caller's code, never later in a worker. The run
row is written in the caller's transaction; the push to Redis happens on commit, so a
rolled-back request leaves neither a row nor a message.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import math
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import connection, transaction
from django.utils import timezone

from .. import origin, signals, telemetry, transport
from ..core import conf
from ..core.db import ADMISSION_LOCK_CLASS
from ..core.envelope import WIDEST_SIGNING_TIME, Envelope, encode, new_run_id
from ..core.exceptions import InvalidJob
from ..definition.job import JobDefinition
from ..definition.registry import registry
from ..definition.subject import build_subject
from ..models import REFUSED_STATUSES, JobRun, RunStatus
from . import followups
from .followups import FollowupBatch

if TYPE_CHECKING:
    from ..models import JobRun as JobRunModel

logger = logging.getLogger("kumiko_jobs.enqueueing")


@dataclass(frozen=True, slots=True)
class RunHandle:
    """What an enqueue returns: the run's id and where it will run.

    ``status``, ``scheduled_for`` and ``result`` are what was known when the handle was made
    (or last refreshed); ``refresh()`` reads the run's history row again and updates them.
    """

    run_id: str
    job_name: str
    schema_name: str | None
    status: str = RunStatus.QUEUED
    scheduled_for: datetime | None = None
    # What the job returned, once the run succeeded (see kumiko_jobs.results for the marker
    # stored instead of a result that could not be kept). None before that.
    result: Any = None

    @property
    def skipped(self) -> bool:
        """Refused by ``concurrency="skip"``: a run of this job was already active."""
        return self.status == RunStatus.SKIPPED

    @property
    def capped(self) -> bool:
        """Refused by ``max_per_tenant``: the job's active runs had reached the cap."""
        return self.status == RunStatus.CAPPED

    @property
    def admitted(self) -> bool:
        """False when the job's concurrency options refused the enqueue (skipped or capped)."""
        return self.status not in REFUSED_STATUSES

    @property
    def finished(self) -> bool:
        return self.status in (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED)

    def refresh(self) -> JobRunModel:
        """Read the run's history row: updates ``status``, ``scheduled_for`` and ``result``,
        and returns the row (``JobRun``) for everything else."""
        if not self.run_id:
            raise InvalidJob("This enqueue was skipped (concurrency/max_per_tenant): no run.")
        row = JobRun.objects.get(pk=self.run_id)
        # A frozen dataclass, so handles stay hashable; the refresh is its one mutation.
        object.__setattr__(self, "status", row.status)
        object.__setattr__(self, "scheduled_for", row.scheduled_for)
        object.__setattr__(self, "result", row.result)
        return row

    async def arefresh(self) -> JobRunModel:
        """``refresh()`` for async code."""
        from asgiref.sync import sync_to_async

        return await sync_to_async(self.refresh)()


def resolve(job: JobDefinition | str) -> JobDefinition:
    if isinstance(job, JobDefinition):
        return job
    if isinstance(job, str):
        return registry.get(job)
    raise InvalidJob(f"enqueue() takes a job or a job name, got {job!r}.")


def enqueue(job: JobDefinition | str, *, tenant: Any = None, **kwargs: Any) -> RunHandle:
    """Run ``job`` as soon as the current transaction commits (at once outside one)."""
    return submit(resolve(job), tenant, kwargs, delay=0.0)


def enqueue_in(
    job: JobDefinition | str, delay: timedelta | float, *, tenant: Any = None, **kwargs: Any
) -> RunHandle:
    seconds = delay.total_seconds() if isinstance(delay, timedelta) else delay
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds < 0:
        raise InvalidJob(f"enqueue_in() needs a delay >= 0 (seconds or timedelta), got {delay!r}.")
    return submit(resolve(job), tenant, kwargs, delay=float(seconds))


def enqueue_at(
    job: JobDefinition | str, when: datetime, *, tenant: Any = None, **kwargs: Any
) -> RunHandle:
    if not isinstance(when, datetime) or timezone.is_naive(when):
        raise InvalidJob(f"enqueue_at() needs a timezone-aware datetime, got {when!r}.")
    return submit(
        resolve(job), tenant, kwargs, delay=max(0.0, (when - timezone.now()).total_seconds())
    )


def check_json(kwargs: Mapping[str, Any], job_name: str) -> None:
    """Arguments travel as JSON: refuse anything that would not come back equal.

    Nesting is bounded (``MAX_ARGUMENT_DEPTH``): deeper arguments would hit Python's recursion
    limit here, in ``json.dumps`` or in the worker's ``json.loads``, as a RecursionError (a
    500 in a view) instead of a clear refusal; a list that contains itself is caught the same
    way.
    """
    max_depth = conf.get().MAX_ARGUMENT_DEPTH

    def walk(value: Any, path: str, depth: int = 0) -> None:
        # depth: the lists and dicts around ``value``; ``value`` itself may add one more.
        if depth >= max_depth and isinstance(value, list | dict):
            raise InvalidJob(
                f"Job {job_name!r}: argument {path[:200]} is nested more than "
                f"MAX_ARGUMENT_DEPTH={max_depth} levels deep. Flatten it, or pass an id and "
                "load the data in the job."
            )
        if isinstance(value, str) and "\x00" in value:
            raise InvalidJob(f"Job {job_name!r}: argument {path} contains a NUL character.")
        if value is None or isinstance(value, bool | int | str):
            return
        if isinstance(value, float):
            if not math.isfinite(value):
                raise InvalidJob(
                    f"Job {job_name!r}: argument {path} is {value}, which JSON cannot carry."
                )
            return
        if isinstance(value, list):
            for i, item in enumerate(value):
                walk(item, f"{path}[{i}]", depth + 1)
            return
        if isinstance(value, dict):
            for key, item in value.items():
                if not isinstance(key, str):
                    raise InvalidJob(
                        f"Job {job_name!r}: argument {path} has a non-string key {key!r}."
                    )
                walk(item, f"{path}[{key!r}]", depth + 1)
            return
        hint = ""
        if hasattr(value, "_meta") and hasattr(value, "pk"):
            hint = " Pass its primary key and load it in the job."
        elif isinstance(value, tuple):
            hint = " Pass a list."
        elif isinstance(value, datetime):
            hint = " Pass value.isoformat()."
        raise InvalidJob(
            f"Job {job_name!r}: argument {path} is a {type(value).__name__}, which is not JSON."
            + hint
        )

    for name, value in kwargs.items():
        walk(value, repr(name))


def _resolve_schema(definition: JobDefinition, tenant: Any) -> str | None:
    public = conf.public_schema_name()
    if definition.per_tenant and tenant is None:
        return None  # a fan-out: one child run per tenant, made by the worker
    if definition.system:
        if tenant is not None:
            raise InvalidJob(f"Job {definition.name!r} is a system job; it takes no tenant=.")
        return None
    if tenant is None:
        schema = getattr(connection, "schema_name", public)
        if schema == public:
            raise InvalidJob(
                f"Job {definition.name!r} was enqueued from the public schema without tenant=. "
                "Pass tenant=<Tenant or schema name>, or enqueue inside the tenant's request."
            )
        return str(schema)
    schema = tenant if isinstance(tenant, str) else getattr(tenant, "schema_name", None)
    if not isinstance(schema, str) or not schema:
        raise InvalidJob(f"tenant= must be a tenant or a schema name, got {tenant!r}.")
    if schema == public:
        raise InvalidJob(f"Job {definition.name!r} cannot run for the public schema.")
    if isinstance(tenant, str):
        from django_tenants.utils import get_tenant_model

        if not get_tenant_model().objects.filter(schema_name=schema).exists():
            raise InvalidJob(f"No tenant has the schema {schema!r}.")
    return schema


def message_for(definition: JobDefinition, envelope: Envelope, delay: float) -> transport.Message:
    key, limit = rate_limit_of(definition, envelope.schema)
    return transport.Message(
        # Signed now, due after the delay: the message expires MESSAGE_MAX_AGE after that.
        body=encode(envelope, delay=delay),
        queue=definition.queue_name,
        job_id=envelope.rq_job_id,
        timeout=definition.timeout_seconds,
        delay=delay,
        rate_limit_key=key,
        rate_limit=limit,
        at_front=_at_front(definition, envelope),
    )


def _at_front(definition: JobDefinition, envelope: Envelope) -> bool:
    """A Django task's priority (kumiko_jobs.tasks): above the default 0, the front of the
    queue, for every push of the run (first, retries, relayed): RQ has no other order."""
    priority = envelope.kwargs.get("priority", 0)
    return definition.front_by_priority and isinstance(priority, int) and priority > 0


def concurrency_owner(definition: JobDefinition, schema: str | None) -> str | None:
    """Whose runs a job's concurrency options count: the run's tenant, or for a system job the
    system (its runs' ``schema_name`` is empty). None for a fan-out parent: its children are
    the runs of tenants, and ``sequential`` holds each of them back per tenant."""
    if schema is not None:
        return schema
    return "" if definition.system else None


def rate_limit_of(definition: JobDefinition, schema: str | None) -> tuple[str, int]:
    """RQ RateLimit of a run: sequential per (job, tenant), else the tenant's cap.

    Keyed per tenant, never per job only, so one busy tenant cannot hold back the others. The
    tenant of a system job is the system, keyed as the public schema (no tenant has it).
    ``TENANT_CONCURRENCY`` is a fairness cap between tenants and does not hold system runs
    back; a system job's own ``tenant_concurrency=`` caps the system's runs.
    """
    owner = concurrency_owner(definition, schema)
    if owner is None:
        return "", 0
    key_owner = owner or conf.public_schema_name()
    if definition.concurrency == "sequential":
        return f"kumiko:seq:{definition.name}:{key_owner}", 1
    limit = definition.tenant_concurrency
    if limit is None and schema is not None:
        limit = conf.get().TENANT_CONCURRENCY
    if limit:
        return f"kumiko:tenant:{key_owner}", limit
    return "", 0


def _validated(definition: JobDefinition, kwargs: dict[str, Any]) -> str:
    definition.bind_arguments(kwargs)
    check_json(kwargs, definition.name)
    return build_subject(definition, kwargs)


def row_for(definition: JobDefinition, env: Envelope, subject: str, delay: float) -> JobRun:
    now = timezone.now()
    """The history row of a new run (queued), written before its message is pushed."""
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
    )


def envelope_of(run: JobRun, *, attempt: int) -> Envelope:
    """Rebuild the message of a run from its history row (the row holds what the envelope held).

    The inverse of ``_row``, beside it: the sweep, the relay and ``kumiko_jobs.testing`` push
    a waiting run's message from its row."""
    return Envelope(
        job=run.job_name,
        schema=run.schema_name or None,
        kwargs=run.payload,
        run_id=uuid.UUID(str(run.run_id)).hex,
        attempt=attempt,
        defers=run.defer_count,
        gate_defers=run.gate_defer_count,
        correlation_id=run.correlation_id,
        triggered_by=run.triggered_by or None,
        trigger=run.trigger or None,
        origin=run.origin,
        parent_run_id=run.parent_run_id.hex if run.parent_run_id else None,
        trace=dict(run.trace_context or {}),
    )


def submit(
    definition: JobDefinition,
    tenant: Any,
    kwargs: dict[str, Any],
    *,
    delay: float,
    trigger: str | None = None,
    run_id: str | None = None,
) -> RunHandle:
    """The enqueue path. ``run_id``: a deterministic id (boot jobs), so that a second submit
    of the same run fails on the primary key instead of starting it twice."""
    batch = followups.current()
    if batch is not None:
        # Inside a run the guard forbids writes to shared tables: follow-ups are recorded and
        # pushed by the runner once the attempt has succeeded.
        return prepare_followup(batch, definition, kwargs, delay=delay, tenant=tenant)
    subject = _validated(definition, kwargs)
    schema = _resolve_schema(definition, tenant)
    if definition.concurrency == "debounce":
        delay = max(delay, definition.debounce)
    with admission(definition, schema) as refused:
        if refused is not None:
            return record_refusal(
                definition, schema, kwargs, subject, trigger, refused, run_id=run_id
            )
        return _submit_admitted(definition, schema, kwargs, subject, delay, trigger, run_id)


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
    env = _new_envelope(definition, schema, kwargs, run_id, trigger, tick=tick)
    row = row_for(definition, env, subject, 0.0)
    row.status = status
    row.finished_at = row.queued_at
    row.rq_job_id = ""
    row.error_message = _REFUSAL_REASONS[status]
    row.save(force_insert=True)
    transaction.on_commit(
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
        robust=True,
    )
    return RunHandle(run_id=env.run_id, job_name=definition.name, schema_name=schema, status=status)


def _new_envelope(
    definition: JobDefinition,
    schema: str | None,
    kwargs: dict[str, Any],
    run_id: str | None,
    trigger: str | None,
    *,
    trace: dict[str, str] | None = None,
    tick: str | None = None,
) -> Envelope:
    """A new run's envelope, with the request's correlation, actor and origin."""
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
    )


def _submit_admitted(
    definition: JobDefinition,
    schema: str | None,
    kwargs: dict[str, Any],
    subject: str,
    delay: float,
    trigger: str | None,
    run_id: str | None = None,
) -> RunHandle:
    with telemetry.producer_span(definition.queue_name, definition.name, trigger) as trace_context:
        env = _new_envelope(definition, schema, kwargs, run_id, trigger, trace=trace_context)
        telemetry.describe_message(env)
        message = message_for(definition, env, delay)
        _check_size(definition, env, message)
        row = row_for(definition, env, subject, delay)
        row.save(force_insert=True)
        transaction.on_commit(lambda: _push(message, row), robust=True)
    return RunHandle(
        run_id=env.run_id,
        job_name=definition.name,
        schema_name=schema,
        scheduled_for=row.scheduled_for,
    )


_ACTIVE = (RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.DEFERRED)


@contextlib.contextmanager
def admission(definition: JobDefinition, schema: str | None) -> Iterator[RunStatus | None]:
    """Apply ``concurrency`` skip/replace/debounce and ``max_per_tenant`` atomically.

    Yields None when the run is admitted, else why not (``RunStatus.SKIPPED`` or ``CAPPED``).
    A transaction-scoped advisory lock per (job, tenant) serialises concurrent enqueues of the
    same job for the same tenant until the enqueuing transaction commits, so two requests can
    never both see "no run queued" and both enqueue. A system job's tenant is the system: its
    runs (``schema_name`` empty) are counted under the same lock, keyed ``<job>:``.
    """
    limited = definition.concurrency in ("skip", "replace", "debounce") or definition.max_per_tenant
    owner = concurrency_owner(definition, schema)
    if owner is None or not limited:
        yield None
        return
    with transaction.atomic():
        with connection.cursor() as cursor:
            # Two int4 keys under kumiko's reserved class id: the DB guard refuses that class
            # to tenant SQL, so a tenant job cannot hold (or wait on) this lock.
            cursor.execute(
                "SELECT pg_advisory_xact_lock(%s, hashtext(%s))",
                [ADMISSION_LOCK_CLASS, f"kumiko_jobs:{definition.name}:{owner}"],
            )
        active = JobRun.objects.filter(
            job_name=definition.name, schema_name=owner, status__in=_ACTIVE
        )
        if definition.concurrency == "skip" and active.exists():
            yield RunStatus.SKIPPED
            return
        if definition.max_per_tenant and active.count() >= definition.max_per_tenant:
            yield RunStatus.CAPPED
            return
        if definition.concurrency in ("replace", "debounce"):
            _replace_queued(definition, owner)
        yield None


def _replace_queued(definition: JobDefinition, schema: str) -> None:
    """Cancel the runs still waiting; their messages are dropped when they arrive."""
    waiting = list(
        JobRun.objects.filter(
            job_name=definition.name, schema_name=schema, status=RunStatus.QUEUED
        ).values_list("pk", flat=True)
    )
    if not waiting:
        return
    JobRun.objects.filter(pk__in=waiting, status=RunStatus.QUEUED).update(
        status=RunStatus.CANCELLED,
        finished_at=timezone.now(),
        error_message="replaced by a newer enqueue",
    )
    for run_id in waiting:
        transaction.on_commit(
            functools.partial(
                signals.send,
                signals.job_dropped,
                run_id=run_id.hex,
                job_name=definition.name,
                schema_name=schema or None,
                attempt=0,
                outcome="dropped",
                error=None,
                reason="replaced by a newer enqueue",
            ),
            robust=True,
        )


def emit(event: str, *, tenant: Any = None, **payload: Any) -> list[RunHandle]:
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
    public = conf.public_schema_name()
    if tenant is not None:
        schema = tenant if isinstance(tenant, str) else getattr(tenant, "schema_name", None)
        return None if schema == public else tenant
    schema = getattr(connection, "schema_name", public)
    if schema == public:
        return None
    current = getattr(connection, "tenant", None)
    return current if getattr(current, "schema_name", None) == schema else str(schema)


# Gate deferrals (an inactive tenant's runs waiting, say) have no cap; the size check reserves
# the digits of this many, which at one deferral a second is over thirty years.
GATE_DEFERS_HEADROOM = 999_999_999
# The longest schema name PostgreSQL allows: what a fan-out child's envelope may carry.
_LONGEST_SCHEMA = "s" * 63


def largest_reachable(definition: JobDefinition, env: Envelope) -> Envelope:
    """``env`` as it will look at its biggest: the last attempt, every deferral used, and,
    for a fan-out parent, as a child run (a schema, a parent id and a trigger added).

    Retries and deferrals are the same envelope with bigger counters; a message that fits
    only at attempt 1 would be refused by every worker from some later attempt on, and the
    relay would push it again and again.
    """
    largest = dataclasses.replace(
        env,
        attempt=max(env.attempt, definition.max_attempts),
        defers=max(env.defers, definition.effective_max_defers),
        gate_defers=max(env.gate_defers, GATE_DEFERS_HEADROOM),
    )
    if definition.per_tenant and env.schema is None:
        largest = dataclasses.replace(
            largest,
            schema=_LONGEST_SCHEMA,
            parent_run_id=env.run_id,
            trigger=env.trigger or "fanout",
        )
    return largest


def _growth_bound(definition: JobDefinition) -> int:
    """More than the bytes ``largest_reachable`` can add: the counters' digits, and for a
    fan-out child its schema (63), parent id (32) and trigger, with quotes."""
    return (
        128
        + len(str(GATE_DEFERS_HEADROOM))
        + len(str(definition.max_attempts))
        + len(str(definition.effective_max_defers))
    )


def _check_size(definition: JobDefinition, env: Envelope, message: transport.Message) -> None:
    limit = conf.get().MAX_ENVELOPE_BYTES
    size = len(message.body)  # signed ASCII JSON: one byte per character
    if limit < size + _growth_bound(definition):
        # Close to or past the limit: measure the largest envelope exactly (a second encode),
        # signed at the widest time, as a relayed or deferred copy may be re-signed any time.
        size = len(encode(largest_reachable(definition, env), now=WIDEST_SIGNING_TIME))
    if size > limit:
        raise InvalidJob(
            f"Job {definition.name!r}: arguments make a message of up to {size} bytes (at its "
            f"last attempt and deferral), over MAX_ENVELOPE_BYTES={limit}. Pass ids and load "
            "the data in the job."
        )


# time.monotonic() of this process's last failed push, None after a push that worked.
_push_failed_at: float | None = None


def _push(message: transport.Message, row: JobRun) -> None:
    global _push_failed_at
    failed_at, pause = _push_failed_at, conf.get().PUSH_FAILURE_PAUSE
    if failed_at is not None and time.monotonic() - failed_at < pause:
        # Redis just failed: do not make this request wait out redis-py's retries (about 4 s)
        # again. The committed row is the outbox; the relay pushes it.
        logger.warning(
            "run %s of %s is committed but not pushed: a push failed %.1f s ago, so for "
            "PUSH_FAILURE_PAUSE=%d s the relay pushes instead",
            row.run_id,
            row.job_name,
            time.monotonic() - failed_at,
            pause,
        )
        return
    try:
        transport.push(message)
    except Exception as exc:
        # The run is committed: its row is the outbox, and the relay pushes its message once
        # Redis answers again. The request that enqueued it must not fail for that.
        _push_failed_at = time.monotonic()
        logger.warning(
            "run %s of %s is committed but not pushed (%s: %s); the relay will push it",
            row.run_id,
            row.job_name,
            type(exc).__name__,
            exc,
        )
        return
    _push_failed_at = None
    signals.send(
        signals.job_queued,
        run_id=str(row.run_id),
        job_name=row.job_name,
        schema_name=row.schema_name or None,
        attempt=1,
        outcome="queued",
        error=None,
    )


def prepare_followup(
    batch: FollowupBatch,
    job: JobDefinition | str,
    kwargs: dict[str, Any],
    *,
    delay: float = 0.0,
    tenant: Any = None,
) -> RunHandle:
    """A job enqueued from inside a run: same tenant, same correlation, sent on success."""
    definition = resolve(job)
    limit = conf.get().MAX_FOLLOWUPS_PER_RUN
    if len(batch.entries) >= limit:
        raise InvalidJob(
            f"Job {batch.parent.job!r} enqueued more than MAX_FOLLOWUPS_PER_RUN={limit} "
            "follow-ups in one attempt. Enqueue one job that processes the batch, or a "
            "per_tenant fan-out, or raise the setting."
        )
    subject = _validated(definition, kwargs)
    parent = batch.parent
    if definition.system and parent.schema is not None and not definition.tenant_may_start:
        # A system job runs in public, outside any tenant, with the arguments it is given: a
        # tenant run (whose arguments and code paths tenants influence) may not choose them.
        raise InvalidJob(
            f"Job {parent.job!r} (a tenant run, {parent.schema}) may not enqueue the system job "
            f"{definition.name!r}. If tenant runs may start it, declare "
            f"@job(system=True, tenant_may_start=True) on {definition.name!r}, and have it "
            "check its arguments as coming from a tenant."
        )
    if definition.system:
        schema = None
    elif definition.per_tenant and tenant is None and parent.schema is None:
        schema = None  # a system run (cron, say) starting a fan-out: one child per tenant
    elif tenant is None:
        schema = parent.schema
    else:
        schema = tenant if isinstance(tenant, str) else getattr(tenant, "schema_name", None)
        if schema != parent.schema:
            raise InvalidJob(
                f"Job {parent.job!r} enqueued {definition.name!r} for another tenant; follow-ups "
                "stay in the run's tenant."
            )
    if schema is None and not (definition.system or definition.per_tenant):
        raise InvalidJob(
            f"System job {parent.job!r} must pass tenant= to enqueue {definition.name!r}."
        )
    # The follow-up's producer span is a child of this run's job.execute span: one cause, one
    # trace. Without a tracer the parent's context is passed on unchanged.
    trigger = f"followup:{parent.job}"
    with telemetry.producer_span(definition.queue_name, definition.name, trigger) as context:
        env = Envelope(
            job=definition.name,
            schema=schema,
            kwargs=kwargs,
            run_id=new_run_id(),
            correlation_id=parent.correlation_id,
            triggered_by=parent.triggered_by,
            trigger=trigger,
            trace=context or parent.trace,
            origin=parent.origin,
            parent_run_id=parent.run_id,
        )
        telemetry.describe_message(env)
        message = message_for(definition, env, delay)
        _check_size(definition, env, message)
    batch.add(message, row_for(definition, env, subject, delay))
    return RunHandle(run_id=env.run_id, job_name=definition.name, schema_name=schema)
