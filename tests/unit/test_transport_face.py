"""The transport's face and its stored strings, without Redis.

Other packages, tests and bench reach the transport through ``kumiko_jobs.transport``; the
modules behind it can move names around, but the face must keep handing on the same objects,
and the Redis keys they write never change (deployed workers read what others wrote).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from kumiko_jobs import testing, transport
from kumiko_jobs.transport import keys as transport_keys
from kumiko_jobs.transport import live_workers, pushing, queues, scheduler


def test_stored_keys_never_change() -> None:
    assert (
        transport_keys.LIVE_WORKERS,
        transport_keys.WORKER_KEY,
        transport_keys.WORKERS_SINCE_KEY,
    ) == (
        "kumiko:workers",
        "kumiko:worker:",
        "kumiko:workers:since",
    )
    assert transport_keys.RQ_WORKER_MARK == "kumiko"
    assert transport_keys.RELAY_TAKEN == "kumiko:relay:taken:"
    assert transport_keys.TZ_META == "kumiko_timezone"
    assert transport.RUNNER == "kumiko_jobs.runner.execute"


def test_the_face_hands_on_functions_not_their_modules() -> None:
    # A module named like a function it defines would shadow it on the face.
    assert transport.liveness is live_workers.liveness
    assert transport.push is pushing.push
    assert transport.push_many is pushing.push_many
    assert transport.get_queue is queues.get_queue
    assert transport.Scheduler is scheduler.Scheduler


def test_every_name_on_the_face_is_exported() -> None:
    for name in transport.__all__:
        assert getattr(transport, name) is not None, name


@dataclass
class _Firing:
    message: transport.Message | None
    next_at: float | None
    missed: tuple[transport.Message, ...] = ()


class _Hooks:
    def __init__(self, firing: _Firing) -> None:
        self.firing = firing

    def sync_schedules(self) -> object:
        return None

    def restore_missing_cron(self) -> list[str]:
        return []

    def fire(self, alarm_id: str, due_at: float | None = None) -> _Firing:
        return self.firing


class _Redis:
    def __init__(self) -> None:
        self.scores: dict[str, float] = {}

    def zadd(self, key: str, mapping: dict[str, float]) -> None:
        self.scores.update(mapping)

    def zscore(self, key: str, member: str) -> float | None:
        return self.scores.get(member)


@dataclass
class _Alarm:
    id: str


def test_a_cron_tick_is_captured_by_the_testing_helpers(monkeypatch: pytest.MonkeyPatch) -> None:
    """The scheduler pushes a tick through ``pushing``, which ``captured_pushes`` replaces too:
    a user's test that moves due cron alarms never writes the tick's message to Redis."""
    message = transport.Message(body="signed", queue="default", job_id="kj-x", timeout=60)
    monkeypatch.setattr(scheduler, "_cron_hooks", _Hooks(_Firing(message, 1234.0)))
    redis: Any = _Redis()
    rq_scheduler = transport.Scheduler(queue_name="default", connection=redis)
    alarm: Any = _Alarm(transport_keys.CRON_PREFIX + "nightly")
    with testing.captured_pushes() as pushes:
        rq_scheduler.enqueue_job(alarm)
    assert pushes.messages == [message]
    assert redis.scores == {alarm.id: 1234}
    assert transport.push is pushing.push  # restored
