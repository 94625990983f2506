"""What an enqueue returns (``RunHandle``), and how a job named by the caller is found.

Its own module because every way in hands one back (``enqueue``, ``emit``, follow-ups, the
operator API, the testing helpers) and the handle reads the run's history row on ``refresh``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from asgiref.sync import sync_to_async

from ..core import conf
from ..core.exceptions import InvalidJob, KumikoJobsError
from ..definition.job import JobDefinition
from ..definition.registry import registry
from ..history import run_reads
from ..models import FINISHED_STATUSES, REFUSED_STATUSES, JobRun, RunStatus
from . import waiting


@dataclass(frozen=True, slots=True)
class RunHandle:
    """What an enqueue returns: the run's id and where it will run.

    ``status``, ``scheduled_for`` and ``result`` are what was known when the handle was made
    (or last refreshed); ``refresh()`` reads the run's history row again and updates them.
    """

    run_id: str
    job_name: str
    schema_name: str | None
    status: str = RunStatus.QUEUED
    scheduled_for: datetime | None = None
    # What the job returned, once the run succeeded (see kumiko_jobs.results for the marker
    # stored instead of a result that could not be kept). None before that.
    result: Any = None
    # A unique job's enqueue that matched an existing run (@job(unique=...)): this handle is
    # that run's, and no new run was made.
    deduplicated: bool = False

    @property
    def skipped(self) -> bool:
        """Refused by ``concurrency="skip"``: a run of this job was already active."""
        return self.status == RunStatus.SKIPPED

    @property
    def capped(self) -> bool:
        """Refused by ``max_per_tenant``: the job's active runs had reached the cap."""
        return self.status == RunStatus.CAPPED

    @property
    def admitted(self) -> bool:
        """False when the job's concurrency options refused the enqueue (skipped or capped)."""
        return self.status not in REFUSED_STATUSES

    @property
    def finished(self) -> bool:
        """The run has ended: succeeded, failed or cancelled (as of the last refresh)."""
        return self.status in (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED)

    def refresh(self) -> JobRun:
        """Read the run's history row: updates ``status``, ``scheduled_for`` and ``result``,
        and returns the row (``JobRun``) for everything else.

        From a tenant's context (its request, ``tenant_context()``, one of its runs) only that
        tenant's runs are read: another tenant's run raises ``JobRun.DoesNotExist``, as an id no
        run has does (``history.run_reads``). Operators and system runs read any run."""
        if not self.run_id:
            raise InvalidJob("This enqueue was skipped (concurrency/max_per_tenant): no run.")
        row = run_reads.load_run(self.run_id)
        if row is None:
            raise JobRun.DoesNotExist(f"No run {self.run_id} in this tenant.")
        # A frozen dataclass, so handles stay hashable; the refresh is its one mutation.
        object.__setattr__(self, "status", row.status)
        object.__setattr__(self, "scheduled_for", row.scheduled_for)
        object.__setattr__(self, "result", row.result)
        return row

    async def arefresh(self) -> JobRun:
        """``refresh()`` for async code."""
        return await sync_to_async(self.refresh)()

    def wait(self, timeout: float) -> RunHandle:
        """Block until the run is final (succeeded, failed, cancelled), at most ``timeout``
        seconds (``WaitTimeout`` then); returns this handle, refreshed: ``status``, ``result``.
        Without polling (``enqueueing/waiting``); as ``refresh``, only the caller's tenant's
        run (another's raises ``JobRun.DoesNotExist`` at once)."""
        waiting.wait(self.run_id, self._queue(), timeout, self._final_now, self._what())
        return self

    async def await_result(self, timeout: float) -> RunHandle:
        """``wait()`` for async code: ``handle = await handle.await_result(30)``."""
        queue = await sync_to_async(self._queue)()
        await waiting.await_(self.run_id, queue, timeout, self._final_now, self._what())
        return self

    def _final_now(self) -> bool:
        return self.refresh().status in FINISHED_STATUSES

    def _queue(self) -> str:
        """The run's queue (its worker signals on that queue's Redis), from its definition."""
        try:
            return registry.get(self.job_name).queue_name
        except KumikoJobsError:
            return conf.get().DEFAULT_QUEUE

    def _what(self) -> str:
        return f"Run {self.run_id} of {self.job_name}"


def existing_handle(run: JobRun) -> RunHandle:
    """The handle of an existing run that a unique job's enqueue (one or many) returns instead
    of a new one."""
    return RunHandle(
        run_id=run.run_id.hex,
        job_name=run.job_name,
        schema_name=run.schema_name or None,
        status=run.status,
        scheduled_for=run.scheduled_for,
        deduplicated=True,
    )


def resolve(job: JobDefinition | str) -> JobDefinition:
    """The definition of ``job`` (a definition, or a registered job's name); ``InvalidJob`` for
    anything else, ``JobNotRegistered`` for an unknown name."""
    if isinstance(job, JobDefinition):
        return job
    if isinstance(job, str):
        return registry.get(job)
    raise InvalidJob(f"enqueue() takes a job or a job name, got {job!r}.")
