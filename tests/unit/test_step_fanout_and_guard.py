"""The two smallest steps on fakes: fanout (who is a fan-out) and db_guard (which guard, and the
body's error rendered inside it). No database: the fan-out and the guard session are replaced
where the steps look them up.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings

from kumiko_jobs.core.outcome import Outcome
from kumiko_jobs.run.state import RunState
from kumiko_jobs.run.steps.db_guard import db_guard
from kumiko_jobs.run.steps.fanout import fanout
from tests.unit.states import make_state

# The modules, where the steps look up what the fakes replace (the package ``steps`` exports
# the step functions under the same names).
db_guard_step = importlib.import_module("kumiko_jobs.run.steps.db_guard")
fanout_step = importlib.import_module("kumiko_jobs.run.steps.fanout")


class Rest:
    """The rest of the pipeline: counts its calls, then does ``then``."""

    def __init__(self, then: Any = None) -> None:
        self.calls = 0
        self.then = then

    def __call__(self, state: RunState) -> None:
        self.calls += 1
        if self.then is not None:
            self.then(state)


# --- fanout ------------------------------------------------------------------------------------


@pytest.fixture
def fan_outs(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    calls: list[tuple[Any, ...]] = []

    def fake(parent: Any, definition: Any, subject: str) -> int:
        calls.append((parent.run_id, definition.name, subject))
        return 3

    monkeypatch.setattr(fanout_step, "fan_out", fake)
    return calls


def test_a_per_tenant_runs_message_without_a_tenant_is_its_fan_out(fan_outs: list[Any]) -> None:
    state, rest = make_state(None, per_tenant=True), Rest()
    state.tenancy.subject = "invoice_id=4"
    fanout(state, rest)
    assert fan_outs == [(state.envelope.run_id, "unit.body", "invoice_id=4")]
    assert rest.calls == 0  # the job itself is not called for the parent
    assert (state.ending.outcome, state.ending.result) == (Outcome.SUCCEEDED, 3)


@pytest.mark.parametrize(
    ("schema", "options"),
    [("t1", {"per_tenant": True}), ("t1", {}), (None, {"system": True})],
    ids=["per-tenant-child", "tenant-run", "system-run"],
)
def test_every_other_run_goes_on_down_the_pipeline(
    fan_outs: list[Any], schema: str | None, options: dict[str, Any]
) -> None:
    state, rest = make_state(schema, **options), Rest()
    fanout(state, rest)
    assert fan_outs == []
    assert rest.calls == 1
    assert state.ending.outcome is None


# --- db_guard ----------------------------------------------------------------------------------


class FakeGuardSession:
    """Stands in for guard.install.GuardSession: notes how it was made and when it was in place."""

    made: list[FakeGuardSession] = []

    def __init__(self, watch: Any, *, enforce: bool, report_use: Any) -> None:
        self.watch, self.enforce, self.report_use = watch, enforce, report_use
        self.entered = self.exited = False
        FakeGuardSession.made.append(self)

    def __enter__(self) -> FakeGuardSession:
        self.entered = True
        return self

    def __exit__(self, *exc: object) -> None:
        self.exited = True


@pytest.fixture
def guards(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[FakeGuardSession]]:
    FakeGuardSession.made = []
    monkeypatch.setattr(db_guard_step, "GuardSession", FakeGuardSession)
    yield FakeGuardSession.made


def guard_mode(mode: str) -> Any:
    return override_settings(KUMIKO_JOBS={**getattr(settings, "KUMIKO_JOBS", {}), "DB_GUARD": mode})


@pytest.mark.parametrize(("mode", "enforce"), [("enforce", True), ("log", False)])
def test_the_body_runs_inside_the_guard_of_the_mode(
    guards: list[FakeGuardSession], mode: str, enforce: bool
) -> None:
    state = make_state()
    inside: list[bool] = []
    rest = Rest(lambda s: inside.append(guards[0].entered and not guards[0].exited))
    with guard_mode(mode):
        db_guard(state, rest)
    (guard,) = guards
    assert (guard.watch, guard.enforce) == (state.watch, enforce)
    assert inside == [True] and guard.exited


def test_without_the_guard_the_body_runs_unguarded(
    guards: list[FakeGuardSession],
) -> None:
    state, rest = make_state(), Rest()
    with guard_mode("off"):
        db_guard(state, rest)
    assert guards == []
    assert rest.calls == 1


class Loud(Exception):
    def __str__(self) -> str:
        return "rendered while the guard was in place"


def test_the_bodys_error_is_rendered_inside_the_guard_and_passes_up(
    guards: list[FakeGuardSession],
) -> None:
    state = make_state()
    seen_inside: list[bool] = []

    class Watching(Loud):
        def __str__(self) -> str:
            seen_inside.append(guards[0].entered and not guards[0].exited)
            return super().__str__()

    def boom(state: RunState) -> None:
        raise Watching()

    with guard_mode("enforce"), pytest.raises(Watching):
        db_guard(state, Rest(boom))
    rendered = state.ending.rendered_error
    assert rendered is not None and isinstance(rendered.error, Watching)
    assert rendered.message == "rendered while the guard was in place"
    assert seen_inside and all(seen_inside)
