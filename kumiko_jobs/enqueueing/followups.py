"""The follow-ups of the running attempt: enqueues made inside a run, sent if it succeeds.

Inside a run the guard forbids writes to shared tables, so ``ctx.enqueue`` (and ``enqueue`` or
``emit`` called anywhere while the run's pipeline runs) does not write a run row or push: it
adds the row and the message to the run's batch. The records step writes the rows with the
attempt's outcome, and the runner pushes the messages once that history is written, only
when the attempt succeeded.

The run side opens the batch (``collecting``) around the pipeline; the enqueue side finds it
through ``current()``, so it never needs the run's state.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..core.envelope import Envelope
    from ..models import JobRun
    from ..transport import Message


@dataclass(slots=True)
class FollowupBatch:
    """The follow-ups one attempt collected, in the order they were enqueued."""

    # The envelope of the run that enqueues them: their tenant, correlation and parent.
    parent: Envelope
    entries: list[tuple[Message, JobRun]] = field(default_factory=list)

    def add(self, message: Message, row: JobRun) -> None:
        self.entries.append((message, row))

    def messages(self) -> list[Message]:
        return [message for message, _ in self.entries]

    def rows(self) -> list[JobRun]:
        return [row for _, row in self.entries]


_batch: ContextVar[FollowupBatch | None] = ContextVar("kumiko_jobs_followups", default=None)


def current() -> FollowupBatch | None:
    """The batch of the run executing in this thread, None outside a run."""
    return _batch.get()


@contextlib.contextmanager
def collecting(batch: FollowupBatch) -> Iterator[FollowupBatch]:
    """Enqueues inside the block become follow-ups in ``batch``."""
    token = _batch.set(batch)
    try:
        yield batch
    finally:
        _batch.reset(token)
