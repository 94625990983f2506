"""The fair dequeue: one Lua script that sorts new arrivals into per-tenant lanes and picks
the next message.

Its parts: ``fair_common`` (the fair field, a bucket's entry into its lane), ``fair_caps``
(concurrency caps), ``fair_rates`` (rate windows), and ``fair_charge`` (the finish's correction
of the pick's estimate, and the caps' release). The policy is ``fair_policy``'s (pure,
unit-tested); this script is its one executor, and the
design and its invariants are in docs/design.md, "Flow control: the fair dequeue". Keys (all
under ``kumiko:fair:<queue>:``): ``levels`` (zset of priority levels with ready work, score
-level), ``seq`` (arrival numbers), and per lane ``<level>:``: ``ready`` and ``parked``
(zsets of buckets), ``b:<bucket>`` (the bucket's messages, ``<arrival>:<job id>``), ``vt``
(virtual time), ``fin``, ``mean``, ``w`` (hashes per bucket), ``held:<job>\t<bucket>``
(messages of a paused job), ``aside:<job>\t<bucket>`` (a job's messages set aside by its
cap or rate limit), ``cwait`` (buckets held by their tenant's cap), ``mode`` (the
``FAIRNESS`` the scores mean); per queue ``rwait`` (zset of ``<level>\t<bucket>``, or
``<level>\t<bucket>\t<job>`` for a job's set-aside messages, waiting for a rate window,
scored by when it reopens); the windows under ``RATE_PREFIX``; the caps' sets under
``fair_caps.CAP_PREFIX``; and across queues the sets ``kumiko:fair:lanes`` and
``kumiko:fair:holds`` and the hash ``kumiko:fair:hold-lanes`` (a held list's lane: ``pausing.py``
releases from them).

The script names keys it was not passed: like RQ's own, it needs one Redis, not a cluster.
"""

from __future__ import annotations

import weakref
from typing import Any

from redis import Redis
from redis.commands.core import Script

from .fair_caps import CAPS
from .fair_charge import Charge, charge_on
from .fair_common import COMMON
from .fair_policy import DEFAULT_ESTIMATE
from .fair_rates import RATE_PREFIX, RATES
from .keys import FAIR_PREFIX, FAIR_TOKEN, PAUSE_PREFIX
from .rq_start import START

# The finish's half (fair_charge.py) and the pieces every script shares (fair_common.py), at
# the paths the worker, the tests and the benches use.
__all__ = [
    "COMMON",
    "RATE_PREFIX",
    "Charge",
    "charge_on",
    "dequeue",
    "prefix_of",
    "waiting_job_ids",
]


_DEQUEUE = (
    COMMON
    + CAPS
    + RATES
    + """
local inbox, taken = KEYS[1], KEYS[2]
local job_prefix, prefix, mode, pause, qname = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]

local function sort_one(id, at_front)
  -- pcall: a key of another type is sorted too; the pick hands it to the worker, which
  -- records and removes it as RQ's read fails on it.
  local meta = redis.pcall('HGET', job_prefix .. id, 'meta')
  if type(meta) == 'table' then meta = nil end
  local bucket, weight, level = fair_of(meta)
  local L = prefix .. level .. ':'
  local entry
  if at_front then
    -- Arrival number 0: first in its bucket, and first in FIFO order as well.
    entry = '0:' .. id
    redis.call('LPUSH', L .. 'b:' .. bucket, entry)
  else
    entry = redis.call('INCR', prefix .. 'seq') .. ':' .. id
    redis.call('RPUSH', L .. 'b:' .. bucket, entry)
  end
  redis.call('HSET', L .. 'w', bucket, weight)
  activate(prefix, pause, level, bucket, mode)
end

-- The inbox is [job ids pushed to the front][tokens][job ids pushed since]: sort the ones at
-- the front (to the front of their buckets), then the oldest SORT_BATCH of the rest, oldest
-- first; each becomes a token where it stands (LSET), so the list keeps its length and its
-- shape, and one call never holds Redis for a whole burst (the next calls sort the rest).
local SORT_BATCH = 200
local unsorted = false  -- arrivals left for the next call: never answer "nothing" then
local function sort_inbox()
  local n = redis.call('LLEN', inbox)
  if n == 0 then return end
  local first = redis.call('LPOS', inbox, TOKEN)
  if first and first > 0 then
    local front = redis.call('LRANGE', inbox, 0, first - 1)
    for i = #front, 1, -1 do sort_one(front[i], true) end
    for i = 0, first - 1 do redis.call('LSET', inbox, i, TOKEN) end
  end
  local last = redis.call('LPOS', inbox, TOKEN, 'RANK', -1)
  local start = (last or -1) + 1
  if start >= n then return end
  local fresh = redis.call('LRANGE', inbox, start, start + SORT_BATCH - 1)
  for i = 1, #fresh do
    sort_one(fresh[i], false)
    redis.call('LSET', inbox, start + i - 1, TOKEN)
  end
  unsorted = start + #fresh < n
end

-- The lane's scores were written by workers of the other FAIRNESS: recompute them.
local function rescore(L)
  for _, set in ipairs({'ready', 'parked'}) do
    for _, bucket in ipairs(redis.call('ZRANGE', L .. set, 0, -1)) do
      redis.call('ZADD', L .. set, entry_score(L, bucket, mode), bucket)
    end
  end
  redis.call('SET', L .. 'mode', mode)
end

local function field(fields, name)
  for i = 1, #fields, 2 do
    if fields[i] == name then return fields[i + 1] end
  end
  return nil
end
"""
    + START
    + """
-- After a bucket's head left: its next score, or out of the ready set when it ran dry.
local function requeue(L, bucket, score)
  if redis.call('LLEN', L .. 'b:' .. bucket) == 0 then
    redis.call('ZREM', L .. 'ready', bucket)
  else
    if mode == 'fifo' then score = head_seq(L, bucket) end
    redis.call('ZADD', L .. 'ready', score, bucket)
  end
end

-- Buckets whose window has reopened go back to their lane (at max(F, V): waiting banks no
-- credit), and a job's set-aside messages (member <level> TAB <bucket> TAB <job>) their
-- oldest to its bucket's head; at most 100 per call (the next calls take the rest).
local function reopen_due()
  local due = redis.call('ZRANGEBYSCORE', prefix .. 'rwait', '-inf', NOW, 'LIMIT', 0, 100)
  for _, member in ipairs(due) do
    redis.call('ZREM', prefix .. 'rwait', member)
    local level, rest = string.match(member, '^(%-?%d+)\\t(.*)$')
    if level then
      local bucket, job = string.match(rest, '^(.-)\\t(.*)$')
      if bucket then
        wake(prefix .. level .. ':', bucket, job)
      else
        activate(prefix, pause, tonumber(level), rest, mode)
      end
    end
  end
end

local function pick()
  if redis.call('SISMEMBER', pause .. 'queues', qname) == 1 then return {'', 'paused'} end
  reopen_due()
  -- (the inbox's length says whether anything waits at all: paused work, or nothing)
  for _ = 1, 1000 do
    local top = redis.call('ZRANGE', prefix .. 'levels', 0, 0)
    if #top == 0 then
      if unsorted then return {'', 'busy'} end
      local soonest = redis.call('ZRANGE', prefix .. 'rwait', 0, 0, 'WITHSCORES')
      if #soonest > 0 then
        -- Only rate-limited work waits: say when the first window reopens.
        return {'', 'rate', tostring(math.max(tonumber(soonest[2]) - NOW, 0))}
      end
      if redis.call('LLEN', inbox) > 0 then return {'', 'paused'} end
      return {'', 'empty'}
    end
    local level = top[1]
    local L = prefix .. level .. ':'
    if redis.call('GET', L .. 'mode') ~= mode then rescore(L) end
    local best = redis.call('ZRANGE', L .. 'ready', 0, 0, 'WITHSCORES')
    if #best == 0 then
      redis.call('ZREM', prefix .. 'levels', level)
    else
      local bucket, score = best[1], tonumber(best[2])
      local entry = nil
      if redis.call('SISMEMBER', pause .. 'tenants', bucket) == 1 then
        redis.call('ZREM', L .. 'ready', bucket)
        redis.call('ZADD', L .. 'parked', score, bucket)
      else
        entry = redis.call('LPOP', L .. 'b:' .. bucket)
        if not entry then redis.call('ZREM', L .. 'ready', bucket) end
      end
      if entry then
        local id = string.match(entry, '^%d+:(.*)$') or entry
        local fields = redis.pcall('HGETALL', job_prefix .. id)
        if fields.err then
          -- Not a hash: the worker reads it as RQ does and handles the error.
          requeue(L, bucket, score)
          redis.call('LPOP', inbox)
          redis.call('RPUSH', taken, id)
          return {id, 0}
        end
        local _, weight, _, job, rates, caps = fair_of(field(fields, 'meta'))
        local aside = aside_key(L, job, bucket)
        local start = false
        if #fields == 0 then
          -- The job hash is gone (deleted from django-rq's pages): so is its token.
          redis.call('LPOP', inbox)
          requeue(L, bucket, score)
        elseif redis.call('SISMEMBER', pause .. 'jobs', job) == 1
            or redis.call('SISMEMBER', pause .. 'jobtenants', job .. '\\t' .. bucket) == 1 then
          local held = L .. 'held:' .. job .. '\\t' .. bucket
          -- The job's set-aside messages (at its cap or over its rate) were heads before this
          -- one: older, they are held first, so that the resume gives back the job's order.
          -- (While the job is paused nothing is set aside: one move per pause.)
          while redis.call('LMOVE', aside, held, 'LEFT', 'RIGHT') do end
          redis.call('RPUSH', held, entry)
          redis.call('SADD', HOLDS, held)
          redis.call('HSET', HOLD_LANES, held, L)
          requeue(L, bucket, score)
        else
          -- The job's set-aside messages and its messages in the bucket are each in order:
          -- the older of their heads is the job's next (a set-aside one, unless it was
          -- pushed to the front).
          -- `later`: the bucket's head, when a set-aside message goes before it.
          local later = nil
          local first = redis.call('LINDEX', aside, 0)
          if first and seq_of(first) < seq_of(entry) then
            later = entry
            entry = redis.call('LPOP', aside)
            id = string.match(entry, '^%d+:(.*)$') or entry
            fields = redis.pcall('HGETALL', job_prefix .. id)
            if fields.err then
              redis.call('LPUSH', L .. 'b:' .. bucket, later)
              redis.call('LPOP', inbox)
              redis.call('RPUSH', taken, id)
              return {id, 0}
            end
            _, weight, _, job, rates, caps = fair_of(field(fields, 'meta'))
          end
          if #fields == 0 then
            if later then redis.call('LPUSH', L .. 'b:' .. bucket, later) end
            redis.call('LPOP', inbox)
          else
            local tcap = cap_block(caps, true, id)
            local trate = (not tcap) and rate_block(rates, true)
            local jcap = not (tcap or trate) and cap_block(caps, false, id)
            local jrate = not (tcap or trate or jcap) and rate_block(rates, false)
            if tcap or trate then
              -- The tenant is at its cap or over its rate: the message keeps its place at its
              -- bucket's head, and the bucket leaves the ready set until the cap frees or the
              -- window reopens (skipped once, not at every dequeue); the pick goes on to the
              -- next bucket: work-conserving.
              if later then redis.call('LPUSH', L .. 'b:' .. bucket, later) end
              redis.call('LPUSH', L .. 'b:' .. bucket, entry)
              redis.call('ZREM', L .. 'ready', bucket)
              if tcap then
                redis.call('SADD', L .. 'cwait', bucket)
                cap_wait(tcap, L, bucket, '')
              else
                redis.call('ZADD', prefix .. 'rwait', trate, level .. '\\t' .. bucket)
              end
            elseif jcap or jrate then
              -- The job is at its cap or over its rate: only its messages of this bucket
              -- wait (set aside, in order: the head behind the set-aside ones, which are
              -- older); the bucket goes on with its other jobs.
              redis.call('LPUSH', aside, entry)
              if later then redis.call('RPUSH', aside, later) end
              if jcap then
                cap_wait(jcap, L, bucket, job)
              else
                redis.call('ZADD', prefix .. 'rwait', jrate,
                  level .. '\\t' .. bucket .. '\\t' .. job)
              end
              requeue(L, bucket, score)
            else
              if later then redis.call('LPUSH', L .. 'b:' .. bucket, later) end
              start = true
            end
          end
        end
        if start then
          rate_count(rates, id)
          cap_count(caps, id)
          -- The job's next set-aside message comes forward: it starts next if it may.
          local after = redis.call('LPOP', aside)
          if after then redis.call('LPUSH', L .. 'b:' .. bucket, after) end
          local estimate = 0
          if mode == 'fifo' then
            requeue(L, bucket, score)
          else
            local v = tonumber(redis.call('GET', L .. 'vt') or '0')
            if score > v then redis.call('SET', L .. 'vt', score) end
            estimate = tonumber(redis.call('HGET', L .. 'mean', bucket)
              or redis.call('HGET', L .. 'mean', '~lane') or ARGV[6])
            local finish = score + estimate / weight
            redis.call('HSET', L .. 'fin', bucket, finish)
            requeue(L, bucket, finish)
          end
          redis.call('LPOP', inbox)
          -- RQ's start, with the worker's arguments (rq_start.py), or the intermediate queue
          if not rq_start(id, fields) then redis.call('RPUSH', taken, id) end
          local held_caps = ''
          if caps then held_caps = cjson.encode(caps) end
          return {id, fields, L, bucket, tostring(estimate), tostring(weight), held_caps}
        end
      end
    end
  end
  return {'', 'busy'}
end

sort_inbox()
return pick()
"""
)


def prefix_of(queue: str) -> str:
    """The key prefix of ``queue``'s lanes."""
    return f"{FAIR_PREFIX}{queue}:"


def dequeue(
    connection: Redis,
    queue: str,
    inbox: str,
    taken: str,
    job_prefix: str,
    mode: str,
    start: tuple[str, ...] = (),
) -> list[Any]:
    """Run the dequeue script: ``[job id, fields, lane, bucket, estimate, weight, caps]`` for a
    pick, ``[job id, 0]`` for a key that is not a hash, ``["", why]`` for none ("empty",
    "paused": nothing eligible (paused, or held by a cap), "busy": more than 1000 ineligible
    heads met at once), and
    ``["", "rate", seconds]`` when only work over its rate limit waits: the soonest window
    reopens in ``seconds``. With ``start`` (``rq_start.StartArguments.args``) the script also
    writes RQ's start of the job it picks."""
    script = _scripts.get(connection)
    if script is None:
        script = _scripts[connection] = connection.register_script(_DEQUEUE)
    reply = script(
        keys=[inbox, taken],
        args=[
            job_prefix,
            prefix_of(queue),
            mode,
            PAUSE_PREFIX,
            queue,
            DEFAULT_ESTIMATE,
            RATE_PREFIX,
            *start,
        ],
    )
    return list(reply)


# The dequeue script per client, so that its SHA1 (of some 6 KB) is computed once, not at
# every dequeue; an unknown script is loaded on the first NOSCRIPT, as redis-py does.
_scripts: weakref.WeakKeyDictionary[Redis, Script] = weakref.WeakKeyDictionary()


def waiting_job_ids(connection: Redis, queue: str, inbox: str) -> list[str]:
    """Every job id waiting on ``queue``: the inbox's unsorted ones, then each bucket's, held
    ones included (SCAN: for tests and operators' tools, never on a worker's path)."""
    ids = [i for i in (_text(v) for v in connection.lrange(inbox, 0, -1)) if i != FAIR_TOKEN]
    for kind in ("b", "held", "aside"):
        pattern = f"{prefix_of(queue)}*:{kind}:*"
        for key in connection.scan_iter(match=pattern, count=1000):
            ids += [_text(e).split(":", 1)[1] for e in connection.lrange(key, 0, -1)]
    return ids


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
