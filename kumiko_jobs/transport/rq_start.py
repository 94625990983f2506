"""RQ's start of a job, written by the dequeue script in the same round trip as the pick.

RQ's ``SimpleWorker`` writes a job's start after its dequeue, in a pipeline of its own (the
worker's ``BookkeepingSimpleWorker`` sends it as one ``MULTI``/``EXEC``): the execution's hash and
its registry, ``StartedJobRegistry``, the worker's execution set, state and heartbeat, the
job's ``started`` fields, ``PERSIST`` of the job's hash, and the removal from the intermediate
queue. Here the same keys and fields are written by the dequeue script (``fair.py``) for the
message it picks, so the start costs no round trip of its own and no client-side packing of
fourteen commands, and the job goes from its queue to ``StartedJobRegistry`` in one atomic step
(it never sits in the intermediate queue between two round trips).

What needs the job (its timeout, for the TTLs) is read from its hash by the script; what needs
the worker (its name, keys, clock) is made by the worker before each dequeue
(``StartArguments``), and the worker then sets on the job and itself the attributes RQ's own
start would have set (``rq_worker.py``). RQ's ``SimpleWorker.get_heartbeat_ttl`` rule is
re-implemented in ``START`` below: a worker class that overrides it, or a Redis older than the
one-trip dequeue needs, keeps RQ's own start. Re-read on every RQ upgrade, with
``one_trip_dequeue.py``.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from rq.defaults import DEFAULT_WORKER_TTL
from rq.executions import Execution, ExecutionRegistry
from rq.utils import current_timestamp, now, utcformat

# Inside the dequeue script, after its ``field`` and ``job_prefix``: ARGV[8] onwards are a
# ``StartArguments``' ``args`` (none: RQ's own start follows, from the worker).
START = """
-- RQ's start of job `id` (rq_start.py): the writes of RQ's start pipeline, in its order.
-- Returns whether the job skips the intermediate queue (RQ removes it there for a worker of
-- one queue only).
local function rq_start(id, fields)
  local worker = ARGV[8]
  if not worker or worker == '' then return false end
  local exec_id, at_ts, at_utc, at_int = ARGV[9], ARGV[10], ARGV[11], tonumber(ARGV[12])
  local wip, worker_key, worker_execs = ARGV[13], ARGV[14], ARGV[15]
  local exec_prefix, execs_prefix, default_ttl = ARGV[16], ARGV[17], tonumber(ARGV[18])
  -- SimpleWorker.get_heartbeat_ttl: -1 (no timeout) keeps the worker's default TTL.
  local timeout = tonumber(field(fields, 'timeout') or '')
  local ttl
  if timeout == -1 then
    ttl = default_ttl
  elseif timeout and timeout ~= 0 then
    if timeout >= 0 then ttl = math.floor(timeout) + 60 else ttl = math.ceil(timeout) + 60 end
  else
    ttl = default_ttl + 60
  end
  local composite = id .. ':' .. exec_id
  -- Execution.create
  redis.call('HSET', exec_prefix .. composite, 'id', exec_id, 'job_id', id,
    'created_at', at_ts, 'last_heartbeat', at_ts, 'worker_name', worker)
  redis.call('EXPIRE', exec_prefix .. composite, ttl)
  redis.call('ZADD', execs_prefix .. id, at_int + ttl + 60, exec_id)
  redis.call('EXPIRE', execs_prefix .. id, ttl + 60)
  redis.call('ZADD', wip, at_int + ttl, composite)
  redis.call('SADD', worker_execs, composite)
  redis.call('EXPIRE', worker_execs, ttl + 60)
  -- the worker's state (when it changes) and heartbeat
  if ARGV[19] == '1' then redis.call('HSET', worker_key, 'state', 'busy') end
  redis.call('HSET', worker_key, 'last_heartbeat', at_utc)
  redis.call('EXPIRE', worker_key, ttl)
  redis.call('EXPIRE', worker_execs, ttl)
  -- Job.prepare_for_execution, and PERSIST
  redis.call('HSET', job_prefix .. id, 'last_heartbeat', at_utc, 'status', 'started',
    'started_at', at_utc, 'worker_name', worker)
  redis.call('PERSIST', job_prefix .. id)
  return ARGV[20] == '1'
end
"""


@dataclass(frozen=True, slots=True)
class StartArguments:
    """One dequeue's start, made by the worker before the script runs: a fresh execution id
    and the worker's clock, as RQ's start would read them."""

    execution_id: str
    at: datetime
    args: tuple[str, ...]  # ARGV[8:] of the dequeue script (``START``)

    def execution(self, job: Any) -> Execution:
        """The execution the script wrote for ``job``, as ``Execution.create`` returns it."""
        execution = self.execution_of(job.id, job.connection)
        execution._job = job
        return execution

    def execution_of(self, job_id: str, connection: Any) -> Execution:
        """The execution the script wrote for the message ``job_id`` (no job: one RQ cannot
        load)."""
        execution = Execution(
            id=self.execution_id, job_id=job_id, connection=connection, worker_name=self.args[0]
        )
        execution.created_at = execution.last_heartbeat = self.at
        return execution


# The worker dequeuing in this thread (set around its dequeue by ``rq_worker.py``): who makes
# the start's arguments for each call of the script. None: the script writes no start.
starter: ContextVar[Callable[[Any], StartArguments] | None] = ContextVar(
    "kumiko_jobs_rq_starter", default=None
)


def start_arguments(worker: Any, queue: Any, *, busy_sent: bool) -> StartArguments:
    """The script's start arguments for ``worker`` dequeuing from ``queue``; ``busy_sent``: the
    worker's hash already says ``busy`` (RQ writes the state only when it changes, here)."""
    execution_id = uuid.uuid4().hex
    at = now()
    execution_prefix, executions_prefix = _key_prefixes()
    args = (
        worker.name,
        execution_id,
        str(at.timestamp()),
        utcformat(at),
        str(current_timestamp()),
        queue.started_job_registry.key,
        worker.key,
        worker.executions_key,
        execution_prefix,
        executions_prefix,
        str(DEFAULT_WORKER_TTL),
        "" if busy_sent else "1",
        "1" if len(worker.queues) == 1 else "",
    )
    return StartArguments(execution_id=execution_id, at=at, args=args)


@functools.cache
def _key_prefixes() -> tuple[str, str]:
    """RQ's key of an execution, less "<job>:<id>", and of a job's executions, less "<job>",
    from RQ's own classes (``RQ_KEY_PREFIX`` included)."""
    probe = Execution(id="", job_id="", connection=None)  # type: ignore[arg-type]
    return probe.key[:-1], ExecutionRegistry(job_id="", connection=None).key  # type: ignore[arg-type]
