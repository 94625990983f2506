"""``KumikoJobs``, what the ``kumiko_jobs`` fixture gives a test: run what is enqueued, and
assert on runs."""

from __future__ import annotations

from typing import Any

from ..definition.job import JobDefinition
from ..enqueueing.handle import RunHandle
from ..models import JobRun, RunStatus
from .pushes import Pushes
from .runs import WAITING, Ran, name_of, run_jobs


class KumikoJobs:
    """The ``kumiko_jobs`` fixture: run what is enqueued, and assert on runs."""

    def __init__(self, pushes: Pushes) -> None:
        self.pushes = pushes

    def run(self, **options: Any) -> list[Ran]:
        """``run_jobs(**options)``."""
        return run_jobs(**options)

    def runs(
        self,
        job: JobDefinition | str | None = None,
        *,
        tenant: Any = None,
        status: str | None = None,
    ) -> list[JobRun]:
        """Runs in the history (oldest first), by job, tenant (a tenant or schema name) and
        status."""
        runs = JobRun.objects.order_by("queued_at")
        if job is not None:
            runs = runs.filter(job_name=name_of(job))
        if tenant is not None:
            runs = runs.filter(schema_name=getattr(tenant, "schema_name", tenant))
        if status is not None:
            runs = runs.filter(status=status)
        return list(runs)

    def assert_enqueued(
        self,
        job: JobDefinition | str,
        *,
        tenant: Any = None,
        count: int | None = None,
        **kwargs: Any,
    ) -> list[JobRun]:
        """Runs of ``job`` waiting to run whose arguments include ``kwargs``; at least one
        (or exactly ``count``)."""
        waiting = [
            run
            for run in self.runs(job, tenant=tenant)
            if run.status in WAITING
            and all(run.payload.get(key) == value for key, value in kwargs.items())
        ]
        described = f"{name_of(job)}" + (f" with {kwargs}" if kwargs else "")
        if count is None:
            assert waiting, f"no waiting run of {described}; runs: {self._summary()}"
        else:
            assert len(waiting) == count, (
                f"{len(waiting)} waiting runs of {described}, expected {count}; "
                f"runs: {self._summary()}"
            )
        return waiting

    def assert_nothing_enqueued(self) -> None:
        """Assert that no run is waiting (queued or deferred), naming the ones that are when it
        fails.
        """
        waiting = [run for run in self.runs() if run.status in WAITING]
        assert not waiting, f"runs are waiting: {self._summary(waiting)}"

    def assert_succeeded(self, handle: RunHandle) -> Any:
        """The run succeeded; returns its result."""
        run = handle.refresh()
        assert run.status == RunStatus.SUCCEEDED, (
            f"run {handle.run_id} of {handle.job_name} is {run.status}: "
            f"{run.error_type}: {run.error_message}"
        )
        return handle.result

    def assert_failed(self, handle: RunHandle, error_type: str | None = None) -> JobRun:
        """Assert that the run failed (with ``error_type``, when given), and return its row for
        further checks.
        """
        run = handle.refresh()
        assert run.status == RunStatus.FAILED, f"run {handle.run_id} is {run.status}"
        if error_type is not None:
            assert run.error_type == error_type, f"{run.error_type}: {run.error_message}"
        return run

    def _summary(self, runs: list[JobRun] | None = None) -> str:
        rows = self.runs() if runs is None else runs
        return ", ".join(f"{r.job_name}[{r.schema_name or 'system'}]={r.status}" for r in rows)
