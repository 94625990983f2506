"""Refusing what is not a kumiko message, before RQ prepares, forks or calls anything.

Whoever can write to Redis can name any importable function in an RQ message (``os.system``
with JSON arguments), and RQ would call it. A kumiko worker therefore checks every dequeued
message first: anything but a call of the runner with one argument (the signed envelope) is
recorded as a ``RejectedMessage``, failed in RQ without calling anything, and the worker goes on.
A job hash RQ cannot even load is recorded and removed, where RQ would stop the worker (and
then every other worker that dequeues it).

The worker classes also read JSON only (``json_only``) and hide RQ's own per-message outcome
lines (``hide_rq_outcome_lines``): the runner logs one line per attempt instead.
"""

from __future__ import annotations

import logging
from typing import Any

from .. import transport
from ..history.rejections import record_rejection
from ..transport import RUNNER, Serializer, WorkerJob

logger = logging.getLogger("kumiko_jobs.worker")


def json_only(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The worker's constructor arguments, made to read JSON messages with kumiko's job class.

    django-rq's rqworker passes ``--serializer`` (pickle by default), and a pickle is code.
    """
    kwargs["serializer"] = Serializer
    # Its own job class, which notes the RQ hook fields a message carries (see refusal()).
    kwargs["job_class"] = WorkerJob
    # RQ's description of a message is the runner's call with the whole signed envelope,
    # truncated: noise in the log. RQ then logs the RQ job id; kumiko's own lines name the run.
    kwargs["log_job_description"] = False
    return kwargs


class HideRQOutcomeLines(logging.Filter):
    """Drops RQ's per-message outcome lines from the ``rq.worker`` logger.

    Kumiko records a failed attempt and returns normally, so RQ would log "Job OK" and
    "Successfully completed job" after it. The runner logs one line per attempt instead
    (``kumiko_jobs.log_context``: ``run succeeded: job=... tenant=... run_id=...`` or
    ``attempt failed: ...``). Installed on the shared logger once; in a kumiko worker process
    every RQ message is a kumiko run, so nothing else is hidden.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        """False for RQ's "Successfully completed" and "Job OK" lines, which would contradict a
        failed attempt the runner recorded and returned from; True for everything else.
        """
        if str(record.msg).startswith("Successfully completed"):
            return False
        args = record.args if isinstance(record.args, tuple) else ()
        return not any("Job OK" in str(arg) for arg in args)


def hide_rq_outcome_lines(log: logging.Logger) -> None:
    """Install ``HideRQOutcomeLines`` on RQ's worker logger, once however many workers start."""
    if not any(isinstance(f, HideRQOutcomeLines) for f in log.filters):
        log.addFilter(HideRQOutcomeLines())


def refusal(job: Any, redis: Any) -> str | None:
    """Why a worker must not run this RQ job (None: it is a kumiko message)."""
    try:
        func_name, instance, args, kwargs = job.func_name, job.instance, job.args, job.kwargs
    except Exception as exc:
        cause = type(exc.__cause__ or exc).__name__
        return f"RQ cannot read the message data ({cause}): kumiko messages are JSON"
    if func_name != RUNNER:
        return f"the message names the function {func_name!r}; kumiko workers only call {RUNNER}"
    if instance is not None:
        return f"the message names an instance ({type(instance).__name__}) to call {RUNNER} on"
    if not isinstance(args, list | tuple) or len(args) != 1 or kwargs != {}:
        return "the message must carry exactly one argument, the signed envelope"
    if isinstance(job, WorkerJob):
        hooks: Any = job.hook_fields
    else:  # loaded by another job class: read the fields from Redis
        hooks = transport.hooks_in_hash(redis, job)
    if hooks:
        return f"the message sets RQ {', '.join(hooks)}, which kumiko never uses"
    return None


def _raw_text(raw: bytes | str) -> str:
    return raw.decode("utf-8", "backslashreplace") if isinstance(raw, bytes) else str(raw)


def _record(message: str, reason: str, job_id: str, queue: str) -> None:
    try:
        record_rejection(message, reason, job_id, queue)
    except Exception:
        # The history is down; the refusal still stands (and RQ's failed registry keeps it).
        logger.exception("could not record rejected message %s: %s", job_id, reason)


class RefusesForeignMessages:
    """Worker mixin: checks every dequeued message before RQ prepares, forks or calls anything.

    A refused message is recorded and failed in RQ; an unloadable job hash is recorded and
    removed, so one bad hash cannot stop every worker in turn.
    """

    connection: Any

    def execute_job(self, job: Any, queue: Any) -> None:
        """Run a kumiko message; refuse anything else (a pickled call, another function, RQ hooks)
        before RQ loads or calls it: record why, and fail it in RQ.
        """
        reason = refusal(job, self.connection)
        if reason is None:
            super().execute_job(job, queue)  # type: ignore[misc]
            return
        _record(_raw_text(job.data), reason, job.id, queue.name)
        transport.fail_refused(self.connection, job, queue, reason, worker=self)

    def dequeue_job_and_maintain_ttl(
        self, timeout: int | None, max_idle_time: int | None = None
    ) -> Any:
        """RQ's dequeue, but a job hash RQ cannot load is recorded and removed and the next message
        taken, so one bad hash cannot stop every worker in turn.
        """
        while True:
            try:
                return super().dequeue_job_and_maintain_ttl(timeout, max_idle_time)  # type: ignore[misc]
            except Exception as exc:
                # RQ tags a job hash it cannot load with its id and queue; anything else is ours
                # to re-raise. Left alone, the hash would stop this worker and then every other.
                job_id, queue = getattr(exc, "job_id", None), getattr(exc, "queue", None)
                if job_id is None or queue is None:
                    raise
                self._remove_unreadable(str(job_id), queue, exc)

    def _remove_unreadable(self, job_id: str, queue: Any, exc: Exception) -> None:
        raw = transport.unreadable_job_dump(self.connection, queue, job_id)
        reason = f"RQ cannot load the job ({type(exc).__name__}: {exc})"
        _record(raw, reason, job_id, queue.name)
        # RQ's start of it, when the dequeue script wrote one (transport/rq_start.py)
        started = getattr(exc, "kumiko_execution", None)
        caps = getattr(exc, "kumiko_caps", "")
        transport.remove_unreadable_job(self.connection, queue, job_id, started, caps, worker=self)
