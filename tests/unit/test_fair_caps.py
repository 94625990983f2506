"""Caps in the fair dequeue, the pure parts: which caps a message carries (and how the fair
field writes them), the policy's cap and set-aside rules, and ``TENANT_RATE_LIMIT`` as a
callable by plan."""

from __future__ import annotations

from collections import deque
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured

from kumiko_jobs.checks import check_settings
from kumiko_jobs.core import conf as conf_module
from kumiko_jobs.enqueueing import tenant_settings
from kumiko_jobs.enqueueing.messages import caps_of, message_for, rates_of
from kumiko_jobs.transport.fair_policy import cap_admits, set_aside_goes_first
from tests.unit.test_rate_limits import define, envelope


def plan_rate(schema: str) -> Any:
    """A TENANT_RATE_LIMIT callable by plan, for the tests below."""
    return {"t1": "10/m", "t2": None}.get(schema, "not a rate")


def test_a_job_s_own_cap_is_per_job_and_tenant_and_replaces_the_tenant_s(settings: Any) -> None:
    assert caps_of(define(concurrency="sequential"), "t1") == (("j:rates.a_job\tt1", 1, "j"),)
    assert caps_of(define(tenant_concurrency=3), "t1") == (("j:rates.a_job\tt1", 3, "j"),)
    both = define(concurrency="sequential", tenant_concurrency=3)
    assert caps_of(both, "t2") == (("j:rates.a_job\tt2", 1, "j"),)
    assert caps_of(define(), "t1") == ()
    settings.KUMIKO_JOBS = {**settings.KUMIKO_JOBS, "TENANT_CONCURRENCY": 2}
    assert caps_of(define(), "t1") == (("t:t1", 2, "t"),)
    assert caps_of(define(tenant_concurrency=5), "t1") == (("j:rates.a_job\tt1", 5, "j"),)
    system = define(system=True)
    assert caps_of(system, None) == ()  # TENANT_CONCURRENCY does not hold system runs back
    own = define(system=True, concurrency="sequential")
    assert caps_of(own, None) == (("j:rates.a_job\t!system", 1, "j"),)


def test_the_fair_field_carries_the_caps_sixth(settings: Any) -> None:
    settings.KUMIKO_JOBS = {**settings.KUMIKO_JOBS, "TENANT_RATE_LIMIT": None}
    meta = message_for(define(concurrency="sequential"), envelope(), 0).meta
    assert meta is not None
    assert meta["kumiko_fair"][4:] == [[], [["j:rates.a_job\tt1", 1, "j"]]]
    message = message_for(define(concurrency="sequential"), envelope(), 0)
    assert (message.rate_limit_key, message.rate_limit) == ("", 0)  # no RQ RateLimit any more
    plain = message_for(define(), envelope(), 0).meta
    assert plain is not None and len(plain["kumiko_fair"]) == 4  # as before without limits


def test_a_cap_admits_up_to_its_limit_and_a_message_holding_its_own_slot() -> None:
    assert cap_admits(set(), 1, "a")
    assert not cap_admits({"a"}, 1, "b")
    assert cap_admits({"a"}, 1, "a")  # delivered again: not held back by its own slot
    assert cap_admits({"a"}, 2, "b") and not cap_admits({"a", "b"}, 2, "c")


def test_set_aside_and_bucket_merged_by_arrival_keep_a_job_s_order() -> None:
    """The script's moves, modelled: a bucket of X and Y, X capped at 1. An X at the head
    while X runs is set aside (with the bucket's head behind it when a set-aside X went
    first); Y goes on; when nothing else is left the running X finishes and its release
    wakes the oldest set-aside X; every X start brings the next one forward. X starts in
    arrival order, and Y never waits for X."""
    bucket = deque([(1, "x"), (2, "y"), (3, "x"), (4, "y"), (5, "x")])
    aside: deque[tuple[int, str]] = deque()
    started: list[tuple[int, str]] = []
    x_running = True
    arrivals = iter([(6, "x"), (7, "y"), (8, "x")])
    for _ in range(100):
        if not bucket and not aside:
            break
        if not bucket:
            x_running = False  # the running X finishes; its release wakes one set-aside X
            bucket.appendleft(aside.popleft())
            continue
        entry, later = bucket.popleft(), None
        if entry[1] == "x" and set_aside_goes_first(aside[0][0] if aside else None, entry[0]):
            entry, later = aside.popleft(), entry
        if entry[1] == "x" and x_running:
            aside.appendleft(entry)
            if later:
                aside.append(later)
            continue
        if later:
            bucket.appendleft(later)
        started.append(entry)
        if entry[1] == "x":
            x_running = True
            if aside:
                bucket.appendleft(aside.popleft())  # a start brings the next one forward
        arrival = next(arrivals, None)
        if arrival:
            bucket.append(arrival)
    xs = [n for n, job in started if job == "x"]
    assert xs == sorted(xs) == [1, 3, 5, 6, 8]
    assert [n for n, job in started if job == "y"] == [2, 4, 7]
    assert started.index((2, "y")) < started.index((1, "x"))  # Y passed the capped X


def test_tenant_rate_limit_may_be_a_callable_by_plan(settings: Any) -> None:
    path = f"{__name__}.plan_rate"
    assert path == conf_module._validate({"TENANT_RATE_LIMIT": path}).TENANT_RATE_LIMIT
    settings.KUMIKO_JOBS = {**settings.KUMIKO_JOBS, "TENANT_RATE_LIMIT": path}
    tenant_settings._rate_callables.clear()
    assert rates_of(define(), envelope("t1")) == (("t:t1", 10, 60),)
    assert rates_of(define(), envelope("t2")) == ()  # None: no limit for this plan
    assert rates_of(define(), envelope(schema=None)) == ()  # the system is not called for
    with pytest.raises(ImproperlyConfigured, match=r"returned 'not a rate' for tenant 't3'"):
        rates_of(define(), envelope("t3"))


def test_a_tenant_rate_limit_path_that_cannot_be_imported_fails_the_system_check(
    settings: Any,
) -> None:
    settings.KUMIKO_JOBS = {**settings.KUMIKO_JOBS, "TENANT_RATE_LIMIT": "nowhere.plan_rate"}
    errors = [e for e in check_settings() if e.id == "kumiko_jobs.E017"]
    assert len(errors) == 1 and "cannot be imported" in errors[0].msg
    assert "returns a rate such as '100/m' or None" in errors[0].msg
    settings.KUMIKO_JOBS = {**settings.KUMIKO_JOBS, "TENANT_RATE_LIMIT": "10/m"}
    assert not [e for e in check_settings() if e.id == "kumiko_jobs.E017"]
    with pytest.raises(ImproperlyConfigured, match="or the dotted path of a callable"):
        conf_module._validate({"TENANT_RATE_LIMIT": "10/minute"})
