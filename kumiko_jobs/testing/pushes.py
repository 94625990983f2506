"""``captured_pushes()``: every push to Redis kept in a list instead (the ``kumiko_jobs``
fixture's ``pushes``), so that tests with real commits need no Redis either."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from .. import transport
from ..transport import pushing as transport_pushing


@dataclass
class Pushes:
    """Messages that would have gone to Redis: (job name, schema, run id, delay)."""

    messages: list[transport.Message] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.messages)


@contextlib.contextmanager
def captured_pushes() -> Iterator[Pushes]:
    """Keep every push to Redis (an enqueue's on-commit push, a follow-up's, the relay's)
    in a list instead: the history rows are what ``run_jobs()`` runs."""
    pushes = Pushes()

    def push(message: transport.Message) -> None:
        pushes.messages.append(message)

    def push_many(messages: Iterable[transport.Message]) -> None:
        pushes.messages.extend(messages)

    # The face (what the enqueue side, the run side and the relay call) and the module that
    # defines them (what the scheduler's cron firing calls).
    saved = (transport.push, transport.push_many)
    saved_here = (transport_pushing.push, transport_pushing.push_many)
    transport.push, transport.push_many = push, push_many
    transport_pushing.push, transport_pushing.push_many = push, push_many
    try:
        yield pushes
    finally:
        transport.push, transport.push_many = saved
        transport_pushing.push, transport_pushing.push_many = saved_here
