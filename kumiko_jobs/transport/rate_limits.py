"""RQ's rate-limit slots, as the relay needs to see and free them.

A ``sequential`` job or a tenant's ``max_per_tenant`` runs are admitted by an RQ ``RateLimit``:
a slot per running message. A worker frees its slot after the run's record; when Redis goes
away in between the slot stays taken until RQ's own cleanup. The relay finds such holders here
and frees them through RQ's own script, so admission stays RQ's.
"""

from __future__ import annotations

from dataclasses import dataclass

from rq.rate_limit import RateLimitRegistry

from .queues import get_queue


@dataclass(frozen=True, slots=True)
class SlotHolder:
    """An RQ job holding a slot of an RQ ``RateLimit`` key that has messages waiting."""

    key: str
    job_id: str


def rate_limit_slot_holders(queue: str) -> list[SlotHolder]:
    """The slot holders of every rate-limit key with waiting messages, on ``queue``'s Redis
    (RQ keeps one set of rate-limit keys per Redis, whichever queue a message is bound for)."""
    redis = get_queue(queue).connection
    # One key per (job, tenant) for sequential jobs: thousands with many tenants, so two
    # pipelined round trips rather than one per key.
    registries = RateLimitRegistry.all(redis)
    with redis.pipeline(transaction=False) as pipe:
        for registry in registries:
            pipe.zcard(registry.rate_limited_key)
        waiting = [r for r, n in zip(registries, pipe.execute(), strict=True) if n]
    if not waiting:
        return []
    with redis.pipeline(transaction=False) as pipe:
        for registry in waiting:
            pipe.zrange(registry.allowed_key, 0, -1)
        allowed = pipe.execute()
    return [
        SlotHolder(registry.key, job_id.decode() if isinstance(job_id, bytes) else str(job_id))
        for registry, job_ids in zip(waiting, allowed, strict=True)
        for job_id in job_ids
    ]


def release_rate_limit_slot(queue: str, holder: SlotHolder) -> list[str]:
    """Free ``holder``'s slot and admit the oldest waiting messages (RQ's own Lua script);
    returns the admitted job ids."""
    registry = RateLimitRegistry(holder.key, get_queue(queue).connection)
    return registry.release_and_enqueue(holder.job_id)
