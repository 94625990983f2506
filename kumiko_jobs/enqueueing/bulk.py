"""``job.enqueue_many([kwargs, ...], tenant=...)``: many runs of one job, one COPY, one push.

Everything is checked before anything is committed: an item that ``enqueue`` would refuse
refuses the whole call (``InvalidJob`` naming the item's index), so nothing of a bad batch is
written or pushed (rows already streamed into the COPY are taken back with its savepoint). The
rows go in with ``COPY`` (bulk_rows.py; a unique job's with one
``INSERT ... ON CONFLICT DO NOTHING RETURNING``, ``fanout.insert_new``) in the caller's
transaction, and their messages are pushed on commit in one round trip per queue and 1,000
messages (``transport.push_many``). The rows are the outbox, as for
``enqueue``: a push that fails after the commit leaves queued rows the relay pushes.

Unique jobs: an item whose key a run already covers (active, or within ``unique_for``) makes no
row, and its handle is that run's (``deduplicated``); so is an item whose key an earlier item
of the same batch took, or a concurrent enqueue took first (the partial unique index makes
the INSERT skip it, as for follow-ups). ``concurrency="skip"``, ``"replace"``, ``"debounce"``
and ``max_per_tenant`` decide per enqueue under a lock, and their decision for the second item
of a batch depends on the first: ``enqueue_many`` refuses those jobs (loop over ``enqueue``).
``sequential`` and ``tenant_concurrency`` hold messages back in RQ and apply unchanged.
"""

from __future__ import annotations

import itertools
import logging
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from .. import signals, telemetry, transport
from ..core import conf
from ..core.envelope import Envelope
from ..core.exceptions import InvalidJob
from ..definition.job import JobDefinition
from ..models import JobRun, RunStatus
from . import followups, outbox
from .bulk_rows import BatchRows
from .fanout import insert_new
from .handle import RunHandle, existing_handle, resolve
from .messages import new_envelope, row_for, shares_fields, sibling_message
from .validate import check_size, resolve_schema, validated

logger = logging.getLogger("kumiko_jobs.enqueueing")

_ACTIVE = (RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.DEFERRED)
_FINISHED_FOR_WINDOW = (RunStatus.SUCCEEDED, RunStatus.FAILED)


def enqueue_many(
    job: JobDefinition | str, items: Sequence[Mapping[str, Any]], *, tenant: Any = None
) -> list[RunHandle]:
    """One run of ``job`` per item (its keyword arguments), in the items' order, on commit."""
    definition = resolve(job)
    _refuse_admission_modes(definition)
    if isinstance(items, str | bytes | Mapping) or not isinstance(items, Sequence):
        raise InvalidJob(
            f"enqueue_many() of {definition.name!r} needs a list of keyword-argument dicts, "
            f"got {type(items).__name__}."
        )
    batch = followups.current()
    if batch is not None:
        return _as_followups(batch, definition, items, tenant)
    schema = resolve_schema(definition, tenant)
    if definition.unique is None:
        return _copied(definition, schema, items)
    prepared: list[tuple[transport.Message, JobRun]] = []
    # One producer span for the call: every run's trace context is the batch's.
    with telemetry.producer_span(definition.queue_name, definition.name) as trace_context:
        for index, kwargs in enumerate(items):
            try:
                prepared.append(_prepare(definition, schema, kwargs, trace_context))
            except InvalidJob as exc:
                raise InvalidJob(f"enqueue_many() item {index}: {exc}") from exc
    return _write(definition, prepared)


def _copied(
    definition: JobDefinition, schema: str | None, items: Sequence[Mapping[str, Any]]
) -> list[RunHandle]:
    """A job without ``unique=``: every item checked and signed, its row written with ``COPY``
    (bulk_rows.py) as it is made, and one push on commit.

    PostgreSQL inserts and indexes the rows the caller has made while it makes the next ones
    (the COPY took a fifth of the call's time after everything else, bench/README.md,
    "`enqueue_many` at 10,000 runs/s"). An item refused after the first rows were sent
    aborts the COPY inside a savepoint (``atomic``), which takes every row of the call back:
    nothing of a refused call is ever committed or pushed. Where an item's own arguments
    choose its message's fields (``messages.shares_fields``), a project's callable may be
    called per item (``TENANT_WEIGHT``): those calls are all made before the COPY starts.
    """
    messages: list[transport.Message] = []
    handles: list[RunHandle] = []
    run_ids: list[uuid.UUID] = []
    with telemetry.producer_span(definition.queue_name, definition.name) as trace_context:
        signed = _each_signed(definition, schema, items, trace_context)
        head = next(signed, None)
        if head is None:
            return []
        rows = BatchRows(definition, head[1], head[2])

        def made() -> Iterator[list[Any]]:
            for message, env, subject in itertools.chain([head], signed):
                run_id, values = rows.row(env, subject, message.priority)
                run_ids.append(run_id)
                messages.append(message)
                handles.append(
                    RunHandle(run_id=env.run_id, job_name=definition.name, schema_name=schema)
                )
                yield values

        with transaction.atomic():
            rows.copy(made() if shares_fields(definition) else iter(list(made())))
    transaction.on_commit(
        lambda: push_committed_many(messages, definition.name, schema, run_ids), robust=True
    )
    return handles


def _each_signed(
    definition: JobDefinition,
    schema: str | None,
    items: Sequence[Mapping[str, Any]],
    trace_context: dict[str, str],
) -> Iterator[tuple[transport.Message, Envelope, str]]:
    """Each item checked and signed, in order; ``InvalidJob`` naming the first bad one."""
    first: transport.Message | None = None
    for index, kwargs in enumerate(items):
        try:
            message, env, subject = _signed(definition, schema, kwargs, trace_context, first)
        except InvalidJob as exc:
            raise InvalidJob(f"enqueue_many() item {index}: {exc}") from exc
        first = first or message
        yield message, env, subject


def _refuse_admission_modes(definition: JobDefinition) -> None:
    if definition.concurrency in ("skip", "replace", "debounce") or definition.max_per_tenant:
        mode = (
            f'concurrency="{definition.concurrency}"'
            if definition.concurrency in ("skip", "replace", "debounce")
            else "max_per_tenant"
        )
        raise InvalidJob(
            f"enqueue_many() cannot enqueue {definition.name!r}: its {mode} decides each "
            "enqueue against the runs before it, one at a time. Call enqueue() for each item."
        )


def _signed(
    definition: JobDefinition,
    schema: str | None,
    kwargs: Mapping[str, Any],
    trace_context: dict[str, str],
    first: transport.Message | None = None,
) -> tuple[transport.Message, Envelope, str]:
    """One item checked (arguments, JSON, subject, size): its message, envelope and subject.
    ``first``: the call's first message, whose shared fields the item's takes."""
    if not isinstance(kwargs, Mapping):
        raise InvalidJob(f"needs a dict of keyword arguments, got {type(kwargs).__name__}.")
    arguments = dict(kwargs)
    subject = validated(definition, arguments)
    env = new_envelope(definition, schema, arguments, None, None, trace=trace_context)
    message = sibling_message(definition, env, first)
    check_size(definition, env, message)
    return message, env, subject


def _prepare(
    definition: JobDefinition,
    schema: str | None,
    kwargs: Mapping[str, Any],
    trace_context: dict[str, str],
) -> tuple[transport.Message, JobRun]:
    message, env, subject = _signed(definition, schema, kwargs, trace_context)
    return message, row_for(definition, env, subject, 0.0)


def _as_followups(
    batch: followups.FollowupBatch,
    definition: JobDefinition,
    items: Sequence[Mapping[str, Any]],
    tenant: Any,
) -> list[RunHandle]:
    """Inside a run: every item checked first, then each one a follow-up of the run."""
    limit = conf.get().MAX_FOLLOWUPS_PER_RUN
    if len(batch.entries) + len(items) > limit:
        raise InvalidJob(
            f"enqueue_many() of {len(items)} runs of {definition.name!r} would exceed "
            f"MAX_FOLLOWUPS_PER_RUN={limit} follow-ups in one attempt. Enqueue one job that "
            "processes the batch, or raise the setting."
        )
    # All or nothing here too: an item refused by a check made per item (its message's size,
    # say) after earlier items joined the batch takes them out again, so a job that catches
    # the refusal and succeeds sends none of the call's runs.
    start = len(batch.entries)
    handles: list[RunHandle] = []
    try:
        for index, kwargs in enumerate(items):
            try:
                if not isinstance(kwargs, Mapping):
                    raise InvalidJob(
                        f"needs a dict of keyword arguments, got {type(kwargs).__name__}."
                    )
                handle = followups.prepare_followup(batch, definition, dict(kwargs), tenant=tenant)
            except InvalidJob as exc:
                raise InvalidJob(f"enqueue_many() item {index}: {exc}") from exc
            handles.append(handle)
    except BaseException:
        del batch.entries[start:]
        raise
    return handles


def _write(
    definition: JobDefinition, prepared: list[tuple[transport.Message, JobRun]]
) -> list[RunHandle]:
    """Insert the rows in one statement; register one push of the new ones on commit."""
    covered: dict[str, JobRun] = {}
    if definition.unique is not None:
        covered = _covering(definition, {row.unique_key for _, row in prepared if row.unique_key})
    fresh = [(m, row) for m, row in prepared if row.unique_key not in covered]
    with transaction.atomic():
        inserted = insert_new([row for _, row in fresh])
    skipped = {row.unique_key for _, row in fresh if row.run_id not in inserted}
    if skipped:
        # Taken by an earlier item of this batch, or by an enqueue that committed meanwhile.
        covered.update(_covering(definition, {k for k in skipped if k}, window=False))
    pushed = [(m, row) for m, row in fresh if row.run_id in inserted]
    if pushed:
        transaction.on_commit(
            lambda: push_committed_many(
                [m for m, _ in pushed],
                definition.name,
                pushed[0][1].schema_name or None,
                [row.run_id for _, row in pushed],
            ),
            robust=True,
        )
    handles = []
    for _, row in prepared:
        if row.run_id in inserted:
            handles.append(
                RunHandle(
                    run_id=row.run_id.hex,
                    job_name=row.job_name,
                    schema_name=row.schema_name or None,
                )
            )
        else:
            handles.append(existing_handle(covered[str(row.unique_key)]))
    return handles


def _covering(
    definition: JobDefinition, keys: set[str], *, window: bool = True
) -> dict[str, JobRun]:
    """The runs that cover ``keys`` (``unique.covering_run`` for many keys): one query for the
    active ones, one more for ``unique_for``'s window."""
    if not keys:
        return {}
    found = {
        str(run.unique_key): run
        for run in JobRun.objects.filter(unique_key__in=keys, status__in=_ACTIVE)
    }
    rest = keys - found.keys()
    if window and rest and definition.unique_for:
        since = timezone.now() - timedelta(seconds=definition.unique_for)
        for run in JobRun.objects.filter(
            unique_key__in=rest, status__in=_FINISHED_FOR_WINDOW, finished_at__gte=since
        ).order_by("finished_at"):
            found[str(run.unique_key)] = run  # ascending: the latest one wins
    return found


def push_committed_many(
    messages: list[transport.Message],
    job_name: str,
    schema: str | None,
    run_ids: Sequence[uuid.UUID],
) -> None:
    """Push the committed runs' messages in one pipeline per queue; ``job_queued`` for each.
    On failure log once, and leave the messages to the relay (their rows are the outbox)."""
    if outbox.push_paused():
        logger.warning(
            "%d runs of %s are committed but not pushed: a push failed less than "
            "PUSH_FAILURE_PAUSE s ago, so the relay pushes them",
            len(messages),
            job_name,
        )
        return
    try:
        transport.push_many(messages)
    except Exception as exc:
        outbox.note_push_failed(time.monotonic())
        logger.warning(
            "%d runs of %s are committed but not all pushed (%s: %s); the relay will push them",
            len(messages),
            job_name,
            type(exc).__name__,
            exc,
        )
        return
    outbox.note_push_failed(None)
    for run_id in run_ids:
        signals.send(
            signals.job_queued,
            run_id=str(run_id),
            job_name=job_name,
            schema_name=schema,
            attempt=1,
            outcome="queued",
            error=None,
        )
