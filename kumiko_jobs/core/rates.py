"""Rate limits by time window as text ("100/m") and as numbers: the one parser of the option.

``@job(rate_limit=..., tenant_rate_limit=...)`` and ``KUMIKO_JOBS["TENANT_RATE_LIMIT"]`` are
read here (pure: no Redis, no settings), so registration and settings refuse the same inputs
with the same words. The fair dequeue enforces them (transport/fair.py, docs/design.md,
"Flow control: rate limits").
"""

from __future__ import annotations

import re
from dataclasses import dataclass

UNITS = {"s": 1, "m": 60, "h": 3600}
_FORM = re.compile(r"^\s*(\d+)\s*/\s*([smh])\s*$")
HINT = "write it as '<starts>/<unit>' (a whole number >= 1; unit s, m or h), e.g. '100/m'"


@dataclass(frozen=True, slots=True)
class Rate:
    """At most ``limit`` starts in any ``per`` seconds (a sliding window)."""

    limit: int
    per: int

    def __str__(self) -> str:
        unit = {v: k for k, v in UNITS.items()}[self.per]
        return f"{self.limit}/{unit}"


def parse_rate(value: object) -> Rate:
    """``value`` ("10/s", "100/m", "5000/h") as a Rate; ValueError saying what to write."""
    if isinstance(value, Rate):
        return value
    if not isinstance(value, str):
        raise ValueError(f"{value!r} is not a rate; {HINT}")
    match = _FORM.match(value)
    if match is None:
        raise ValueError(f"{value!r} is not a rate; {HINT}")
    limit = int(match.group(1))
    if limit < 1:
        raise ValueError(f"{value!r} allows no start at all; {HINT} (pause the job to stop it)")
    return Rate(limit=limit, per=UNITS[match.group(2)])
