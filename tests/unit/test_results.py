"""``results.storable``: what a run keeps of a job's return value (pure, no services)."""

from __future__ import annotations

from typing import Any

import pytest

from kumiko_jobs.history.results import NOT_KEPT, is_marker, storable


class Items(dict):  # type: ignore[type-arg]
    pass


@pytest.mark.parametrize(
    "value",
    [0, 1.5, True, "text", "ünïcode 🎉", [1, [2, [3]]], {"a": {"b": None}}, 2**70],
)
def test_json_values_are_kept_as_they_are(value: Any) -> None:
    assert storable(value, 1000) == (value, "")


def test_none_and_a_zero_cap_keep_nothing_and_say_nothing() -> None:
    assert storable(None, 1000) == (None, "")
    assert storable({"a": 1}, 0) == (None, "")


def test_tuples_come_back_as_lists() -> None:
    assert storable((1, 2), 100) == ([1, 2], "")


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ({1, 2}, "not JSON"),
        (object(), "not JSON"),
        (float("inf"), "not JSON"),
        ({"a": "\x00"}, "NUL character"),
        (["\ud800"], "lone surrogate"),
        ({"\x00": 1}, "NUL character"),
    ],
)
def test_values_jsonb_cannot_store_become_markers(value: Any, why: str) -> None:
    kept, reason = storable(value, 1000)
    assert why in reason and kept == {NOT_KEPT: reason} and is_marker(kept)


def test_a_circular_value_is_a_marker_not_a_crash() -> None:
    loop: list[Any] = []
    loop.append(loop)
    kept, reason = storable(loop, 1000)
    assert is_marker(kept) and "Circular reference" in reason


def test_the_cap_counts_ascii_json_and_stops_early() -> None:
    assert storable("x" * 8, 10) == ("x" * 8, "")  # "xxxxxxxx" is 10 bytes with its quotes
    _kept, reason = storable("x" * 9, 10)
    assert reason == "the result is larger than MAX_RESULT_BYTES=10"
    # A non-ASCII character counts as its escape (6 bytes): an upper bound of the stored size.
    assert is_marker(storable("é" * 2, 10)[0])

    class Endless(list):  # type: ignore[type-arg]
        def __iter__(self) -> Any:
            while True:
                yield "chunk"

    assert is_marker(storable(Endless([1]), 1000)[0])  # stopped at the cap, not run forever


def test_a_dict_subclass_is_kept_as_plain_json() -> None:
    kept, reason = storable(Items(a=1), 100)
    assert kept == {"a": 1} and type(kept) is dict and reason == ""
