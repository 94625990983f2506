"""Slots of concurrency caps, as the repairs need to see and free them.

Two kinds of slot exist. The fair dequeue's caps (``fair_caps.py``): a SET of the job ids in
flight per cap key, taken by the dequeue script and freed by the finish's script; a worker
killed mid-run leaves its id in the set, and the sweep, which hands the run back, frees it
(``release_caps_of``: the caps are read from the message's own job hash). And RQ
``RateLimit`` slots, which messages pushed by a release before the caps moved into the
dequeue still hold (a rolling deploy): RQ's worker code frees them (``release_slot``).

When Redis goes away between a run's record and its release, the slot stays taken. The
relay finds the holders of every slot with waiters here (``rate_limit_slot_holders``) and,
for those whose run is finished, frees them (``release_rate_limit_slot``): caps through the
caps' release, RQ slots through RQ's own script, so RQ's admission stays RQ's.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

from redis import Redis
from redis.commands.core import Script
from rq.job import Job
from rq.rate_limit import RateLimitRegistry

from .fair_caps import CAP_PREFIX, CAP_WAITING, CAPS
from .fair_common import COMMON
from .queues import get_queue

# ARGV: job id, then either the caps (JSON, as the fair field has them), or "" and the job
# hash to read them from, or "" "" and one cap key (the relay's repair of one holder).
_RELEASE = (
    COMMON
    + CAPS
    + """
local id, caps_json, job_key, only = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
if only and only ~= '' then
  cap_release(id, only, nil)
  return 1
end
local caps = nil
if caps_json ~= '' then
  local ok, decoded = pcall(cjson.decode, caps_json)
  if ok then caps = decoded end
else
  local meta = redis.pcall('HGET', job_key, 'meta')
  if type(meta) ~= 'string' then return 0 end
  local _b, _w, _l, _j, _r, found = fair_of(meta)
  caps = found
end
if type(caps) ~= 'table' then return 0 end
release_caps(id, caps)
return 1
"""
)

_scripts: weakref.WeakKeyDictionary[Redis, Script] = weakref.WeakKeyDictionary()


def _release(connection: Redis, *args: str) -> int:
    script = _scripts.get(connection)
    if script is None:
        script = _scripts[connection] = connection.register_script(_RELEASE)
    return int(script(keys=[], args=list(args)))


def release_caps(connection: Redis, job_id: str, caps: str) -> None:
    """Free the slots ``job_id`` holds of ``caps`` (the dequeue's JSON) and wake the waiters:
    the worker's release when its finish was RQ's own (one round trip)."""
    _release(connection, job_id, caps, "", "")


def release_caps_of(queue: str, rq_job_id: str) -> bool:
    """Free the cap slots of the message ``rq_job_id`` on ``queue`` (its caps read from its job
    hash), idempotently: the sweep's repair of a dead worker's run. False when the message had
    no caps, or its hash is gone."""
    connection = get_queue(queue).connection
    return bool(_release(connection, rq_job_id, "", Job.redis_job_namespace_prefix + rq_job_id, ""))


@dataclass(frozen=True, slots=True)
class SlotHolder:
    """An RQ job holding a slot of a cap (key ``kumiko:cap:...``) or an RQ ``RateLimit`` key
    that has messages waiting."""

    key: str
    job_id: str


def rate_limit_slot_holders(queue: str) -> list[SlotHolder]:
    """The slot holders of every cap and RQ rate-limit key with waiting messages, on ``queue``'s
    Redis (one set of keys per Redis, whichever queue a message is bound for)."""
    redis = get_queue(queue).connection
    holders = _cap_holders(redis)
    # One key per (job, tenant) for sequential jobs: thousands with many tenants, so two
    # pipelined round trips rather than one per key.
    registries = RateLimitRegistry.all(redis)
    with redis.pipeline(transaction=False) as pipe:
        for registry in registries:
            pipe.zcard(registry.rate_limited_key)
        waiting = [r for r, n in zip(registries, pipe.execute(), strict=True) if n]
    if not waiting:
        return holders
    with redis.pipeline(transaction=False) as pipe:
        for registry in waiting:
            pipe.zrange(registry.allowed_key, 0, -1)
        allowed = pipe.execute()
    return holders + [
        SlotHolder(registry.key, _text(job_id))
        for registry, job_ids in zip(waiting, allowed, strict=True)
        for job_id in job_ids
    ]


def _cap_holders(redis: Redis) -> list[SlotHolder]:
    """The ids in flight of every cap with waiters (two round trips)."""
    keys = [_text(k) for k in redis.smembers(CAP_WAITING)]
    if not keys:
        return []
    with redis.pipeline(transaction=False) as pipe:
        for key in keys:
            pipe.smembers(CAP_PREFIX + key)
        members = pipe.execute()
    return [
        SlotHolder(CAP_PREFIX + key, _text(job_id))
        for key, ids in zip(keys, members, strict=True)
        for job_id in sorted(ids)
    ]


def release_rate_limit_slot(queue: str, holder: SlotHolder) -> list[str]:
    """Free ``holder``'s slot; returns the job ids RQ admitted (RQ's script; a cap's release
    wakes its waiters inside the dequeue's structures instead, and returns none)."""
    connection = get_queue(queue).connection
    if holder.key.startswith(CAP_PREFIX):
        _release(connection, holder.job_id, "", "", holder.key[len(CAP_PREFIX) :])
        return []
    registry = RateLimitRegistry(holder.key, connection)
    return registry.release_and_enqueue(holder.job_id)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
