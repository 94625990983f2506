"""The fair dequeue's policy as pure code: virtual times, charges, eligibility, the pick.

The Lua script in ``fair.py`` is this policy's one executor in production; this module is the
same arithmetic written once in Python, for the unit tests (no services) and for the
integration test that drives the script and a ``Lane`` here with the same events and asserts
that both pick the same buckets. Change one, change the other (docs/design.md, "Flow
control: the fair dequeue").

Start-time fair queuing, per lane (a queue and a priority level):

* a bucket (a tenant, or the system) with ready messages has a *start tag*, its score; the
  lowest score is served next;
* serving a message at score ``S`` sets the lane's virtual time ``V = max(V, S)`` and moves the
  bucket's score (and its virtual finish ``F``) to ``S + estimate / weight``;
* at the finish the estimate is corrected: ``(actual - estimate) / weight`` is added;
* a bucket with no ready message leaves the set and keeps ``F``; it comes back at
  ``max(F, V)``: time spent idle is not credit.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field

# The bucket of system runs (no tenant) and of job ids pushed without kumiko's fair field.
# No tenant's bucket is either (``bucket_of``). Equal scores go to the smaller name (Redis's
# order): the system's bucket first, foreign messages last.
SYSTEM_BUCKET = "!system"
OTHER_BUCKET = "~other"
# A schema name that is its own bucket name: no control character (the dequeue's members and
# keys are tab-separated), not starting with "!" or "~" (the two above) or "=" (the mark of an
# encoded name). django-tenants 4 accepts nearly any text as a schema name (it refuses only
# quotes, backslashes, ";", NUL and line breaks), so the others are encoded, never trusted.
_PLAIN = re.compile(r"[^\x00-\x1f\x7f!~=][^\x00-\x1f\x7f]*")
# Worker seconds a message is assumed to take before its bucket (or lane) has a mean.
DEFAULT_ESTIMATE = 0.05
# Weight of the newest duration in a bucket's mean worker time.
MEAN_ALPHA = 0.3
PRIORITY_MIN, PRIORITY_MAX = -100, 100
# A weight's range: a share between a thousandth and a thousand times the default. Beyond it
# the lane's float times break (a weight of 1e-20 serves one run at a virtual time of 5e18,
# where every other bucket's charge of 0.05 rounds to nothing: ties by name then decide, and
# one tenant takes every pick); the dequeue script reads a weight outside it as 1.
WEIGHT_MIN, WEIGHT_MAX = 0.001, 1000.0


def bucket_of(schema: str | None) -> str:
    """The bucket a run's messages wait in: its tenant's schema, or the system's.

    One name per tenant and none shared (the system's and foreign messages' included): a
    schema that is not plain (``_PLAIN``) is "=" and its UTF-8 in hex, which no plain name and
    no other schema can be. Buckets are stored, so plain names stay as they always were."""
    if not schema:
        return SYSTEM_BUCKET
    if _PLAIN.fullmatch(schema):
        return schema
    return "=" + schema.encode().hex()


def entry_score(finish: float, vtime: float) -> float:
    """Where a bucket re-enters the ready set: its virtual finish, but never behind the
    lane's virtual time (idleness banks no credit)."""
    return max(finish, vtime)


def after_pick(score: float, estimate: float, weight: float) -> float:
    """The bucket's next score (and virtual finish) once a message is served at ``score``."""
    return score + estimate / weight


def correction(actual: float, estimate: float, weight: float) -> float:
    """What the finish adds to the bucket's score: the estimate's error, per weight."""
    return (actual - estimate) / weight


def next_mean(mean: float | None, actual: float) -> float:
    """A bucket's mean worker time after one more run of ``actual`` seconds."""
    return actual if mean is None else (1 - MEAN_ALPHA) * mean + MEAN_ALPHA * actual


def valid_weight(value: object) -> float | None:
    """``value`` as a weight (a number from ``WEIGHT_MIN`` to ``WEIGHT_MAX``), or None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    weight = float(value)
    return weight if WEIGHT_MIN <= weight <= WEIGHT_MAX else None


def valid_priority(value: object) -> int | None:
    """``value`` as a priority (an int in -100..100, as Django's tasks), or None."""
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if PRIORITY_MIN <= value <= PRIORITY_MAX else None


def eligible(bucket: str, job: str, paused: Paused) -> bool:
    """May a message of ``job`` in ``bucket`` start now (nothing of it is paused)?"""
    return not (
        bucket in paused.tenants or job in paused.jobs or (job, bucket) in paused.job_tenants
    )


@dataclass(frozen=True, slots=True)
class Paused:
    """What is paused (the queue itself is checked before any pick)."""

    tenants: frozenset[str] = frozenset()
    jobs: frozenset[str] = frozenset()
    job_tenants: frozenset[tuple[str, str]] = frozenset()


@dataclass(slots=True)
class Lane:
    """One queue and priority level, in memory: the model the script is checked against."""

    vtime: float = 0.0
    ready: dict[str, float] = field(default_factory=dict)  # bucket -> score
    finish: dict[str, float] = field(default_factory=dict)
    mean: dict[str, float] = field(default_factory=dict)
    lane_mean: float | None = None
    backlog: dict[str, deque[tuple[str, float]]] = field(default_factory=dict)

    def enter(self, bucket: str, message: str, weight: float = 1.0) -> None:
        """A message arrives (sorted from the inbox) at the tail of its bucket."""
        self.backlog.setdefault(bucket, deque()).append((message, weight))
        if bucket not in self.ready:
            self.ready[bucket] = entry_score(self.finish.get(bucket, 0.0), self.vtime)

    def estimate(self, bucket: str) -> float:
        """The worker time charged at the pick (corrected at the finish)."""
        known = self.mean.get(bucket, self.lane_mean)
        return DEFAULT_ESTIMATE if known is None else known

    def pick(self) -> tuple[str, str, float, float] | None:
        """(bucket, message, estimate, weight) served next; None when nothing waits. Ties go
        to the smaller bucket name, as Redis orders equal scores."""
        if not self.ready:
            return None
        bucket = min(self.ready, key=lambda b: (self.ready[b], b))
        score = self.ready[bucket]
        message, weight = self.backlog[bucket].popleft()
        self.vtime = max(self.vtime, score)
        estimate = self.estimate(bucket)
        self.finish[bucket] = after_pick(score, estimate, weight)
        if self.backlog[bucket]:
            self.ready[bucket] = self.finish[bucket]
        else:
            del self.ready[bucket]
        return bucket, message, estimate, weight

    def charge(self, bucket: str, actual: float, estimate: float, weight: float) -> None:
        """The finish of a message picked with ``estimate``: correct the bucket's times."""
        self.mean[bucket] = next_mean(self.mean.get(bucket), actual)
        self.lane_mean = next_mean(self.lane_mean, actual)
        delta = correction(actual, estimate, weight)
        if bucket in self.finish:
            self.finish[bucket] += delta
        if bucket in self.ready:
            self.ready[bucket] += delta


def jain_index(shares: list[float]) -> float:
    """Jain's fairness index of ``shares`` (1.0: all equal; 1/n: one takes everything)."""
    if not shares or not any(shares):
        return 1.0
    return sum(shares) ** 2 / (len(shares) * sum(s * s for s in shares))


def window_reopens(starts: list[float], limit: int, per: float, now: float) -> float | None:
    """The script's rate check (``rate_block``) for one window: None when a start may count
    in it now (fewer than ``limit`` of ``starts`` in the last ``per`` seconds, the window
    ``(now - per, now]``); else when it may, the moment the oldest start that keeps it full
    leaves the window."""
    inside = sorted(t for t in starts if t + per > now)  # (as the script: no float drift)
    if len(inside) < limit:
        return None
    return inside[len(inside) - limit] + per


def cap_admits(in_flight: frozenset[str] | set[str], limit: int, job_id: str) -> bool:
    """The script's cap check (``cap_block``, fair_caps.py) for one cap: may ``job_id`` start
    with these ids in flight? A message delivered again holds its own slot already."""
    return job_id in in_flight or len(in_flight) < limit


def set_aside_goes_first(aside_head: int | None, bucket_head: int) -> bool:
    """Is a job's set-aside message (arrival number ``aside_head``) its next, before its
    message at the bucket's head (``bucket_head``)? Both lists are FIFO; the older head goes
    first, so the job's order holds whatever moved between them (docs/design.md, "Per-job
    constraints")."""
    return aside_head is not None and aside_head < bucket_head
