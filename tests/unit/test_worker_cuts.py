"""``transport.cuts.through_cuts``: a worker's call outside RQ's loop, tried again after
a lost connection, a bounded number of times (the integration test cuts a real connection:
tests/integration/test_chaos_worker_redis_cuts.py)."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from kumiko_jobs.transport import cuts


@pytest.fixture
def pauses(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    slept: list[float] = []
    monkeypatch.setattr(cuts.time, "sleep", slept.append)
    return slept


def _failing(times: int, error: Exception) -> tuple[list[int], Callable[[], None]]:
    calls: list[int] = []

    def call() -> None:
        calls.append(1)
        if len(calls) <= times:
            raise error

    return calls, call


def test_a_cut_is_tried_again_with_doubling_pauses(pauses: list[float]) -> None:
    calls, call = _failing(2, RedisConnectionError("Connection closed by server."))
    cuts.through_cuts(call, "registering", "worker w1")
    assert len(calls) == 3
    assert pauses == [0.25, 0.5]


def test_the_tries_are_bounded_and_the_exit_says_why(
    pauses: list[float], caplog: pytest.LogCaptureFixture
) -> None:
    calls, call = _failing(100, RedisConnectionError("Connection closed by server."))
    with caplog.at_level(logging.ERROR), pytest.raises(RedisConnectionError):
        cuts.through_cuts(call, "registering", "worker w1")
    assert len(calls) == cuts.TRIES == 6
    assert pauses == [0.25, 0.5, 1.0, 2.0, 4.0]
    assert "worker w1: Redis unreachable while registering (6 tries" in caplog.text


def test_an_error_that_is_not_a_cut_is_not_tried_again(pauses: list[float]) -> None:
    calls, call = _failing(1, ResponseError("WRONGTYPE"))
    with pytest.raises(ResponseError):
        cuts.through_cuts(call, "registering", "worker w1")
    assert (len(calls), pauses) == (1, [])


def test_the_value_of_the_try_that_got_through_is_returned(pauses: list[float]) -> None:
    calls, call = _failing(1, RedisConnectionError("Connection closed by server."))

    def read() -> str:
        call()
        return f"token after {len(calls)} tries"

    assert cuts.through_cuts(read, "reading the boot jobs' dataset token", "pid 1") == (
        "token after 2 tries"
    )
    assert pauses == [0.25]
