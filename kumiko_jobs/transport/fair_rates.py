"""Rate limits by time window as eligibility in the fair dequeue: the Lua of the windows.

A window is a sorted set of the start times of the last ``per`` seconds (members
``<job id>@<time>``), one per key the push wrote into the message's fair field: ``j:<job>``
(a ":" of the name as "=": ``job_window``; ``:k:<argument value>`` with ``rate_limit_by``, or
``:h:<its hash>``: ``value_window``), ``jt:<job>\t<bucket>`` (a job's limit per tenant),
``t:<bucket>`` (``TENANT_RATE_LIMIT``).
The dequeue script (``fair.py``) checks a head's windows before it starts (``rate_block``)
and counts the start in the same call (``rate_count``), on Redis's clock (``TIME``: one clock
for every worker), so no window ever admits more than its limit. What waits for a window, and
how it comes back, is the dequeue's (``rwait``; docs/design.md, "Flow control: rate limits").
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

# The windows' keys: + "j:<job>", "jt:<job>\t<bucket>", "t:<bucket>".
RATE_PREFIX = "kumiko:rate:"

# A ``rate_limit_by`` value's JSON stays readable in its window's key (``:k:<json>``) up to this
# many characters, all printable ASCII; any other is ``:h:`` and the SHA-256 (hex) of its JSON.
READABLE_VALUE_MAX = 100
_READABLE = re.compile(rf"[\x20-\x7e]{{0,{READABLE_VALUE_MAX}}}")


def job_window(job: str) -> str:
    """The window key of ``job``'s ``rate_limit`` (without ``rate_limit_by``), and the start of
    its value windows' keys. ":" separates a value window's parts (``j:<job>:k:<value>``), and a
    job name may contain one (task jobs' ``<path>:<queue>``), so ``j:a:k:1`` could be the plain
    window of a job ``a:k:1`` and job ``a``'s window of the value 1. A name with ":" is
    written with "=" instead, which no job name contains (``definition/options._NAME_RE``):
    the job's part of a key then has no ":", and the key names one window. Names without ":"
    keep the key they always had (stored: a deploy splits no window of theirs)."""
    return "j:" + job.replace(":", "=")


def value_window(job: str, value: Any) -> str:
    """The window key of one ``rate_limit_by`` value of ``job`` (the tenant chooses the value,
    up to the argument's size). A value is its JSON (sorted keys: one text per value), so two
    different values never share a window. A short printable JSON is kept as it is, readable
    (``j:<job>:k:"acc-1"``; the JSON escapes every other character); a longer one becomes
    a fixed-size key (``j:<job>:h:<64 hex digits>``): never the short
    form of another value, whose marker is ``k``, and never as long as the argument."""
    text = json.dumps(value, sort_keys=True, default=str)
    if _READABLE.fullmatch(text):
        return f"{job_window(job)}:k:{text}"
    return f"{job_window(job)}:h:{hashlib.sha256(text.encode()).hexdigest()}"


# After fair.COMMON; the dequeue passes RATE_PREFIX as ARGV[7]. Plain text: Lua tables.
RATES = """
-- Rate limits (docs/design.md, "Flow control: rate limits"): a window is a zset of the start
-- times of the last `per` seconds, pruned here, on Redis's clock (one clock for all workers).
local RATE = ARGV[7]
local clock = redis.call('TIME')
local NOW = tonumber(clock[1]) + tonumber(clock[2]) / 1000000
local function each_rate(rates, fn)
  if not rates then return end
  for _, r in ipairs(rates) do
    if type(r) == 'table' then
      local key, limit, per = r[1], tonumber(r[2]), tonumber(r[3])
      -- (bounded: the field is not signed, and an infinite period fails PEXPIRE after the pop)
      if type(key) == 'string' and limit and per and limit >= 1 and limit <= 1e9
          and per > 0 and per <= 86400 then
        fn(RATE .. key, limit, per)
      end
    end
  end
end
-- nil when every window of the scope asked for (the tenant's, ``t:``, or the job's, ``j:`` and
-- ``jt:``) has room for one more start now; else when all of them will have.
local function rate_block(rates, tenant_wide)
  local reopen = nil
  each_rate(rates, function(k, limit, per)
    if (string.sub(k, #RATE + 1, #RATE + 2) == 't:') ~= tenant_wide then return end
    redis.call('ZREMRANGEBYSCORE', k, '-inf', NOW - per)
    local n = redis.call('ZCARD', k)
    if n >= limit then
      local frees = redis.call('ZRANGE', k, n - limit, n - limit, 'WITHSCORES')
      -- (+1 us, TIME's grain: at `at`, NOW - per is past the start despite float rounding)
      local at = tonumber(frees[2]) + per + 0.000001
      if not reopen or at > reopen then reopen = at end
    end
  end)
  return reopen
end
local function rate_count(rates, id)
  each_rate(rates, function(k, _, per)
    redis.call('ZADD', k, NOW, id .. '@' .. NOW)
    redis.call('PEXPIRE', k, math.ceil(per * 1000) + 1000)
  end)
end
"""
