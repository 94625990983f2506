"""Writing many messages' RQ job hashes in one pipeline, without an RQ ``Job`` per message.

RQ's ``Queue.enqueue_many`` builds a ``Job`` object per message and sends three commands for
each (the status, the hash, the push): at thousands of messages that, not Redis, is the cost
(a bulk enqueue of 10,000 runs spent more time in it than in its INSERT). Every kumiko message
is the same RQ call (``RUNNER`` with one string argument) and differs from its neighbours only
in its body, id, timeout and fair field, so RQ builds one job of the batch here, the hash of
that job is the template, and each message's hash is the template with its own fields: one
``HSET`` per message and one ``RPUSH`` for the batch, and the queue's doorbell rung
(``doorbell.py``), in one script call.

The hashes are RQ's (tests/integration/test_enqueue_many_push.py compares them field
by field with ``Queue.enqueue_many``'s, so an RQ upgrade that changes its format fails there),
and the order on the queue is the messages' order (``at_front`` ones pushed where RQ would).
The one difference: the job's data of a usual message (up to ``COMPRESS_ABOVE`` bytes) is
stored as its JSON, uncompressed, which RQ reads as it is (``Job.restore`` falls back to the raw
bytes when they are no zlib stream, and a JSON list never is one); a bigger one is compressed
with a smaller zlib window (``_data``).
"""

from __future__ import annotations

import itertools
import zlib
from collections.abc import Iterator, Sequence
from typing import Any

from redis import Redis
from redis.exceptions import NoScriptError
from rq import Queue
from rq.job import Job, JobStatus
from rq.utils import get_call_string

from . import doorbell
from .doorbell import BELL_SIZE
from .queues import Message
from .rq_job import RUNNER

# A hash's fields as redis-py takes them (its Mapping type is invariant in the key).
_Hash = dict[Any, Any]

# What RQ's Job.get_call_string truncates an argument's repr to in the description.
_DESCRIPTION_ARG_LENGTH = 75


def push_batch(
    queue: Queue, messages: Sequence[Message], result_ttl: int, failure_ttl: int
) -> None:
    """Put ``messages`` (none delayed or rate-limited) on ``queue`` in one round trip."""
    push_slices(queue, messages, result_ttl, failure_ttl, max(len(messages), 1))


def push_slices(
    queue: Queue, messages: Sequence[Message], result_ttl: int, failure_ttl: int, size: int
) -> None:
    """Put ``messages`` (none delayed or rate-limited) on ``queue``, one script call per
    ``size`` of them (Redis serves no one else while a call runs), in their order.

    The calls go out back to back on one connection and their replies are read at the end,
    so Redis writes one slice while the next is built and packed here: at 10,000 messages
    the push took as long in Redis's writes as in this process's packing, one after the
    other (bench/README.md, "`enqueue_many` at 10,000 runs/s").
    """
    if not messages:
        return
    if not _writes_like_rq(queue):
        for start in range(0, len(messages), size):
            _push_with_rq(queue, messages[start : start + size], result_ttl, failure_ttl)
        return
    seen: set[str] = set()
    for message in messages:
        if message.job_id in seen:
            # RQ refuses this too: two messages with one id would share one hash.
            raise ValueError(f"job id {message.job_id!r} appears more than once in one push")
        seen.add(message.job_id)
    template = _template(queue, result_ttl, failure_ttl)
    default_timeout = template.pop("timeout")
    head: list[Any] = [queue.job_class.redis_job_namespace_prefix, len(template)]
    for field, value in template.items():
        head += (field, value)
    metas: dict[tuple[Any, ...], bytes] = {}  # a push's messages mostly share their meta
    calls = (
        head + _message_args(queue, messages[start : start + size], default_timeout, metas)
        for start in range(0, len(messages), size)
    )
    _send(
        queue.connection, [queue.redis_queues_keys, queue.key, doorbell.bell_of(queue.name)], calls
    )


def _message_args(
    queue: Queue, messages: Sequence[Message], default_timeout: Any, metas: dict[Any, bytes]
) -> list[Any]:
    """The script's arguments for ``messages`` after the template's (see ``_PUSH``)."""
    dumps = queue.serializer.dumps
    args: list[Any] = []
    for message in messages:
        body = (message.body,)
        # What Message.meta is made of.
        fair = (
            message.bucket,
            message.weight,
            message.priority,
            message.job,
            message.rates,
            message.caps,
        )
        meta = metas.get(fair)
        if meta is None:
            meta = metas[fair] = dumps(message.meta) if message.meta else b""
        args += (
            message.job_id,
            1 if message.at_front else 0,
            _data(dumps((RUNNER, None, body, {}))),
            get_call_string(RUNNER, body, {}, max_length=_DESCRIPTION_ARG_LENGTH) or "",
            default_timeout if message.timeout is None else message.timeout,
            meta,
        )
    return args


def _send(redis: Redis, keys: list[Any], calls: Iterator[list[Any]]) -> None:
    """Run the push script once per argument list of ``calls``, in order: one call as any
    command; several sent back to back on one connection, each built as the one before it
    runs in Redis, and their replies read after the last. A script Redis lost (a restart,
    ``SCRIPT FLUSH``) is loaded and its calls run again, in order, one by one."""
    script = _script(redis)
    first = next(calls)
    second = next(calls, None)
    if second is None:
        script(keys=keys, args=first)
        return
    pool = redis.connection_pool
    connection = pool.get_connection()
    sent: list[list[Any]] = []
    lost: list[list[Any]] = []
    try:
        for args in itertools.chain((first, second), calls):
            connection.send_command(  # type: ignore[no-untyped-call]  # redis-py: untyped
                # A health check's PING (before the first only) would read a pending reply.
                *("EVALSHA", script.sha, len(keys), *keys, *args),
                check_health=not sent,
            )
            sent.append(args)
        for args in sent:
            try:
                connection.read_response()
            except NoScriptError:
                lost.append(args)
    except BaseException:
        # Replies may be left unread on it: never reuse it.
        connection.disconnect()  # type: ignore[no-untyped-call]  # redis-py: untyped
        raise
    finally:
        pool.release(connection)
    for args in lost:
        script(keys=keys, args=args)


def _data(data: bytes) -> bytes:
    """A job hash's ``data`` field: ``data`` itself up to ``COMPRESS_ABOVE`` bytes, else as a
    zlib stream (RQ reads both back).

    A usual message (a signed envelope of some 450 bytes, which its run and correlation ids
    and its signature make nearly incompressible) shrank by a third and cost more CPU than
    anything else in its push: a compressor's setup and flush, 7 % of a bulk enqueue's
    time by profile (bench/README.md, "`enqueue_many` at 10,000 runs/s"). ``zlib.compress``
    sets up a 32 KB window and 128 KB of state on every call; a 4 KB window and the fastest
    level compress a message as small (within a few bytes) in an eighth of the time.
    """
    if len(data) <= COMPRESS_ABOVE:
        return data
    compressor = zlib.compressobj(_LEVEL, zlib.DEFLATED, _WINDOW_BITS, _MEMORY_LEVEL)
    return compressor.compress(data) + compressor.flush()


# Bytes of job data stored as they are: a queued message's hash is some 170 bytes bigger in
# Redis than compressed (about 100 MB more for a backlog of 600,000 usual messages).
COMPRESS_ABOVE = 1024
_LEVEL, _WINDOW_BITS, _MEMORY_LEVEL = 1, 12, 4

# KEYS: RQ's set of queues, the queue's list, its doorbell. ARGV: the job hash prefix, the
# number of template fields n, n (field, value) pairs, then per message its id, at_front, data,
# description, timeout and meta ("" for none). The same writes as RQ's enqueue_many, in its order.
_PUSH = """
local BELL_SIZE = @BELL_SIZE@
local prefix, n = ARGV[1], tonumber(ARGV[2])
local fields = {}
for i = 3, 2 + 2 * n do fields[#fields + 1] = ARGV[i] end
local base = #fields
fields[base + 1], fields[base + 3], fields[base + 5], fields[base + 7] =
    'data', 'description', 'timeout', 'meta'
local back = {}
local function push_back()
    if #back > 0 then redis.call('RPUSH', KEYS[2], unpack(back)); back = {} end
end
redis.call('SADD', KEYS[1], KEYS[2])
for i = 3 + 2 * n, #ARGV, 6 do
    local id = ARGV[i]
    fields[base + 2], fields[base + 4], fields[base + 6], fields[base + 8] =
        ARGV[i + 2], ARGV[i + 3], ARGV[i + 4], ARGV[i + 5]
    redis.call('HSET', prefix .. id, unpack(fields, 1, ARGV[i + 5] == '' and base + 6 or base + 8))
    if ARGV[i + 1] == '1' then
        push_back()
        redis.call('LPUSH', KEYS[2], id)
    else
        back[#back + 1] = id
        if #back >= 1000 then push_back() end
    end
end
push_back()
-- The queue's doorbell (doorbell.py): one ring per message, at most BELL_SIZE kept.
local count = (#ARGV - 2 - 2 * n) / 6
for _ = 1, math.min(count, BELL_SIZE) do redis.call('LPUSH', KEYS[3], '1') end
redis.call('LTRIM', KEYS[3], 0, BELL_SIZE - 1)
return 0
""".replace("@BELL_SIZE@", str(BELL_SIZE))

_scripts: dict[int, Any] = {}


def _script(redis: Redis) -> Any:
    """The push script registered on ``redis`` (EVALSHA, loaded on first use)."""
    script = _scripts.get(id(redis))
    if script is None or script.registered_client is not redis:
        script = redis.register_script(_PUSH)
        _scripts[id(redis)] = script
    return script


def _writes_like_rq(queue: Queue) -> bool:
    """Does ``queue`` write a message the way RQ's own queue does? A synchronous queue (RQ's
    ``is_async=False``) or a project's queue class that changes how a job is saved or pushed
    gets RQ's own ``enqueue_many``, whatever it costs."""
    cls, job_class = type(queue), getattr(queue, "job_class", None)
    return (
        all(
            getattr(cls, name, None) is getattr(Queue, name)
            for name in ("enqueue_many", "_enqueue_job", "_enqueue_async_job", "push_job_id")
        )
        and getattr(job_class, "save", None) is Job.save
        and getattr(job_class, "to_dict", None) is Job.to_dict
        and bool(queue._is_async)
    )


def _push_with_rq(
    queue: Queue, messages: Sequence[Message], result_ttl: int, failure_ttl: int
) -> None:
    with queue.connection.pipeline() as pipe:
        queue.enqueue_many(
            [
                Queue.prepare_data(
                    RUNNER,
                    args=(m.body,),
                    job_id=m.job_id,
                    timeout=m.timeout,
                    result_ttl=result_ttl,
                    failure_ttl=failure_ttl,
                    at_front=m.at_front,
                    meta=m.meta,
                )
                for m in messages
            ],
            pipeline=pipe,
        )
        doorbell.ring(pipe, queue.name, len(messages))  # as the script does
        pipe.execute()


def _template(queue: Queue, result_ttl: int, failure_ttl: int) -> _Hash:
    """The hash RQ writes for a queued kumiko message of ``queue``, made by RQ itself (one
    ``Job``, created and prepared for the queue as ``enqueue_many`` does, never saved)."""
    job = queue.create_job(
        RUNNER,
        args=("",),
        result_ttl=result_ttl,
        failure_ttl=failure_ttl,
        status=JobStatus.QUEUED,
    )
    queue._prepare_for_queue(job)
    mapping: _Hash = job.to_dict()
    mapping.pop("meta", None)  # per message
    return mapping
