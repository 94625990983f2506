"""Pauses as the fair dequeue reads them: four Redis sets, and the release of what they held.

The dequeue script (``fair.py``) skips what these sets name: a paused queue returns nothing,
a paused tenant's bucket is parked, a paused job's message is held. Which pauses exist is
PostgreSQL's to say (``FlowPause``, ``worker/pauses.py``); this module writes the sets from
that list in one transaction (``assert_pauses``: the operator's pause and every maintenance
round, so a failover that lost the sets only delays a pause by a round), and then puts back
what is no longer paused: parked buckets re-enter their lane at ``max(F, V)``, held messages
go back to the head of their bucket in their order (``release``).
"""

from __future__ import annotations

from collections.abc import Iterable

from redis import Redis

from .doorbell import BELL_SIZE
from .fair_common import COMMON
from .keys import FAIR_PREFIX, PAUSE_PREFIX

# Sets of the dequeue script; members: queue names, bucket names, job names, job TAB bucket.
QUEUES, TENANTS, JOBS, JOB_TENANTS = "queues", "tenants", "jobs", "jobtenants"

_RELEASE = (
    COMMON
    + f"""
local pause, mode, lifted = ARGV[1], ARGV[2], ARGV[3]
local released = 0
-- Wake the workers waiting on a queue's bell (doorbell.py): its released work is ready.
local rung = {{}}
local function ring(prefix)
  if rung[prefix] then return end
  rung[prefix] = true
  for _ = 1, {BELL_SIZE} do redis.call('LPUSH', prefix .. 'bell', '1') end
  redis.call('LTRIM', prefix .. 'bell', 0, {BELL_SIZE - 1})
end
local function paused(job, bucket)
  return redis.call('SISMEMBER', pause .. 'tenants', bucket) == 1
    or redis.call('SISMEMBER', pause .. 'jobs', job) == 1
    or redis.call('SISMEMBER', pause .. 'jobtenants', job .. '\\t' .. bucket) == 1
end
for _, L in ipairs(redis.call('SMEMBERS', '{FAIR_PREFIX}lanes')) do
  local prefix, level = string.match(L, '^(.*:)(%-?%d+):$')
  for _, bucket in ipairs(redis.call('ZRANGE', L .. 'parked', 0, -1)) do
    if redis.call('SISMEMBER', pause .. 'tenants', bucket) == 0 then
      redis.call('ZREM', L .. 'parked', bucket)
      activate(prefix, pause, tonumber(level), bucket, mode)
      ring(prefix)
      released = released + 1
    end
  end
end
-- A held list's key is its lane, 'held:', the job's name, TAB, the bucket. Queue and job
-- names may hold ':' and digits (even ':1:held:'), so the lane is the one recorded when the
-- list was held (HOLD_LANES); for a list an older release held, the longest lane the key
-- begins with (bucket names never hold a TAB, job names neither).
local lanes = redis.call('SMEMBERS', '{FAIR_PREFIX}lanes')
table.sort(lanes, function(a, b) return #a > #b end)
local function split(held, L)
  if string.sub(held, 1, #L + 5) ~= L .. 'held:' then return nil end
  local job, bucket = string.match(string.sub(held, #L + 6), '^(.*)\\t([^\\t]*)$')
  if job then return L, job, bucket end
end
local function lane_of(held)
  local recorded = redis.call('HGET', HOLD_LANES, held)
  if recorded then return split(held, recorded) end
  for _, L in ipairs(lanes) do
    local lane, job, bucket = split(held, L)
    if lane then return lane, job, bucket end
  end
end
for _, held in ipairs(redis.call('SMEMBERS', '{FAIR_PREFIX}holds')) do
  local L, job, bucket = lane_of(held)
  if L and not paused(job, bucket) then
    local entries = redis.call('LRANGE', held, 0, -1)
    for i = #entries, 1, -1 do
      redis.call('LPUSH', L .. 'b:' .. bucket, entries[i])
    end
    redis.call('DEL', held)
    redis.call('SREM', '{FAIR_PREFIX}holds', held)
    redis.call('HDEL', HOLD_LANES, held)
    local prefix, level = string.match(L, '^(.*:)(%-?%d+):$')
    if redis.call('ZSCORE', L .. 'ready', bucket) then
      if mode == 'fifo' then redis.call('ZADD', L .. 'ready', head_seq(L, bucket), bucket) end
    else
      activate(prefix, pause, tonumber(level), bucket, mode)
    end
    ring(prefix)
    released = released + #entries
  end
end
if lifted == '1' then
  -- A pause was lifted (a queue's too, which parks nothing): every queue's workers look again.
  for _, L in ipairs(redis.call('SMEMBERS', '{FAIR_PREFIX}lanes')) do
    ring(string.match(L, '^(.*:)%-?%d+:$'))
  end
end
return released
"""
)


def assert_pauses(
    connection: Redis,
    queues: Iterable[str],
    tenants: Iterable[str],
    jobs: Iterable[str],
    job_tenants: Iterable[tuple[str, str]],
    mode: str,
) -> int:
    """Make the pause sets on ``connection`` exactly these, and release what they no longer
    name; returns how many parked buckets and held messages went back (two round trips)."""
    members = {
        QUEUES: list(queues),
        TENANTS: list(tenants),
        JOBS: list(jobs),
        JOB_TENANTS: [f"{job}\t{bucket}" for job, bucket in job_tenants],
    }
    with connection.pipeline(transaction=True) as pipe:
        for name, values in members.items():
            pipe.smembers(PAUSE_PREFIX + name)
            pipe.delete(PAUSE_PREFIX + name)
            if values:
                pipe.sadd(PAUSE_PREFIX + name, *values)
        replies = iter(pipe.execute())
    lifted = False
    for values in members.values():
        before = {v.decode() if isinstance(v, bytes) else v for v in next(replies)}
        lifted = lifted or bool(before - set(values))
        next(replies)  # DEL
        if values:
            next(replies)  # SADD
    release = connection.register_script(_RELEASE)
    return int(release(keys=[], args=[PAUSE_PREFIX, mode, "1" if lifted else "0"]))
