"""Unit tests for the runner pipeline's composition and its one list of steps: no database.

Pins ``run/pipeline.compose`` (steps run outermost first and unwind innermost first, around the
terminal; a step that does not call ``call_next`` stops the rest; an exception passes up
through every step; the chain is built once and can be called again) and ``DEFAULT_STEPS`` (the
documented order in docs/design.md, "Pipeline": tracing, records, deferral, gates, fanout,
tenancy, atomic, db_guard). The steps here are small recording fakes; nothing runs a real step.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kumiko_jobs.run import steps as steps_package
from kumiko_jobs.run.pipeline import Next, Step, compose
from kumiko_jobs.run.state import RunState
from kumiko_jobs.run.steps import DEFAULT_STEPS
from tests.unit.states import make_state


def recording(name: str, calls: list[str]) -> Step:
    """A step that notes when it is entered and left, and calls the rest in between."""

    def step(state: RunState, call_next: Next) -> None:
        calls.append(f"{name}:before")
        call_next(state)
        calls.append(f"{name}:after")

    step.__name__ = name
    return step


def terminal_into(calls: list[str]) -> Next:
    def terminal(state: RunState) -> None:
        calls.append("terminal")

    return terminal


# --- compose -----------------------------------------------------------------------------------


def test_steps_run_outermost_first_and_unwind_innermost_first() -> None:
    calls: list[str] = []
    chain = compose([recording(n, calls) for n in ("a", "b", "c")], terminal_into(calls))
    chain(make_state(kwargs={}))
    assert calls == [
        "a:before",
        "b:before",
        "c:before",
        "terminal",
        "c:after",
        "b:after",
        "a:after",
    ]


def test_no_steps_is_the_terminal_alone() -> None:
    calls: list[str] = []
    terminal = terminal_into(calls)
    chain = compose([], terminal)
    assert chain is terminal
    chain(make_state(kwargs={}))
    assert calls == ["terminal"]


def test_every_step_and_the_terminal_see_the_same_state() -> None:
    seen: list[RunState] = []

    def step(state: RunState, call_next: Next) -> None:
        seen.append(state)
        call_next(state)

    state = make_state(kwargs={})
    compose([step, step], seen.append)(state)
    assert len(seen) == 3
    assert all(s is state for s in seen)


def test_a_step_that_does_not_call_next_stops_the_rest() -> None:
    calls: list[str] = []

    def refuse(state: RunState, call_next: Next) -> None:
        calls.append("refuse")
        state.ending.drop("refused by the fake gate")

    chain = compose(
        [recording("outer", calls), refuse, recording("inner", calls)], terminal_into(calls)
    )
    state = make_state(kwargs={})
    chain(state)
    # The outer step still unwinds; nothing below the refusing step ran.
    assert calls == ["outer:before", "refuse", "outer:after"]
    assert state.ending.drop_reason == "refused by the fake gate"


def test_an_exception_passes_up_through_every_step() -> None:
    calls: list[str] = []

    def terminal(state: RunState) -> None:
        calls.append("terminal")
        raise LookupError("from the body")

    chain = compose([recording("a", calls), recording("b", calls)], terminal)
    with pytest.raises(LookupError, match="from the body"):
        chain(make_state(kwargs={}))
    # No step caught it, so none reached its "after".
    assert calls == ["a:before", "b:before", "terminal"]


def test_an_outer_step_can_catch_what_an_inner_one_raised() -> None:
    caught: list[BaseException] = []

    def catcher(state: RunState, call_next: Next) -> None:
        try:
            call_next(state)
        except ValueError as exc:
            caught.append(exc)

    def raiser(state: RunState, call_next: Next) -> None:
        raise ValueError("inner")

    calls: list[str] = []
    compose([catcher, raiser], terminal_into(calls))(make_state(kwargs={}))
    assert [str(e) for e in caught] == ["inner"]
    assert calls == []  # the raising step did not call the terminal


def test_a_composed_chain_runs_again_without_rebuilding() -> None:
    calls: list[str] = []
    chain = compose([recording("a", calls)], terminal_into(calls))
    chain(make_state(kwargs={}))
    chain(make_state(kwargs={}))
    assert calls == ["a:before", "terminal", "a:after"] * 2


def test_a_bound_step_is_named_after_the_step() -> None:
    calls: list[str] = []
    chain = compose([recording("named_step", calls)], terminal_into(calls))
    assert chain.__qualname__.endswith(".named_step")


# --- DEFAULT_STEPS -----------------------------------------------------------------------------

DOCUMENTED_ORDER = (
    "tracing",
    "records",
    "deferral",
    "gates",
    "fanout",
    "tenancy",
    "atomic",
    "db_guard",
)


def test_default_steps_are_in_the_documented_order() -> None:
    assert tuple(step.__name__ for step in DEFAULT_STEPS) == DOCUMENTED_ORDER  # type: ignore[attr-defined]


def test_each_default_step_lives_in_its_own_module() -> None:
    for step in DEFAULT_STEPS:
        name = step.__name__  # type: ignore[attr-defined]
        assert step.__module__ == f"{steps_package.__name__}.{name}"


def test_the_design_document_lists_the_steps_in_the_same_order() -> None:
    """docs/design.md's "Pipeline" bullets name the steps in DEFAULT_STEPS's order."""
    design = Path(__file__).resolve().parents[2] / "docs" / "design.md"
    text = design.read_text(encoding="utf-8")
    start = text.index("**Pipeline**")
    section = text[start : text.index("* terminal", start)]
    bullets = [line.strip() for line in section.splitlines() if line.strip().startswith("* `")]
    named = tuple(bullet.split("`")[1] for bullet in bullets)
    # atomic has no bullet of its own in design.md (docs/reliability.md describes it); every
    # bullet there must still appear in DEFAULT_STEPS's order.
    assert named == tuple(n for n in DOCUMENTED_ORDER if n in named)
    assert set(named) >= set(DOCUMENTED_ORDER) - {"atomic"}
