"""``run_jobs()``: run what is enqueued, in-process, through the real pipeline.

``run_jobs()`` reads the runs that wait in the history (``JobRun`` rows in ``queued`` or
``deferred``) and runs each one as a worker would, through the same steps: the run's tenant,
the database guard, gates, retries and deferrals, the history records and their clean-up. It
reads rows, not queue messages, so it needs neither Redis nor a worker: an enqueue writes its
run's row in the caller's transaction at once, and that row is all ``run_jobs()`` needs, even
inside pytest-django's ``db`` fixture, whose transaction never commits (the on-commit push to
Redis never happens there, and nothing needs it to). A retry, a deferral and a follow-up are
rows too, so they run in the same call once they are due. Inside a caller's transaction under
``DB_ROLES`` the body runs as its tenant's role (``inline_roles``), as on a worker.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections, transaction
from django.db.models import Q
from django.utils import timezone

from ..core import conf, current
from ..core.exceptions import JobNotRegistered
from ..core.outcome import Outcome
from ..definition.job import JobDefinition
from ..definition.registry import registry
from ..enqueueing.messages import waiting_envelope
from ..guard.roles import connections as tenant_connections
from ..guard.roles import names as role_names
from ..guard.watch import watching
from ..models import JobRun, RunStatus
from ..run.pipeline import Next, compose
from ..run.state import Delivery, RunState, running
from .inline_roles import InlineRoles, role_of

WORKER_NAME = "kumiko_jobs.testing"
WAITING = (RunStatus.QUEUED, RunStatus.DEFERRED)


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
    names = None if jobs is None else {name_of(j) for j in jobs}
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


def name_of(job: JobDefinition | str) -> str:
    return job.name if isinstance(job, JobDefinition) else str(job)


def _horizon(include_scheduled: bool, until: datetime | timedelta | None) -> datetime | None:
    if include_scheduled:
        return None
    if isinstance(until, timedelta):
        return timezone.now() + until
    return until or timezone.now()


def _next_due(horizon: datetime | None, names: set[str] | None) -> JobRun | None:
    runs = JobRun.objects.filter(status__in=WAITING)
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
    if wrapper.in_atomic_block and env.schema and conf.get().DB_ROLES:
        _check_role(env.schema)  # a set-up mistake is the test's to see, not a failed run
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


def _check_role(schema: str) -> None:
    from django_tenants.utils import get_tenant_model  # a model: importable once apps loaded

    tenant = get_tenant_model().objects.filter(schema_name=schema).first()
    if tenant is not None:  # a tenant that is gone: the gates fail the run, as on a worker
        role_of(tenant)


def _run_pipeline(state: RunState) -> None:
    with running(state):
        _pipeline()(state)


def _savepoint_for_the_body(state: RunState, call_next: Next) -> None:
    """Inside a caller's transaction, the body runs in a savepoint (see ``run_jobs``), and
    under ``DB_ROLES`` as its tenant's role (``inline_roles``).

    A worker's job runs in autocommit: what it wrote before it raised stays written. The same
    here: the savepoint is released when the body raised a Python exception with the
    transaction still healthy, and rolled back only when an SQL statement failed (PostgreSQL
    then refuses every further statement in the transaction, the test's included); the role
    switch and any membership granted for it are undone either way.
    """
    conn: Any = connections[DEFAULT_DB_ALIAS]
    if not conn.in_atomic_block:
        call_next(state)
        return
    # Django 6.1 renamed savepoint() (5.2 has only the old name).
    create = getattr(transaction, "savepoint_create", None) or transaction.savepoint
    savepoint = create()
    roles = None
    if state.tenant is not None and conf.get().DB_ROLES:
        roles = InlineRoles(conn, state.tenant)
    token = tenant_connections.inline_roles.set(roles)
    try:
        with watching(state.watch):  # PostgreSQL's refusals are recorded on this run
            if roles is not None:
                state.watch.inline_role = True
                roles.enter(role_names.role_name(state.tenant.pk))
            call_next(state)
    except BaseException:
        if conn.needs_rollback or _aborted(conn):
            conn.needs_rollback = False
            transaction.savepoint_rollback(savepoint)
            if roles is not None:
                roles.leave()  # the rollback undid the switch; the cursors go back
        else:
            if roles is not None:
                roles.leave()
            transaction.savepoint_commit(savepoint)
        raise
    finally:
        tenant_connections.inline_roles.reset(token)
    if roles is not None:
        roles.leave()
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
        from ..run.entry import call_job
        from ..run.steps import DEFAULT_STEPS

        _built = compose((*DEFAULT_STEPS, _savepoint_for_the_body), call_job)
    return _built
