"""The runner pipeline: steps composed once, outermost first.

A step is ``step(state, call_next)``: it may act before and after ``call_next(state)``, or not
call it at all (a gate that refuses). Composition happens once at start-up, so a run pays
only for the calls, not for building the chain.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from .state import RunState

Next = Callable[[RunState], None]


class Step(Protocol):
    """One step of the runner: called with the run's state and the rest of the chain, which it may
    call once, or not at all to end the run there.
    """

    def __call__(self, state: RunState, call_next: Next, /) -> None: ...


def compose(steps: Sequence[Step], terminal: Next) -> Next:
    """Chain ``steps`` (outermost first) in front of ``terminal`` into one callable, built once so a
    run pays only for the calls.
    """
    chain = terminal
    for step in reversed(steps):
        chain = _bind(step, chain)
    return chain


def _bind(step: Step, call_next: Next) -> Next:
    def run(state: RunState) -> None:
        step(state, call_next)

    run.__qualname__ = f"{getattr(step, '__module__', '')}.{getattr(step, '__name__', 'step')}"
    return run
