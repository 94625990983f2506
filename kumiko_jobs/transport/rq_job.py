"""How a kumiko message is stored in Redis: an RQ job read and written as JSON.

Every kumiko message is an RQ job whose function is ``kumiko_jobs.runner.execute`` (``RUNNER``)
and whose single argument is the signed envelope string, stored with RQ's JSON serializer: no
pickle ever crosses Redis, so a forged message cannot execute code while being decoded. The job
classes here are what the queues, the scheduler and the worker read job hashes with.
"""

from __future__ import annotations

from typing import Any

from django.utils.module_loading import import_string
from redis import Redis
from rq import Queue
from rq.job import Job
from rq.serializers import JSONSerializer

# The dotted path stored in every queued message and cron entry: it never changes.
RUNNER = "kumiko_jobs.runner.execute"
Serializer = JSONSerializer


class JsonJob(Job):
    """An RQ job that reads and writes JSON unless told otherwise (used by the scheduler)."""

    def __init__(
        self, id: str | None = None, connection: Redis | None = None, serializer: Any = None
    ):
        super().__init__(id=id, connection=connection, serializer=serializer or JSONSerializer)


# RQ calls these by import path (callbacks) or URL (webhooks), from the job hash; kumiko never
# sets them, so a message that carries one was written by someone else.
HOOK_FIELDS = (
    "success_callback_name",
    "failure_callback_name",
    "stopped_callback_name",
    "webhooks",
)


class _MalformedJobHash(ValueError):
    """A job hash RQ would silently skip (see ``WorkerJob.restore``).

    Private: nobody catches it by name. It leaves RQ's dequeue tagged with the job's id and
    queue like any hash RQ cannot load, and the worker records and removes every such hash
    (worker/foreign.py).
    """


# The worker's record names the exception's type (``RejectedMessage.reason``: "RQ cannot load
# the job (MalformedJobHash: ...)"), which operators read and older versions wrote.
_MalformedJobHash.__name__ = _MalformedJobHash.__qualname__ = "MalformedJobHash"


class WorkerJob(JsonJob):
    """The job class of kumiko's workers: notes which hook fields the job hash carried.

    RQ reads the whole hash once when it dequeues a job and keeps what it read; noting the hook
    fields from that same read lets the worker refuse a hooked message without a second read,
    and leaves no window between the check and RQ's use. A field is noted even when RQ could
    not parse it (RQ drops an unreadable webhook list silently): it is still a forgery.
    """

    hook_fields: tuple[str, ...] = ()

    def restore(self, raw_data: Any) -> Any:
        """RQ's restore, noting the hook fields present and refusing a hash with no data."""
        if b"data" not in raw_data and "data" not in raw_data:
            # RQ takes such a hash for a job that no longer exists and skips it silently,
            # leaving it in Redis and its id in the intermediate queue. Any other error here
            # reaches the worker, which records the hash and removes it.
            raise _MalformedJobHash("the job hash has no data field")
        present = {
            key.decode() if isinstance(key, bytes) else key
            for key, value in raw_data.items()
            if value
        }
        self.hook_fields = tuple(field for field in HOOK_FIELDS if field in present)
        return super().restore(raw_data)


def is_json_serializer(value: Any) -> bool:
    """Is an ``RQ_QUEUES[...]["SERIALIZER"]`` value RQ's JSON serializer (or a subclass)?"""
    try:
        cls = import_string(value) if isinstance(value, str) else value
    except ImportError:
        return False
    return isinstance(cls, type) and issubclass(cls, JSONSerializer)


JSON_SERIALIZER_PATH = "rq.serializers.JSONSerializer"


def timeout_of_job(job: Job) -> int | None:
    """Seconds RQ's death penalty gives this job (None: no limit), as RQ computes it."""
    timeout = job.timeout or Queue.DEFAULT_TIMEOUT
    return None if timeout == -1 else int(timeout)
