"""The fair dequeue's policy as pure code (transport/fair_policy.py): no services.

The Lua script is checked against ``Lane`` in tests/integration/test_fair_dequeue.py; these
tests pin the policy itself: shares by weight and by worker time, no credit for idleness,
work conservation, FIFO within a bucket, and the checks of weights and priorities.
"""

from __future__ import annotations

import math
from collections import Counter

import pytest

from kumiko_jobs.transport.fair_policy import (
    DEFAULT_ESTIMATE,
    OTHER_BUCKET,
    SYSTEM_BUCKET,
    WEIGHT_MAX,
    WEIGHT_MIN,
    Lane,
    Paused,
    after_pick,
    bucket_of,
    correction,
    eligible,
    entry_score,
    jain_index,
    next_mean,
    valid_priority,
    valid_weight,
)


def drain(lane: Lane, cost: dict[str, float], picks: int) -> list[str]:
    """Pick and charge ``picks`` times (one worker), returning the buckets picked."""
    order = []
    for _ in range(picks):
        picked = lane.pick()
        assert picked is not None
        bucket, _, estimate, weight = picked
        lane.charge(bucket, cost[bucket], estimate, weight)
        order.append(bucket)
    return order


def backlog(lane: Lane, weights: dict[str, float], count: int) -> None:
    for bucket, weight in weights.items():
        for i in range(count):
            lane.enter(bucket, f"{bucket}-{i}", weight)


def test_the_arithmetic():
    assert bucket_of(None) == SYSTEM_BUCKET and bucket_of("acme") == "acme"
    assert entry_score(finish=3.0, vtime=10.0) == 10.0  # idle: back at the virtual time
    assert entry_score(finish=12.0, vtime=10.0) == 12.0  # ahead: keeps its debt
    assert after_pick(10.0, estimate=1.0, weight=4) == 10.25
    assert correction(actual=3.0, estimate=1.0, weight=2) == 1.0
    assert next_mean(None, 2.0) == 2.0
    assert next_mean(1.0, 2.0) == pytest.approx(1.3)


def test_equal_weights_and_costs_alternate():
    lane = Lane()
    backlog(lane, {"a": 1, "b": 1}, 10)
    assert drain(lane, {"a": 0.1, "b": 0.1}, 10) == ["a", "b"] * 5


def test_weights_share_the_worker_time():
    lane = Lane()
    backlog(lane, {"a": 1, "b": 2, "c": 4}, 400)
    counts = Counter(drain(lane, {"a": 0.1, "b": 0.1, "c": 0.1}, 700))
    assert counts["a"] == pytest.approx(100, abs=2)
    assert counts["b"] == pytest.approx(200, abs=2)
    assert counts["c"] == pytest.approx(400, abs=2)


def test_a_tenant_with_ten_times_longer_runs_gets_the_same_worker_time_not_ten_times():
    lane = Lane()
    backlog(lane, {"slow": 1, "fast": 1}, 600)
    cost = {"slow": 1.0, "fast": 0.1}
    order = drain(lane, cost, 440)
    seconds = Counter()
    for bucket in order[40:]:  # after the means have settled
        seconds[bucket] += cost[bucket]
    assert seconds["slow"] / seconds["fast"] == pytest.approx(1.0, abs=0.1)


def test_idleness_banks_no_credit():
    lane = Lane()
    backlog(lane, {"busy": 1}, 100)
    drain(lane, {"busy": 0.1}, 50)  # "idle" had nothing all this time
    lane.enter("idle", "idle-0")
    lane.enter("idle", "idle-1")
    lane.enter("idle", "idle-2")
    order = drain(lane, {"busy": 0.1, "idle": 0.1}, 6)
    # Level with busy's next message, then alternating: not three in a row to catch up.
    assert order.count("idle") == 3 and order[:2] != ["idle", "idle"]
    assert "idle" not in order[order.index("idle") + 1 : order.index("idle") + 2]


def test_a_lone_bucket_is_always_picked_and_fifo_within_it():
    lane = Lane()
    for i in range(5):
        lane.enter("only", f"m{i}")
    messages = []
    while (picked := lane.pick()) is not None:  # work-conserving: never None while any waits
        messages.append(picked[1])
    assert messages == [f"m{i}" for i in range(5)]
    assert lane.pick() is None


def test_the_first_estimate_and_then_the_mean():
    lane = Lane()
    backlog(lane, {"a": 1}, 3)
    first = lane.pick()
    assert first is not None and first[2] == DEFAULT_ESTIMATE
    lane.charge("a", 2.0, first[2], 1)
    second = lane.pick()
    assert second is not None and second[2] == 2.0


def test_eligibility():
    paused = Paused(
        tenants=frozenset({"acme"}),
        jobs=frozenset({"billing.sync"}),
        job_tenants=frozenset({("mail.send", "beta")}),
    )
    assert not eligible("acme", "any.job", paused)
    assert not eligible("beta", "billing.sync", paused)
    assert not eligible("beta", "mail.send", paused)
    assert eligible("gamma", "mail.send", paused)
    assert eligible("beta", "other.job", paused)


def test_weights_and_priorities_are_checked():
    for bad in (0, -1, math.inf, math.nan, "2", True, None):
        assert valid_weight(bad) is None
    assert valid_weight(3) == 3.0 and valid_weight(0.5) == 0.5
    for bad in (1e-20, 0.0009, 1000.5, 1e15):  # outside WEIGHT_MIN..WEIGHT_MAX
        assert valid_weight(bad) is None
    assert valid_weight(WEIGHT_MIN) == 0.001 and valid_weight(WEIGHT_MAX) == 1000.0
    for bad in (101, -101, 1.0, "1", False):
        assert valid_priority(bad) is None
    assert valid_priority(-100) == -100 and valid_priority(100) == 100


def test_jain_index():
    assert jain_index([1, 1, 1]) == 1.0
    assert jain_index([1, 0, 0]) == pytest.approx(1 / 3)
    assert jain_index([]) == 1.0


def test_no_schema_name_shares_a_bucket_or_breaks_the_dequeue_s_separators():
    """django-tenants accepts a tab, "!system" and "~other" in a schema name: those names are
    encoded, so each tenant has a bucket of its own, none is the system's or the foreign
    messages', and no bucket holds the tab the dequeue's members are split on. Plain names are
    their own bucket (stored keys keep their names)."""
    assert [bucket_of(s) for s in ("acme", "t1", "Acme-2", "a:b", "{x}", "a b", "zé")] == [
        "acme",
        "t1",
        "Acme-2",
        "a:b",
        "{x}",
        "a b",
        "zé",
    ]
    assert bucket_of(None) == bucket_of("") == SYSTEM_BUCKET
    hostile = [SYSTEM_BUCKET, OTHER_BUCKET, "x\tt2", "\t", "=", "=3d", "a\x1fb", "~", "!a"]
    names = {"acme", "3d", "t2", *hostile, *(bucket_of(s) for s in hostile)}
    buckets = [bucket_of(s) for s in names]
    assert len(set(buckets)) == len(names)  # one bucket per name (encoded ones included)
    assert SYSTEM_BUCKET not in buckets and OTHER_BUCKET not in buckets
    assert not any(c < " " or c == "\x7f" for b in buckets for c in b)


@pytest.mark.parametrize("weight", [1e-20, WEIGHT_MIN])
def test_one_tenant_s_tiny_weight_served_alone_leaves_the_others_fair_only_inside_the_range(
    weight: float,
) -> None:
    """Why weights are bounded: a tenant of weight 1e-20 served alone moves the lane's
    virtual time to 5e18, where the others' charges (0.05) round to nothing, so their scores
    never move and the smaller name takes every pick (t3: none of 50). At the smallest
    accepted weight the two alternate."""
    lane = Lane()
    for message in ("m0", "m1"):
        lane.enter("t1", message, weight)
        lane.pick()
    for i in range(50):
        lane.enter("t2", f"a{i}")
        lane.enter("t3", f"b{i}")
    order = Counter(picked[0] for picked in (lane.pick() for _ in range(50)) if picked)
    fair = order["t2"] == order["t3"] == 25
    assert fair is (weight >= WEIGHT_MIN), order
