"""Unit tests for the transport's scheduler (transport/scheduler.py, scheduler_loop.py): no Redis.

``Scheduler`` takes its Redis connection; ``FakeRedis`` below is the few commands it sends, in
memory. The cron domain is a fake ``CronHooks``, pushes are captured by
``testing.captured_pushes``. Pinned: a rung cron alarm pushes its tick's message (never the alarm
itself) and is re-armed at the next tick; an alarm of no registered job is removed; a tick already
fired is re-armed without a push; with PostgreSQL down the alarm is left due for the next round;
any other due job is rq-scheduler's move. The loop survives a Redis outage (and syncs the cron
entries again); the heartbeat writes a lost registration again; after an outage the scheduler
drops its own stale registration instead of refusing to start. Then the helpers over Redis keys:
which cron entries rq-scheduler would not tick, and how far behind delayed work is.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from django.conf import settings
from django.db import OperationalError
from django.test import override_settings
from redis.exceptions import ConnectionError as RedisConnectionError

from kumiko_jobs import testing
from kumiko_jobs.transport import Message, queues, scheduler, scheduler_loop
from kumiko_jobs.transport.keys import CRON_PREFIX
from kumiko_jobs.transport.scheduler import Scheduler

SCHEDULED = Scheduler.scheduled_jobs_key


class FakeRedis:
    """The commands the scheduler sends, over dicts: sorted sets, hashes, plain keys."""

    def __init__(self) -> None:
        self.zsets: dict[str, dict[str, float]] = {}
        self.hashes: dict[str, dict[str, Any]] = {}
        self.keys: set[str] = set()
        self.expiring: dict[str, int] = {}
        self.commands: list[str] = []
        self.lists: dict[str, list[str]] = {}
        self.connection_pool = SimpleNamespace(
            connection_kwargs={"host": "redis", "port": 6379, "db": 0}
        )

    # sorted sets
    def zadd(self, key: str, mapping: dict[str, float]) -> int:
        self.commands.append("zadd")
        self.zsets.setdefault(key, {}).update(mapping)
        return len(mapping)

    def zrem(self, key: str, member: str) -> int:
        self.commands.append("zrem")
        return int(self.zsets.get(key, {}).pop(member, None) is not None)

    def zscore(self, key: str, member: str) -> float | None:
        return self.zsets.get(key, {}).get(member)

    def zcount(self, key: str, low: float, high: float) -> int:
        return sum(1 for score in self.zsets.get(key, {}).values() if low <= score <= high)

    def zrangebyscore(
        self,
        key: str,
        low: float | str,
        high: float | str,
        start: int,
        num: int,
        withscores: bool,
    ) -> list[tuple[bytes, float]]:
        # Redis's bounds: a number, "+inf", or "(x" for "greater than x".
        above = isinstance(low, str) and low.startswith("(")
        floor = float(low[1:]) if above else float(low)  # type: ignore[index]
        found = sorted(
            (score, member)
            for member, score in self.zsets.get(key, {}).items()
            if (score > floor if above else score >= floor) and score <= float(high)
        )
        return [(member.encode(), score) for score, member in found[start : start + num]]

    # hashes and keys
    def hset(self, key: str, name: str, value: Any) -> int:
        self.commands.append("hset")
        self.hashes.setdefault(key, {})[name] = value
        return 1

    def hexists(self, key: str, name: str) -> bool:
        return name in self.hashes.get(key, {})

    def exists(self, key: str) -> int:
        return int(key in self.hashes or key in self.keys)

    def expire(self, key: str, seconds: int) -> bool:
        self.commands.append("expire")
        if key not in self.hashes and key not in self.keys:
            return False
        self.expiring[key] = seconds
        return True

    def delete(self, key: str) -> int:
        self.commands.append("delete")
        found = key in self.hashes or key in self.keys
        self.hashes.pop(key, None)
        self.keys.discard(key)
        return int(found)

    def scan_iter(self, match: str, count: int) -> Iterator[str]:
        prefix = match.rstrip("*")
        return iter([k for k in self.hashes if k.startswith(prefix)])

    def pipeline(self, transaction: bool = True) -> Pipeline:
        return Pipeline(self)

    # lists (the queues' doorbells)
    def lpush(self, key: str, *values: str) -> int:
        self.commands.append(f"lpush {key}")
        self.lists.setdefault(key, [])[:0] = reversed(values)
        return len(self.lists[key])

    def ltrim(self, key: str, start: int, end: int) -> bool:
        self.lists[key] = self.lists.get(key, [])[start : end + 1]
        return True


class Pipeline:
    """Queues calls and runs them on ``execute``, as redis-py's pipeline does."""

    def __init__(self, redis: FakeRedis) -> None:
        self.redis = redis
        self.queued: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def __getattr__(self, name: str) -> Any:
        def queue(*args: Any, **kwargs: Any) -> Pipeline:
            self.queued.append((name, args, kwargs))
            return self

        return queue

    def execute(self) -> list[Any]:
        queued, self.queued = self.queued, []
        return [getattr(self.redis, name)(*args, **kwargs) for name, args, kwargs in queued]


@dataclass
class Firing:
    message: Message | None
    next_at: float | None
    missed: Sequence[Message] = ()


@dataclass
class Hooks:
    """The cron domain: what ``fire`` answers (or raises), and what was asked."""

    firing: Firing | None = None
    error: Exception | None = None
    fired: list[str] = field(default_factory=list)
    due_at: list[float | None] = field(default_factory=list)
    syncs: int = 0
    restored: Sequence[str] = ()

    def sync_schedules(self) -> object:
        self.syncs += 1
        return None

    def restore_missing_cron(self) -> Sequence[str]:
        return self.restored

    def fire(self, alarm_id: str, due_at: float | None = None) -> Firing:
        self.fired.append(alarm_id)
        self.due_at.append(due_at)
        if self.error is not None:
            raise self.error
        assert self.firing is not None
        return self.firing


@dataclass
class Alarm:
    """A due job as rq-scheduler hands it to ``enqueue_job`` (its id and queue are read)."""

    id: str
    origin: str = "default"


def install(monkeypatch: pytest.MonkeyPatch, hooks: Hooks) -> Hooks:
    monkeypatch.setattr(scheduler, "_cron_hooks", hooks)
    return hooks


@pytest.fixture
def redis() -> FakeRedis:
    return FakeRedis()


@pytest.fixture
def pushes() -> Iterator[testing.Pushes]:
    with testing.captured_pushes() as captured:
        yield captured


def make_scheduler(redis: FakeRedis) -> Scheduler:
    return Scheduler(queue_name="default", connection=redis, interval=5)


TICK = Message(body="signed-tick", queue="default", job_id="kj-tick", timeout=60)
ALARM = Alarm(CRON_PREFIX + "billing_nightly")


# --- a rung cron alarm ---------------------------------------------------------------------------


def test_a_cron_alarm_pushes_its_tick_and_is_rearmed(
    monkeypatch: pytest.MonkeyPatch, redis: FakeRedis, pushes: testing.Pushes
) -> None:
    hooks = install(monkeypatch, Hooks(Firing(TICK, 1_900_000_000.7)))
    make_scheduler(redis).enqueue_job(ALARM)  # type: ignore[arg-type]
    assert hooks.fired == [ALARM.id]
    assert pushes.messages == [TICK]  # the tick's own message, never the alarm
    # Scored as given: truncated to 1_900_000_000, it rang 0.7 s early (issue 23).
    assert redis.zsets[SCHEDULED] == {ALARM.id: 1_900_000_000.7}


def test_a_tick_that_already_fired_is_rearmed_without_a_push(
    monkeypatch: pytest.MonkeyPatch, redis: FakeRedis, pushes: testing.Pushes
) -> None:
    install(monkeypatch, Hooks(Firing(None, 1_900_000_060)))
    make_scheduler(redis).enqueue_job(ALARM)  # type: ignore[arg-type]
    assert pushes.messages == []
    assert redis.zsets[SCHEDULED] == {ALARM.id: 1_900_000_060}


def test_an_alarm_of_no_registered_job_is_removed(
    monkeypatch: pytest.MonkeyPatch,
    redis: FakeRedis,
    pushes: testing.Pushes,
    caplog: pytest.LogCaptureFixture,
) -> None:
    install(monkeypatch, Hooks(Firing(TICK, None)))
    redis.zsets[SCHEDULED] = {ALARM.id: 1.0}
    with caplog.at_level(logging.WARNING):
        make_scheduler(redis).enqueue_job(ALARM)  # type: ignore[arg-type]
    assert redis.zsets[SCHEDULED] == {}
    assert pushes.messages == []
    assert "belongs to no registered cron job; removed" in caplog.text


def test_with_postgresql_down_the_alarm_is_left_due(
    monkeypatch: pytest.MonkeyPatch,
    redis: FakeRedis,
    pushes: testing.Pushes,
    caplog: pytest.LogCaptureFixture,
) -> None:
    install(monkeypatch, Hooks(error=OperationalError("connection refused")))
    redis.zsets[SCHEDULED] = {ALARM.id: 1.0}
    with caplog.at_level(logging.WARNING):
        make_scheduler(redis).enqueue_job(ALARM)  # type: ignore[arg-type]
    assert redis.zsets[SCHEDULED] == {ALARM.id: 1.0}  # the next round rings it again
    assert pushes.messages == []
    assert "PostgreSQL unavailable" in caplog.text


def test_another_error_of_the_cron_domain_is_not_swallowed(
    monkeypatch: pytest.MonkeyPatch, redis: FakeRedis
) -> None:
    install(monkeypatch, Hooks(error=RuntimeError("a bug")))
    with pytest.raises(RuntimeError, match="a bug"):
        make_scheduler(redis).enqueue_job(ALARM)  # type: ignore[arg-type]


def test_any_other_due_job_is_rq_schedulers_move(
    monkeypatch: pytest.MonkeyPatch, redis: FakeRedis
) -> None:
    hooks = install(monkeypatch, Hooks())
    moved: list[str] = []
    monkeypatch.setattr(queues.DelayedSet, "enqueue_job", lambda self, job: moved.append(job.id))
    make_scheduler(redis).enqueue_job(Alarm("kj-run-1", origin="mail"))  # type: ignore[arg-type]
    assert moved == ["kj-run-1"]
    assert hooks.fired == []
    # ... and rings its queue's doorbell after RQ's push (transport/doorbell.py)
    assert redis.commands[-1:] == ["lpush kumiko:fair:mail:bell"]
    assert redis.lists["kumiko:fair:mail:bell"] == ["1"]


def test_each_round_restores_deleted_cron_entries_first(
    monkeypatch: pytest.MonkeyPatch, redis: FakeRedis, caplog: pytest.LogCaptureFixture
) -> None:
    install(monkeypatch, Hooks(restored=["kj-cron-a", "kj-cron-b"]))
    order: list[str] = []
    monkeypatch.setattr(queues.DelayedSet, "enqueue_jobs", lambda self: order.append("round"))
    with caplog.at_level(logging.WARNING):
        make_scheduler(redis).enqueue_jobs()
    assert order == ["round"]
    assert "restored deleted cron entries: kj-cron-a, kj-cron-b" in caplog.text


# --- surviving Redis -----------------------------------------------------------------------------


def test_the_loop_survives_a_redis_outage_and_syncs_again(
    monkeypatch: pytest.MonkeyPatch, redis: FakeRedis
) -> None:
    hooks = install(monkeypatch, Hooks())
    runs: list[bool] = []

    def loop(self: Scheduler, burst: bool = False) -> None:
        runs.append(self._restarting)
        if len(runs) < 3:
            raise RedisConnectionError("Connection refused")

    pauses: list[float] = []
    monkeypatch.setattr(Scheduler, "serve", loop)
    monkeypatch.setattr(time, "sleep", pauses.append)
    make_scheduler(redis).run(burst=True)
    assert runs == [False, True, True]  # restarted twice, marked as a restart
    assert hooks.syncs == 3
    assert pauses == [scheduler._PAUSE, scheduler._PAUSE]


def test_the_loop_ends_on_any_other_error(
    monkeypatch: pytest.MonkeyPatch, redis: FakeRedis
) -> None:
    install(monkeypatch, Hooks())

    def loop(self: Scheduler, burst: bool = False) -> None:
        raise ValueError("There's already an active RQ scheduler")

    monkeypatch.setattr(Scheduler, "serve", loop)
    with pytest.raises(ValueError):
        make_scheduler(redis).run(burst=True)


def test_the_heartbeat_extends_a_live_registration(redis: FakeRedis) -> None:
    rq_scheduler = make_scheduler(redis)
    redis.hashes[rq_scheduler.key] = {"birth": 1.0}
    rq_scheduler.heartbeat()
    assert redis.expiring == {rq_scheduler.key: 15}  # interval + 10
    assert "hset" not in redis.commands


def test_the_heartbeat_writes_a_lost_registration_again(
    redis: FakeRedis, caplog: pytest.LogCaptureFixture
) -> None:
    rq_scheduler = make_scheduler(redis)
    with caplog.at_level(logging.WARNING):
        rq_scheduler.heartbeat()
    assert "birth" in redis.hashes[rq_scheduler.key]
    assert redis.expiring == {rq_scheduler.key: 15}
    assert "registration was gone from Redis; registered again" in caplog.text


def test_after_an_outage_its_own_stale_registration_does_not_stop_it(redis: FakeRedis) -> None:
    rq_scheduler = make_scheduler(redis)
    redis.hashes[rq_scheduler.key] = {"birth": 1.0}  # its death mark never reached Redis
    rq_scheduler._restarting = True
    rq_scheduler.register_birth()
    assert not rq_scheduler._restarting
    assert "death" not in redis.hashes[rq_scheduler.key]
    assert redis.hashes[rq_scheduler.key]["birth"] != 1.0


def test_at_first_start_a_live_registration_of_that_name_is_refused(redis: FakeRedis) -> None:
    rq_scheduler = make_scheduler(redis)
    redis.hashes[rq_scheduler.key] = {"birth": 1.0}
    with pytest.raises(ValueError, match="already an active RQ scheduler"):
        rq_scheduler.register_birth()


# --- reading rq-scheduler's keys -----------------------------------------------------------------


@pytest.fixture
def on_fake_redis(monkeypatch: pytest.MonkeyPatch, redis: FakeRedis) -> FakeRedis:
    """Every queue's handle (``scheduler_for``, ``scheduler_lag``) is on ``redis``."""
    monkeypatch.setattr(
        scheduler, "get_queue", lambda name: SimpleNamespace(name=name, connection=redis)
    )
    return redis


def test_cron_entries_without_a_slot_or_a_job_hash_are_missing(on_fake_redis: FakeRedis) -> None:
    redis = on_fake_redis
    redis.zsets[SCHEDULED] = {"kj-cron-ok": 1.0, "kj-cron-no-hash": 2.0}
    redis.keys.update({"rq:job:kj-cron-ok", "rq:job:kj-cron-no-slot"})
    ids = ["kj-cron-ok", "kj-cron-no-hash", "kj-cron-no-slot", "kj-cron-neither"]
    assert scheduler.missing_cron_entries(ids) == [
        "kj-cron-no-hash",
        "kj-cron-no-slot",
        "kj-cron-neither",
    ]


def test_no_cron_entries_asks_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    def unreachable(name: str) -> Any:
        raise AssertionError("no Redis round trip for no ids")

    monkeypatch.setattr(scheduler, "get_queue", unreachable)
    assert scheduler.missing_cron_entries([]) == []


def test_lag_counts_overdue_messages_once_per_redis(
    monkeypatch: pytest.MonkeyPatch, on_fake_redis: FakeRedis
) -> None:
    redis = on_fake_redis
    now = time.time()
    redis.zsets[SCHEDULED] = {"late-1": now - 300, "late-2": now - 120, "soon": now + 60}
    monkeypatch.setattr(scheduler.project_settings, "rq_queue_names", lambda: ["default", "mail"])
    lag = scheduler.scheduler_lag(after=60)
    assert lag.overdue == 2  # both queues share one Redis: counted once
    assert lag.oldest_due == pytest.approx(now - 300)
    assert lag.scheduler_registered is False


def test_lag_sees_a_live_scheduler_registration(
    monkeypatch: pytest.MonkeyPatch, on_fake_redis: FakeRedis
) -> None:
    redis = on_fake_redis
    redis.zsets[SCHEDULED] = {"late": time.time() - 300}
    prefix = Scheduler.redis_scheduler_namespace_prefix
    redis.hashes[prefix + "dead"] = {"birth": 1.0, "death": 2.0}
    monkeypatch.setattr(scheduler.project_settings, "rq_queue_names", lambda: ["default"])
    assert scheduler.scheduler_lag(after=60).scheduler_registered is False
    redis.hashes[prefix + "alive"] = {"birth": 3.0}
    assert scheduler.scheduler_lag(after=60).scheduler_registered is True


def test_no_overdue_work_is_no_lag(
    monkeypatch: pytest.MonkeyPatch, on_fake_redis: FakeRedis
) -> None:
    on_fake_redis.zsets[SCHEDULED] = {"soon": time.time() + 60}
    monkeypatch.setattr(scheduler.project_settings, "rq_queue_names", lambda: ["default"])
    lag = scheduler.scheduler_lag(after=60)
    assert (lag.overdue, lag.oldest_due) == (0, None)


# --- between rounds: waking at the earliest due time (SCHEDULER_POLL) ---------------------------


class Clock:
    """``time`` as the scheduler's loop reads it: wall clock and monotonic move together, and
    ``sleep`` only advances them (noting each nap)."""

    def __init__(self, now: float = 1_900_000_000.0) -> None:
        self.now = now
        self.naps: list[float] = []

    def time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.naps.append(round(seconds, 6))
        self.now = round(self.now + seconds, 6)  # no float dust between looks


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(scheduler_loop, "time", fake)
    return fake


def poll(seconds: float) -> Any:
    return override_settings(KUMIKO_JOBS={**settings.KUMIKO_JOBS, "SCHEDULER_POLL": seconds})


def test_it_sleeps_until_the_earliest_due_time_then_runs_a_round(
    redis: FakeRedis, clock: Clock
) -> None:
    rq_scheduler = make_scheduler(redis)
    rq_scheduler._last_round_at = clock.now
    redis.zsets[SCHEDULED] = {"kj-in-250ms": clock.now + 0.25, "kj-later": clock.now + 30}
    with poll(0.1):
        assert rq_scheduler._wait_for_due(clock.now + 5) is True
    # Two looks a poll apart, then a nap to the very due time (not to the next poll).
    assert clock.naps == [0.1, 0.1, 0.05]
    assert clock.now == pytest.approx(1_900_000_000.25)


def test_what_the_last_round_left_due_does_not_make_every_look_a_round(
    redis: FakeRedis, clock: Clock
) -> None:
    """A cron alarm left due (PostgreSQL down) waits for the next full round, no spinning."""
    rq_scheduler = make_scheduler(redis)
    redis.zsets[SCHEDULED] = {"kj-cron-left-due": clock.now - 1}
    rq_scheduler._last_round_at = clock.now
    with poll(0.5):
        assert rq_scheduler._wait_for_due(clock.now + 2) is False
    assert clock.naps == [0.5, 0.5, 0.5, 0.5]


def test_a_message_pushed_meanwhile_is_seen_at_the_next_look(
    redis: FakeRedis, clock: Clock
) -> None:
    rq_scheduler = make_scheduler(redis)
    rq_scheduler._last_round_at = clock.now
    real_sleep = clock.sleep

    def sleep_and_push(seconds: float) -> None:
        real_sleep(seconds)
        if not redis.zsets.get(SCHEDULED):  # pushed once, during the first nap
            redis.zsets[SCHEDULED] = {"kj-in-50ms": clock.now + 0.05}

    clock.sleep = sleep_and_push  # type: ignore[method-assign]
    with poll(0.1):
        assert rq_scheduler._wait_for_due(clock.now + 5) is True
    assert clock.naps == [0.1, 0.05]  # nothing due at first; then exactly to its due time


def test_without_polling_it_sleeps_to_the_next_round_without_a_look(
    redis: FakeRedis, clock: Clock
) -> None:
    rq_scheduler = make_scheduler(redis)
    redis.zsets[SCHEDULED] = {"kj-soon": clock.now + 0.2}
    with poll(0):
        assert rq_scheduler._wait_for_due(clock.now + 1) is False
    assert clock.naps == [1.0]


def test_an_early_round_that_finds_the_lock_taken_does_not_warn(
    redis: FakeRedis, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    rq_scheduler = make_scheduler(redis)
    monkeypatch.setattr(Scheduler, "acquire_lock", lambda self: False)
    with caplog.at_level(logging.WARNING):
        assert rq_scheduler._round(full=False) is False
    assert "Lock already taken" not in caplog.text
    with caplog.at_level(logging.WARNING):
        assert rq_scheduler._round(full=True) is False
    assert "Lock already taken" in caplog.text  # once per --interval, as rq-scheduler says it


def test_the_poll_setting_is_checked() -> None:
    from django.core.exceptions import ImproperlyConfigured

    from kumiko_jobs.core import conf

    for bad in (-0.1, 61, "0.1", True, float("nan")):
        with pytest.raises(ImproperlyConfigured, match="SCHEDULER_POLL"):
            conf._validate({"SCHEDULER_POLL": bad})
    assert conf._validate({"SCHEDULER_POLL": 0}).SCHEDULER_POLL == 0.0
