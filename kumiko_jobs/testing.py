"""Test your own jobs: run what is enqueued, in-process, through the real pipeline.

``run_jobs()`` reads the runs that wait in the history (``JobRun`` rows in ``queued`` or
``deferred``) and runs each one as a worker would, through the same steps: the run's tenant,
the database guard, gates, retries and deferrals, the history records and their clean-up. It
reads rows, not queue messages, so it needs neither Redis nor a worker: an enqueue writes its
run's row in the caller's transaction at once, and that row is all ``run_jobs()`` needs, even
inside pytest-django's ``db`` fixture, whose transaction never commits (the on-commit push to
Redis never happens there, and nothing needs it to). A retry, a deferral and a follow-up are
rows too, so they run in the same call once they are due.

Use it as a pytest plugin (``pytest_plugins = ["kumiko_jobs.testing"]`` in your
``conftest.py``) for the ``kumiko_jobs`` fixture, or call ``run_jobs()`` directly. The
``kumiko_jobs`` fixture also keeps every push away from Redis (``captured_pushes``), so a
``transaction=True`` test, whose enqueues really commit, needs no Redis either.
docs/testing.md has the details and a worked example.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import DEFAULT_DB_ALIAS, connections, transaction
from django.db.models import Q
from django.utils import timezone

from . import transport
from .core import current
from .core.exceptions import JobNotRegistered
from .core.outcome import Outcome
from .definition.job import JobDefinition
from .definition.registry import registry
from .enqueueing.handle import RunHandle
from .enqueueing.messages import waiting_envelope
from .models import JobRun, RunStatus
from .run.pipeline import Next, compose
from .run.state import Delivery, RunState, running
from .transport import pushing as transport_pushing

WORKER_NAME = "kumiko_jobs.testing"
_WAITING = (RunStatus.QUEUED, RunStatus.DEFERRED)


@dataclass(frozen=True, slots=True)
class Ran:
    """One attempt (or resumption) that ``run_jobs()`` ran."""

    run_id: str
    job_name: str
    schema_name: str | None
    attempt: int
    # "succeeded", "failed", "retrying", "deferred" or "dropped" (as JobAttempt.outcome)
    outcome: str
    error: BaseException | None = None
    result: Any = None


class TooManyRuns(AssertionError):
    """``run_jobs()`` hit ``max_runs``: a job that re-enqueues or defers without end."""


def run_jobs(
    *,
    include_scheduled: bool = False,
    until: datetime | timedelta | None = None,
    max_runs: int = 1000,
    jobs: Iterable[JobDefinition | str] | None = None,
) -> list[Ran]:
    """Run every waiting run that is due, and what those runs start, until none is left.

    Due means ``scheduled_for`` is empty or not after now. ``until`` moves the clock: runs due
    up to that time (a datetime, or a timedelta from now) run too; ``include_scheduled=True``
    runs everything waiting whatever its due time (retries with a backoff, ``ctx.defer()``,
    ``enqueue_in``). ``jobs`` limits it to some jobs. Returns the attempts in the order run.

    Differences from a worker, all deliberate: no timeout alarm (a timeout is the worker's
    signal; test it with a real worker), no rate limits or queue order, and inside a
    transaction that is not the run's (the ``db`` fixture's), each job body runs in a
    savepoint: a body that failed on an SQL error has its writes rolled back (a worker would
    keep those before the failing statement), so that the test's transaction stays usable.
    """
    horizon = _horizon(include_scheduled, until)
    names = None if jobs is None else {_name(j) for j in jobs}
    ran: list[Ran] = []
    while True:
        row = _next_due(horizon, names)
        if row is None:
            return ran
        if len(ran) >= max_runs:
            raise TooManyRuns(
                f"run_jobs() ran {max_runs} attempts and runs are still waiting (next: "
                f"{row.job_name} {row.run_id}); a job that enqueues or defers without end? "
                "Pass max_runs= to allow more."
            )
        ran.append(_run(row))


def _name(job: JobDefinition | str) -> str:
    return job.name if isinstance(job, JobDefinition) else str(job)


def _horizon(include_scheduled: bool, until: datetime | timedelta | None) -> datetime | None:
    if include_scheduled:
        return None
    if isinstance(until, timedelta):
        return timezone.now() + until
    return until or timezone.now()


def _next_due(horizon: datetime | None, names: set[str] | None) -> JobRun | None:
    runs = JobRun.objects.filter(status__in=_WAITING)
    if names is not None:
        runs = runs.filter(job_name__in=names)
    if horizon is not None:
        # Re-read "now" each time: a retry with no backoff is due as soon as it is written.
        runs = runs.filter(
            Q(scheduled_for__isnull=True) | Q(scheduled_for__lte=max(horizon, timezone.now()))
        )
    return runs.order_by("scheduled_for", "queued_at").first()


def _run(row: JobRun) -> Ran:
    try:
        definition = registry.get(row.job_name)
    except JobNotRegistered as exc:
        raise AssertionError(f"run {row.run_id} waits for {row.job_name!r}: {exc}") from None
    env = waiting_envelope(row)
    wrapper: Any = connections[DEFAULT_DB_ALIAS]
    delivery = Delivery(
        envelope=env,
        definition=definition,
        rq_job_id=env.rq_job_id,
        queue=definition.queue_name,
        worker_name=WORKER_NAME,
        in_callers_transaction=wrapper.in_atomic_block,
    )
    state = RunState(delivery)
    tenant_before = getattr(wrapper, "tenant", None)
    try:
        # What runner.run_state does, minus the push of the next message (the next attempt
        # is a row, which the next round finds), in a fresh context as there.
        # A job's exception ends in its outcome (the retry step); what still raises here
        # (a history write that failed, a timeout outside the body) is the test's to see.
        current.attempt_context().run(_run_pipeline, state)
    finally:
        if tenant_before is not None and hasattr(wrapper, "set_tenant"):
            # The run ends on public; a test inside a tenant (TenantTestCase) stays there.
            wrapper.set_tenant(tenant_before)
    return Ran(
        run_id=env.run_id,
        job_name=env.job,
        schema_name=env.schema,
        attempt=env.attempt,
        outcome=str(state.ending.outcome or Outcome.FAILED),
        error=state.ending.error,
        result=state.ending.result if state.ending.outcome is Outcome.SUCCEEDED else None,
    )


def _run_pipeline(state: RunState) -> None:
    with running(state):
        _pipeline()(state)


def _savepoint_for_the_body(state: RunState, call_next: Next) -> None:
    """Inside a caller's transaction, the body runs in a savepoint (see ``run_jobs``).

    A worker's job runs in autocommit: what it wrote before it raised stays written. The same
    here: the savepoint is released when the body raised a Python exception with the
    transaction still healthy, and rolled back only when an SQL statement failed (PostgreSQL
    then refuses every further statement in the transaction, the test's included).
    """
    conn: Any = connections[DEFAULT_DB_ALIAS]
    if not conn.in_atomic_block:
        call_next(state)
        return
    # Django 6.1 renamed savepoint() (5.2 has only the old name).
    create = getattr(transaction, "savepoint_create", None) or transaction.savepoint
    savepoint = create()
    try:
        call_next(state)
    except BaseException:
        if conn.needs_rollback or _aborted(conn):
            conn.needs_rollback = False
            transaction.savepoint_rollback(savepoint)
        else:
            transaction.savepoint_commit(savepoint)
        raise
    transaction.savepoint_commit(savepoint)


def _aborted(conn: Any) -> bool:
    from psycopg.pq import TransactionStatus

    raw = conn.connection
    return raw is not None and raw.info.transaction_status == TransactionStatus.INERROR


_built: Next | None = None


def _pipeline() -> Next:
    global _built
    if _built is None:
        # Imported at the first run: pytest loads this plugin before Django is set up, and the
        # run side imports the models.
        from .run.entry import call_job
        from .run.steps import DEFAULT_STEPS

        _built = compose((*DEFAULT_STEPS, _savepoint_for_the_body), call_job)
    return _built


# --- pushes ------------------------------------------------------------------------------


@dataclass
class Pushes:
    """Messages that would have gone to Redis: (job name, schema, run id, delay)."""

    messages: list[transport.Message] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.messages)


@contextlib.contextmanager
def captured_pushes() -> Iterator[Pushes]:
    """Keep every push to Redis (an enqueue's on-commit push, a follow-up's, the relay's)
    in a list instead: the history rows are what ``run_jobs()`` runs."""
    pushes = Pushes()

    def push(message: transport.Message) -> None:
        pushes.messages.append(message)

    def push_many(messages: Iterable[transport.Message]) -> None:
        pushes.messages.extend(messages)

    # The face (what the enqueue side, the run side and the relay call) and the module that
    # defines them (what the scheduler's cron firing calls).
    saved = (transport.push, transport.push_many)
    saved_here = (transport_pushing.push, transport_pushing.push_many)
    transport.push, transport.push_many = push, push_many
    transport_pushing.push, transport_pushing.push_many = push, push_many
    try:
        yield pushes
    finally:
        transport.push, transport.push_many = saved
        transport_pushing.push, transport_pushing.push_many = saved_here


# --- assertions --------------------------------------------------------------------------


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
            runs = runs.filter(job_name=_name(job))
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
            if run.status in _WAITING
            and all(run.payload.get(key) == value for key, value in kwargs.items())
        ]
        described = f"{_name(job)}" + (f" with {kwargs}" if kwargs else "")
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
        waiting = [run for run in self.runs() if run.status in _WAITING]
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


@pytest.fixture
def kumiko_jobs() -> Iterator[KumikoJobs]:
    """Run and inspect jobs in a test with a database (``db`` or ``transactional_db``):
    pushes are captured, never sent to Redis."""
    with captured_pushes() as pushes:
        yield KumikoJobs(pushes)
