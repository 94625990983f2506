"""``context.render_error``: the job's exception as text, rendered once (pure, no services).

The db_guard step calls it inside the run's tenant and guard; everything after the body uses
the text. These tests pin what the text holds, and that rendering never raises.
"""

from __future__ import annotations

from kumiko_jobs.run.rendered_errors import render_error
from tests.unit.states import make_state


class Refused(Exception):
    def __str__(self) -> str:
        raise RuntimeError("the guard said no")


class Counting(Exception):
    calls = 0

    def __str__(self) -> str:
        Counting.calls += 1
        return "counted"


def _raised(error: BaseException) -> BaseException:
    try:
        raise error
    except BaseException as exc:
        return exc


def test_message_type_and_traceback():
    rendered = render_error(_raised(ValueError("bad value")))
    assert (rendered.type_name, rendered.message) == ("ValueError", "bad value")
    assert rendered.traceback.startswith("Traceback (most recent call last):")
    assert rendered.traceback.rstrip().endswith("ValueError: bad value")


def test_an_exception_whose_str_fails_still_renders():
    rendered = render_error(_raised(Refused()))
    assert rendered.type_name == "Refused"
    assert rendered.message == "<the Refused could not be rendered: RuntimeError>"
    assert "Refused" in rendered.traceback


def test_causes_and_groups_are_rendered_with_it():
    try:
        try:
            raise Counting()
        except Counting as inner:
            raise KeyError("outer") from inner
    except KeyError as exc:
        chained = exc
    Counting.calls = 0
    rendered = render_error(chained)
    assert "counted" in rendered.traceback and "KeyError: 'outer'" in rendered.traceback
    group = render_error(_raised(ExceptionGroup("several", [Counting(), ValueError("v")])))
    assert "counted" in group.traceback and "ValueError: v" in group.traceback
    assert Counting.calls >= 2


def test_the_run_reuses_the_rendering_for_its_own_error_only():
    state = make_state(name="unit.render", kwargs={}, run_id="0" * 32)
    error = _raised(Counting())
    state.ending.fail(error)
    state.ending.note_rendered(render_error(error))
    Counting.calls = 0
    assert state.ending.described_error() is state.ending.rendered_error
    assert Counting.calls == 0  # not rendered again
    state.ending.fail(ValueError("kumiko's own"))
    described = state.ending.described_error()
    assert described is not None and described.message == "kumiko's own"
