"""The follow-ups of the running attempt: enqueues made inside a run, sent if it succeeds.

Inside a run the guard forbids writes to shared tables, so ``ctx.enqueue`` (and ``enqueue`` or
``emit`` called anywhere while the run's pipeline runs) does not write a run row or push: it
adds the row and the message to the run's batch. The records step writes the rows with the
attempt's outcome, and the runner pushes the messages once that history is written, only
when the attempt succeeded.

The run side opens the batch (``collecting``) around the pipeline; the enqueue side finds it
through ``current()``, so it never needs the run's state. ``prepare_followup`` is such an
enqueue: checked like any other (``validate``), kept in the run's tenant, and added to the batch.
A system follow-up of a tenant's run (``tenant_may_start``) runs in public but counts against
that tenant's flow control (``Envelope.followup`` sets its ``flow_schema``; docs/design.md,
"Flow control: system runs a tenant's run started").
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from .. import telemetry
from ..core import conf
from ..core.envelope import Envelope
from ..core.exceptions import InvalidJob
from ..definition.job import JobDefinition
from ..models import JobRun
from ..transport import Message
from .handle import RunHandle, resolve
from .messages import message_for, row_for
from .validate import check_size, validated


@dataclass(slots=True)
class FollowupBatch:
    """The follow-ups one attempt collected, in the order they were enqueued."""

    # The envelope of the run that enqueues them: their tenant, correlation and parent.
    parent: Envelope
    entries: list[tuple[Message, JobRun]] = field(default_factory=list)
    # Set once the records step has written the rows: nothing may join the batch after that.
    closed: bool = False

    def add(self, message: Message, row: JobRun) -> None:
        """Keep a follow-up's message and its (unsaved) run row."""
        self.entries.append((message, row))

    def close(self) -> None:
        """The rows are written: later enqueues of this thread are ordinary ones again.

        Signal receivers run after the history is written (unguarded, in public). An enqueue
        there that joined the batch would have its message pushed without its row, and a
        message without a row is refused: the run would be lost.
        """
        self.closed = True

    def keep(self, inserted: set[uuid.UUID]) -> None:
        """Only the follow-ups whose rows were written (``inserted``) are pushed: a row the
        database skipped (it existed, or a unique job's key was taken) has no message."""
        self.entries = [(m, row) for m, row in self.entries if row.run_id in inserted]

    def messages(self) -> list[Message]:
        """What the runner pushes once the attempt's success is recorded."""
        return [message for message, _ in self.entries]

    def rows(self) -> list[JobRun]:
        """What the records step writes with the attempt's success."""
        return [row for _, row in self.entries]


_batch: ContextVar[FollowupBatch | None] = ContextVar("kumiko_jobs_followups", default=None)


def current() -> FollowupBatch | None:
    """The batch of the run executing in this thread; None outside a run, and once the run's
    follow-ups are written (``FollowupBatch.close``)."""
    batch = _batch.get()
    return None if batch is None or batch.closed else batch


@contextlib.contextmanager
def collecting(batch: FollowupBatch) -> Iterator[FollowupBatch]:
    """Enqueues inside the block become follow-ups in ``batch``."""
    token = _batch.set(batch)
    try:
        yield batch
    finally:
        _batch.reset(token)


@contextlib.contextmanager
def detached() -> Iterator[None]:
    """Enqueues inside the block are ordinary ones (a row now, a push on commit), not the run's
    follow-ups: for a system job that writes the rows itself inside ``ctx.system_db()``, where
    the guard allows it, and whose enqueues belong to other tenants (the operators' bulk
    retries, kumiko_jobs/bulk.py) and must commit with its own batch's transaction."""
    token = _batch.set(None)
    try:
        yield
    finally:
        _batch.reset(token)


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
    subject = validated(definition, kwargs)
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
        env = parent.followup(definition.name, schema, kwargs, context or parent.trace)
        telemetry.describe_message(env)
        message = message_for(definition, env, delay)
        check_size(definition, env, message)
    batch.add(message, row_for(definition, env, subject, delay))
    return RunHandle(run_id=env.run_id, job_name=definition.name, schema_name=schema)
