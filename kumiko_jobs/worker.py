"""RQ workers with per-run hygiene and JSON-only messages.

``Worker`` (the default, set ``RQ["WORKER_CLASS"] = "kumiko_jobs.worker.Worker"``) runs jobs in
the worker process like RQ's ``SimpleWorker``: about five times the throughput of forking
for short database jobs, because the connection is reused. Its cost is that a run could leak
state into the next one, so after every run it goes back to the public schema and drops
connections the run left unusable.

``ForkingWorker`` keeps RQ's fork-per-job isolation. The parent closes its database
connections before forking (a socket shared by two processes corrupts both), and the work
horse flushes telemetry before it exits.

Both refuse any queue message that is not a call of the runner with one argument. Whoever can
write to Redis can name any importable function in an RQ message (``os.system`` with JSON
arguments), and RQ would call it; a kumiko worker records such a message as a
``RejectedMessage``, fails it in RQ without calling anything, and goes on. A job hash RQ cannot
even load is recorded and removed instead of stopping the worker.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import connections

from . import boot, telemetry_flush
from .steps.tenancy import reset_connections
from .transport import RUNNER, ForkingWorkerBase, Serializer, SimpleWorkerBase

logger = logging.getLogger("kumiko_jobs.worker")

# RQ calls these by import path, from the job hash; kumiko never sets them.
_HOOK_FIELDS = (
    "success_callback_name",
    "failure_callback_name",
    "stopped_callback_name",
    "webhooks",
)


def _json_only(kwargs: dict[str, Any]) -> dict[str, Any]:
    # django-rq's rqworker passes --serializer (pickle by default); kumiko reads JSON only.
    kwargs["serializer"] = Serializer
    return kwargs


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
    hooks = [f for f, v in zip(_HOOK_FIELDS, redis.hmget(job.key, _HOOK_FIELDS), strict=True) if v]
    if hooks:
        return f"the message sets RQ {', '.join(hooks)}, which kumiko never uses"
    return None


def _raw_text(raw: bytes | str) -> str:
    return raw.decode("utf-8", "backslashreplace") if isinstance(raw, bytes) else str(raw)


def _record(message: str, reason: str, job_id: str, queue: str) -> None:
    from .runner import reject

    try:
        reject(message, reason, job_id, queue)
    except Exception:
        # The history is down; the refusal still stands (and RQ's failed registry keeps it).
        logger.exception("could not record rejected message %s: %s", job_id, reason)


class _RefusesForeignMessages:
    """Checks every dequeued message before RQ prepares, forks or calls anything."""

    connection: Any

    def work(self, *args: Any, **kwargs: Any) -> bool:
        # Boot gates and boot jobs run once the worker is configured and before the first
        # message; a failing boot gate raises and the worker never starts.
        boot.on_worker_start()
        return bool(super().work(*args, **kwargs))  # type: ignore[misc]

    def execute_job(self, job: Any, queue: Any) -> None:
        reason = refusal(job, self.connection)
        if reason is None:
            super().execute_job(job, queue)  # type: ignore[misc]
            return
        _record(_raw_text(job.data), reason, job.id, queue.name)
        with self.connection.pipeline() as pipe:
            pipe.lrem(queue.intermediate_queue_key, 1, job.id)
            job.set_status("failed", pipeline=pipe)
            queue.failed_job_registry.add(
                job, ttl=job.failure_ttl, exc_string=reason, pipeline=pipe
            )
            pipe.execute()

    def dequeue_job_and_maintain_ttl(
        self, timeout: int | None, max_idle_time: int | None = None
    ) -> Any:
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
        key = queue.job_class.key_for(job_id)
        try:
            raw = repr(self.connection.hgetall(key))
        except Exception:
            raw = f"<a Redis {_raw_text(self.connection.type(key))} where a job hash belongs>"
        reason = f"RQ cannot load the job ({type(exc).__name__}: {exc})"
        _record(raw, reason, job_id, queue.name)
        with self.connection.pipeline() as pipe:
            pipe.lrem(queue.intermediate_queue_key, 1, job_id)
            pipe.delete(key)
            pipe.execute()


class Worker(_RefusesForeignMessages, SimpleWorkerBase):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **_json_only(kwargs))

    def execute_job(self, job: Any, queue: Any) -> None:
        try:
            super().execute_job(job, queue)
        finally:
            reset_connections()


class ForkingWorker(_RefusesForeignMessages, ForkingWorkerBase):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **_json_only(kwargs))

    def fork_work_horse(self, job: Any, queue: Any) -> None:
        connections.close_all()
        super().fork_work_horse(job, queue)

    def perform_job(self, job: Any, queue: Any, execution: Any) -> bool:
        try:
            return bool(super().perform_job(job, queue, execution))
        finally:
            if self.is_horse:
                telemetry_flush.flush()
                connections.close_all()
