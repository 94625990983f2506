"""The Lua every fair-dequeue script starts with: how a message's fair field reads, where a
bucket's head is, and how a bucket enters its lane (``activate``).

The dequeue (``fair.py``), the finish's charge (``fair_charge.py``), the caps' releases
(``rate_limits.py``) and the pauses' release (``pausing.py``) each prepend it, so that one
reading of the fair field and one rule of re-entry (at ``max(F, V)``: an idle bucket banks no
credit) serve them all. docs/design.md, "Flow control: the fair dequeue".
"""

from __future__ import annotations

from .fair_policy import OTHER_BUCKET, PRIORITY_MAX, PRIORITY_MIN, WEIGHT_MAX, WEIGHT_MIN
from .keys import FAIR_PREFIX, FAIR_TOKEN

# The pieces both scripts share: how a message's fair field reads, how a bucket enters a lane.
COMMON = f"""
local TOKEN = '{FAIR_TOKEN}'
local OTHER = '{OTHER_BUCKET}'
local HOLDS = '{FAIR_PREFIX}holds'
-- held list's key -> its lane: the key's own text cannot say where the lane ends (queue and
-- job names may both hold ':<digits>:held:'); written when a message is held, read on release.
local HOLD_LANES = '{FAIR_PREFIX}hold-lanes'
local function fair_of(meta)
  if not meta then return OTHER, 1, 0, '' end
  local ok, decoded = pcall(cjson.decode, meta)
  if not ok or type(decoded) ~= 'table' then return OTHER, 1, 0, '' end
  local f = decoded['kumiko_fair']
  if type(f) ~= 'table' then return OTHER, 1, 0, '' end
  local bucket, weight, level, job = f[1], tonumber(f[2]), tonumber(f[3]), f[4]
  if type(bucket) ~= 'string' or bucket == '' then bucket = OTHER end
  -- The field is not signed (a forged or foreign message): a NaN or a weight out of range
  -- would make a score NaN (ZADD fails, after the pop) or infinite (the lane's time with it).
  if not weight or not (weight >= {WEIGHT_MIN} and weight <= {WEIGHT_MAX}) then weight = 1 end
  if not level or not (level >= {PRIORITY_MIN} and level <= {PRIORITY_MAX}) then level = 0 end
  if type(job) ~= 'string' then job = '' end
  local rates, caps = f[5], f[6]
  if type(rates) ~= 'table' then rates = nil end
  if type(caps) ~= 'table' then caps = nil end
  return bucket, weight, math.floor(level), job, rates, caps
end
local function head_seq(L, bucket)
  local head = redis.call('LINDEX', L .. 'b:' .. bucket, 0)
  if not head then return nil end
  return tonumber(string.match(head, '^(%d+):'))
end
-- The score a bucket (re-)enters its lane's ready set with.
local function entry_score(L, bucket, mode)
  if mode == 'fifo' then return head_seq(L, bucket) or 0 end
  local v = tonumber(redis.call('GET', L .. 'vt') or '0')
  local f = tonumber(redis.call('HGET', L .. 'fin', bucket) or '0')
  return math.max(v, f)
end
local function activate(prefix, pause, level, bucket, mode)
  local L = prefix .. level .. ':'
  if redis.call('ZSCORE', L .. 'ready', bucket) or redis.call('ZSCORE', L .. 'parked', bucket)
      or redis.call('ZSCORE', prefix .. 'rwait', level .. '\\t' .. bucket)
      or redis.call('SISMEMBER', L .. 'cwait', bucket) == 1 then
    -- (already in; or waiting for a rate window or a tenant's cap, whose reopening or
    -- release re-activates it)
    return
  end
  local score = entry_score(L, bucket, mode)
  if redis.call('SISMEMBER', pause .. 'tenants', bucket) == 1 then
    redis.call('ZADD', L .. 'parked', score, bucket)
  else
    redis.call('ZADD', L .. 'ready', score, bucket)
    redis.call('ZADD', prefix .. 'levels', -level, level)
  end
  redis.call('SADD', '{FAIR_PREFIX}lanes', L)
end
"""
