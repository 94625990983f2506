"""Caps as eligibility in the fair dequeue: the Lua the dequeue, the finish and the repairs share.

A cap (``TENANT_CONCURRENCY``, ``@job(tenant_concurrency=N)``, ``concurrency="sequential"``)
is decided at the push like the rest of the fair field (its sixth element: ``[key, limit,
scope]`` per cap) and enforced by the dequeue script (``fair.py``): the script keeps the job
ids in flight per cap key in a Redis SET (``kumiko:cap:<key>``; a set, not a counter, so that
every release is idempotent: the finish, the sweep and the relay may all release the same
id), and a message whose cap is full does not start. What waits is told apart by scope:

* ``t`` (the tenant's cap, key ``t:<bucket>``): the whole bucket waits, out of its lane's
  ready set and in the lane's ``cwait`` set, so that an arrival does not put it back;
* ``j`` (a job's cap per tenant, key ``j:<job>\\t<bucket>``): only that job's messages of the
  bucket are *set aside*, in order, on ``<lane>aside:<job>\\t<bucket>``, and the bucket goes on
  with its other jobs (no head-of-line blocking by a per-job constraint). A per-job rate
  limit sets aside the same way (fair.py).

Who waits for a cap is in ``kumiko:cap:<key>:w`` (members ``<lane>\\t<bucket>\\t<job>``, job
empty for a tenant-wide wait), with the cap's limit in ``kumiko:cap:<key>:n``;
``kumiko:cap:waiting`` names the keys with waiters (the relay's lost-slot repair reads it).
A release removes the id and, when the cap has room, wakes every waiter: a tenant-wide wait
re-enters its lane at ``max(F, V)``, a job's oldest set-aside message goes back to the head of
its bucket (each start brings the next one forward, so a wake moves one entry, never the
whole backlog). docs/design.md, "Flow control: caps".
"""

from __future__ import annotations

from .doorbell import BELL_SIZE
from .keys import PAUSE_PREFIX

# + cap key: the SET of job ids in flight; + ":w" its waiters, + ":n" its limit.
CAP_PREFIX = "kumiko:cap:"
# The cap keys that have waiters.
CAP_WAITING = CAP_PREFIX + "waiting"

# After fair.COMMON (fair_of, head_seq, activate). Plain text, not an f-string: Lua tables.
CAPS = (
    """
local CAP = '@CAP@'
local PAUSE = '@PAUSE@'
local function seq_of(entry)
  return tonumber(string.match(entry, '^(%d+):') or '0')
end
local function aside_key(L, job, bucket)
  return L .. 'aside:' .. job .. '\\t' .. bucket
end
-- fn(key, limit, tenant_wide) for each well-formed cap of a message.
local function each_cap(caps, fn)
  if type(caps) ~= 'table' then return end
  for _, c in ipairs(caps) do
    if type(c) == 'table' then
      local key, limit = c[1], tonumber(c[2])
      if type(key) == 'string' and key ~= '' and limit and limit >= 1 then
        fn(key, math.floor(limit), c[3] == 't')
      end
    end
  end
end
-- The first cap of the scope asked for that is full ({key, limit}), or nil. A message whose
-- id already holds a slot (delivered again) is not held back by its own slot.
local function cap_block(caps, tenant_wide, id)
  local hit = nil
  each_cap(caps, function(key, limit, tenant)
    if hit or tenant ~= tenant_wide then return end
    local k = CAP .. key
    if redis.call('SCARD', k) >= limit and redis.call('SISMEMBER', k, id) == 0 then
      hit = {key, limit}
    end
  end)
  return hit
end
local function cap_count(caps, id)
  each_cap(caps, function(key) redis.call('SADD', CAP .. key, id) end)
end
local function cap_wait(hit, L, bucket, job)
  local k = CAP .. hit[1]
  redis.call('SADD', k .. ':w', L .. '\\t' .. bucket .. '\\t' .. job)
  redis.call('SET', k .. ':n', hit[2])
  redis.call('SADD', CAP .. 'waiting', hit[1])
end
-- A waiter's turn: the bucket back into its lane (tenant-wide, job ''), or the job's oldest
-- set-aside message back to the head of its bucket.
local function wake(L, bucket, job)
  local prefix, level = string.match(L, '^(.*:)(%-?%d+):$')
  if not prefix then return end
  local lane_mode = redis.call('GET', L .. 'mode') or 'tenant'
  if job == '' then
    redis.call('SREM', L .. 'cwait', bucket)
  else
    local entry = redis.call('LPOP', aside_key(L, job, bucket))
    if not entry then return end
    redis.call('LPUSH', L .. 'b:' .. bucket, entry)
    if lane_mode == 'fifo' and redis.call('ZSCORE', L .. 'ready', bucket) then
      redis.call('ZADD', L .. 'ready', head_seq(L, bucket), bucket)
    end
  end
  activate(prefix, PAUSE, tonumber(level), bucket, lane_mode)
  -- Its work is ready again: wake a worker waiting on the queue's doorbell (doorbell.py).
  redis.call('LPUSH', prefix .. 'bell', '1')
  redis.call('LTRIM', prefix .. 'bell', 0, @BELL_LAST@)
end
-- Free job id's slot of cap key (idempotent); when the cap has room, wake all its waiters
-- (a few: the lanes of one tenant, or of one job in one tenant).
local function cap_release(id, key, limit)
  local k = CAP .. key
  redis.call('SREM', k, id)
  if not limit then limit = tonumber(redis.call('GET', k .. ':n') or '1') or 1 end
  if redis.call('SCARD', k) >= limit then return end
  local waiters = redis.call('SMEMBERS', k .. ':w')
  if #waiters == 0 then return end
  redis.call('DEL', k .. ':w', k .. ':n')
  redis.call('SREM', CAP .. 'waiting', key)
  for _, m in ipairs(waiters) do
    local L, bucket, job = string.match(m, '^(.-)\\t(.-)\\t(.*)$')
    if L then wake(L, bucket, job) end
  end
end
local function release_caps(id, caps)
  each_cap(caps, function(key, limit) cap_release(id, key, limit) end)
end
""".replace("@CAP@", CAP_PREFIX)
    .replace("@PAUSE@", PAUSE_PREFIX)
    .replace("@BELL_LAST@", str(BELL_SIZE - 1))
)
