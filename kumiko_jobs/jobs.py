"""kumiko_jobs' own housekeeping, as system cron jobs (``KUMIKO_JOBS["HOUSEKEEPING"]``).

The same work as ``manage.py kumiko_jobs sweep``, scheduled by rq-scheduler like any cron job,
so a project that runs ``rqscheduler`` needs nothing else to keep runs from staying
``running`` and history from growing without bound.
"""

from __future__ import annotations

from typing import Any

from . import bulk
from .core import conf
from .enqueueing.api import job
from .task_jobs import register_task_jobs
from .worker.sweep import delete_expired, sweep_abandoned

if conf.get().HOUSEKEEPING:

    @job(name="kumiko_jobs.sweep_abandoned", system=True, cron="* * * * *")
    def sweep_abandoned_runs(ctx: Any) -> None:
        """Retry or fail runs whose worker died."""
        with ctx.system_db():
            retried, failed = sweep_abandoned()
        if retried or failed:
            ctx.log.warning("abandoned runs", retried=retried, failed=failed)

    @job(name="kumiko_jobs.delete_expired", system=True, cron="30 3 * * *")
    def delete_expired_history(ctx: Any) -> None:
        """Delete finished runs older than RETENTION_DAYS."""
        with ctx.system_db():
            runs, rejections = delete_expired()
        ctx.log.info("expired history deleted", runs=runs, rejected_messages=rejections)


@job(name=bulk.BATCH_JOB, system=True, retries=5)
def bulk_batch(ctx: Any, *, operation_id: str) -> None:
    """One batch of an operator's bulk retry or cancel (kumiko_jobs/bulk.py); enqueues the next."""
    with ctx.system_db():
        more = bulk.run_batch(operation_id)
    ctx.log.info("bulk batch", operation_id=operation_id, more=more)


# The kumiko jobs that run Django tasks (kumiko_jobs.tasks.KumikoBackend in settings.TASKS),
# registered with the other jobs at start-up so that every worker knows them.
register_task_jobs()
