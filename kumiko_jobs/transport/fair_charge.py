"""The finish's half of the fair dequeue: the charge that corrects a pick's estimate with the
worker time the run really took, and the release of the cap slots its start took.

The dequeue charges a start its bucket's mean duration (an estimate: the run has not run
yet); the finish sends the real time, in the transaction the worker already sends (no round
trip of its own), and the script moves the bucket's finish tag and score by the difference
over its weight, and updates the means. docs/design.md, "Flow control: the fair dequeue".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .fair_caps import CAPS
from .fair_common import COMMON
from .fair_policy import MEAN_ALPHA

# The finish's script (in its own transaction): the caps' release, then the charge.
_CHARGE = (
    COMMON
    + CAPS
    + f"""
local L, bucket, mode = ARGV[1], ARGV[2], ARGV[6]
local actual, estimate, weight = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
if ARGV[8] and ARGV[8] ~= '' then
  local ok, caps = pcall(cjson.decode, ARGV[8])
  if ok then release_caps(ARGV[7], caps) end
end
local function mean(name)
  local m = tonumber(redis.call('HGET', L .. 'mean', name) or '')
  if m then m = {1 - MEAN_ALPHA} * m + {MEAN_ALPHA} * actual else m = actual end
  redis.call('HSET', L .. 'mean', name, m)
end
mean(bucket)
mean('~lane')
if mode ~= 'tenant' then return 0 end
local delta = (actual - estimate) / weight
local f = tonumber(redis.call('HGET', L .. 'fin', bucket) or '')
if f then redis.call('HSET', L .. 'fin', bucket, f + delta) end
for _, set in ipairs({{'ready', 'parked'}}) do
  if redis.call('ZSCORE', L .. set, bucket) then
    redis.call('ZINCRBY', L .. set, delta, bucket)
  end
end
return 1
"""
)


@dataclass(frozen=True, slots=True)
class Charge:
    """What the finish needs to correct a pick's estimate (from the dequeue's reply)."""

    lane: str
    bucket: str
    estimate: float
    weight: float
    mode: str
    # The RQ job id and the caps (JSON, as the fair field has them) its start took a slot of;
    # the finish releases them in the same script.
    job_id: str = ""
    caps: str = ""


def charge_on(pipeline: Any, charge: Charge, actual: float) -> None:
    """Queue the finish's correction on ``pipeline`` (the finish's own transaction).

    ``EVAL`` with the script's text, not ``EVALSHA``: a script unknown to the server (after a
    restart or failover) would fail inside the transaction, and redis-py's pre-loading of
    scripts for a pipeline costs a round trip of its own.
    """
    pipeline.eval(
        _CHARGE,
        0,
        charge.lane,
        charge.bucket,
        max(actual, 0.0),
        charge.estimate,
        charge.weight,
        charge.mode,
        charge.job_id,
        charge.caps,
    )
