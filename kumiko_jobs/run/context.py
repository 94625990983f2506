"""What a job sees: ``JobContext``, the ``ctx`` every job body receives as its first argument.

A thin face over the run's ``RunState`` (run/state.py): the run's identity, ``ctx.log``
(run/joblog.py), cancellation and deferral requests, follow-ups, and the escape hatches, which
open only through its methods so that each is declared, reported to the audit and bounded by
a ``with`` block.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

from django.db import connection as default_connection

from ..core import current
from ..core.exceptions import InvalidJob, JobCancelled
from ..core.grants import Grant
from ..enqueueing.followups import prepare_followup
from ..enqueueing.workflow_release import bounded_results
from ..guard.roles.connections import project_identity, read_identity, writer_identity
from ..history import audit, workflows
from ..history.run_reads import parse_id
from . import cancellation, progress
from .joblog import JobLog
from .state import Deferral, RunState

# EscapeHatchUse.actor: "user:<pk>" of the user a job acts as.
ACTOR_MAX_LENGTH = 100


class JobContext:
    """The first argument of every job."""

    def __init__(self, state: RunState, log_limit: int):
        env = state.envelope
        self._state = state
        self.tenant = state.tenant
        self.schema_name: str | None = env.schema
        self.job_name = env.job
        self.run_id = env.run_id
        self.attempt = env.attempt
        # Deferrals of this run so far (ctx.defer), for jobs that decide without a marker row.
        self.defers = env.defers
        self.final_attempt = state.final_attempt
        self.triggered_by = env.triggered_by
        self.correlation_id = env.correlation_id
        self.trigger_name = env.trigger
        self.log = JobLog(state.log, log_limit)

    @property
    def cancel_requested(self) -> bool:
        """True once an operator asked to cancel this running run (read from process memory:
        the worker's liveness beat brings the request, so checking costs no I/O)."""
        return cancellation.requested_by(self.run_id) is not None

    def check_cancelled(self) -> None:
        """Raise ``JobCancelled`` if an operator asked to cancel this run; call it between
        units of work. The run then ends ``cancelled`` and is not retried."""
        who = cancellation.requested_by(self.run_id)
        if who is not None:
            self._state.cancellation.acknowledge()
            raise JobCancelled(cancellation.message(who))

    @property
    def idempotency_key(self) -> str:
        """Stable across every attempt and deferral of this run."""
        return f"{self.job_name}:{self.run_id}"

    def defer(self, delay: timedelta | float) -> Deferral:
        """Ask to resume this run later: ``return ctx.defer(timedelta(seconds=30))``."""
        seconds = delay.total_seconds() if isinstance(delay, timedelta) else delay
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds <= 0:
            raise InvalidJob(f"ctx.defer() needs a positive delay, got {delay!r}.")
        return Deferral(float(seconds))

    def enqueue(self, job: Any, /, **kwargs: Any) -> Any:
        """Queue a follow-up in the same tenant, sent when this attempt succeeds."""
        if self._state.definition.atomic:
            # Follow-ups are history rows written after the atomic commit, on the project's
            # connection: a crash between the two would lose them (docs/reliability.md).
            raise InvalidJob(
                f"ctx.enqueue() in {self.job_name!r}: an atomic job cannot enqueue follow-ups "
                "(they would not commit with its transaction). Enqueue them from the code that "
                "enqueues this job, or make this job non-atomic."
            )

        return prepare_followup(self._state.followups, job, kwargs)

    def progress(self, fraction: float, message: str | None = None) -> None:
        """Say how far the run is: ``fraction`` from 0 to 1, and a short text (at most 200
        characters) for the admin. Cheap to call often: kept in memory, written on the run at
        most every ``PROGRESS_INTERVAL`` seconds and with its finish (run/progress.py)."""
        state = self._state
        env = state.envelope
        progress.report(state.progress, state.watch, env.run_id, env.attempt, fraction, message)

    def workflow_results(self, workflow_id: Any) -> dict[str, Any]:
        """A system step's fan-in from tenants' workflows: ``{key: result}`` of the steps of
        the workflow ``workflow_id`` (None for a step that did not succeed), whatever its
        tenant, at most ``MAX_RESULT_BYTES`` in all. Only for a system job that declares the
        ``cross_tenant_reads`` grant; reported to the audit like any use of it."""
        if not self._state.definition.system:
            raise InvalidJob(
                f"ctx.workflow_results() in {self.job_name!r}: reading workflows' results is a "
                "system job's fan-in (@job(system=True)). A tenant's step receives its own "
                "predecessors' results as workflow_results=."
            )
        self._require(Grant.CROSS_TENANT_READS)
        found = parse_id(workflow_id)
        if found is None:
            raise InvalidJob(f"ctx.workflow_results() takes a workflow id, got {workflow_id!r}.")
        audit.record_use(self._state, Grant.CROSS_TENANT_READS.value)
        with self._state.watch.stepped_aside():  # kumiko's own read of its tables
            _, rows = workflows.step_results(found)
        return bounded_results(rows)

    # --- escape hatches -------------------------------------------------------------------

    def _require(self, grant: Grant) -> None:
        if grant not in self._state.definition.grants:
            raise InvalidJob(
                f"Job {self.job_name!r} used ctx.{grant}() without declaring it. Add "
                f"escape_hatch=EscapeHatch(reason='why', grants=[{grant.value!r}]) to its @job."
            )

    @contextlib.contextmanager
    def _granted(self, grant: Grant) -> Iterator[None]:
        # SQL grants are reported by the guard when a statement actually needs them.
        self._require(grant)
        with self._state.watch.hatch(grant):
            yield

    def unsafe_raw(self) -> contextlib.AbstractContextManager[None]:
        """Allow SQL the guard cannot verify (DDL, COPY, SET, multi-statements)."""
        return self._granted(Grant.UNSAFE_RAW)

    @contextlib.contextmanager
    def global_writes(self) -> Iterator[None]:
        """Allow writes to shared (public) tables. With DB_ROLES the block logs in as the
        tenant's writer (its own privileges plus writes on the shared tables)."""
        with self._granted(Grant.GLOBAL_WRITES), writer_identity(self._state.watch):
            yield

    @contextlib.contextmanager
    def cross_tenant_reads(self, tenant: Any) -> Iterator[None]:
        """Read another tenant's schema, SELECT only, then come back."""
        watch = self._state.watch
        # django-tenants' wrapper (with DB_ROLES, the other tenant's role's, for the block)
        connection: Any = default_connection
        with self._granted(Grant.CROSS_TENANT_READS), read_identity(watch, tenant):
            previous = connection.tenant
            with watch.reading(tenant.schema_name):
                connection.set_tenant(tenant)
                try:
                    yield
                finally:
                    connection.set_tenant(previous)

    @contextlib.contextmanager
    def act_as(self, user: Any) -> Iterator[None]:
        """Make ``kumiko_jobs.current_user()`` return ``user`` for app code in this block."""
        with self._granted(Grant.SYSTEM_IDENTITY), current.acting_as(user):
            actor = audit.actor_of(self._state)
            if len(actor) > ACTOR_MAX_LENGTH:
                # The audit row's actor column holds this much; a longer one would make the
                # run's final history write fail and leave it running.
                raise InvalidJob(
                    f"ctx.act_as(): the user's id makes the actor {actor[:40]!r}... "
                    f"{len(actor)} characters long; the audit keeps at most "
                    f"{ACTOR_MAX_LENGTH}. Act as a user whose primary key is shorter."
                )
            # Reported after the switch, so that the audit's actor is the user acted as.
            audit.record_use(self._state, Grant.SYSTEM_IDENTITY.value)
            yield

    @contextlib.contextmanager
    def system_db(self) -> Iterator[None]:
        """System jobs only: the guard steps aside for this block."""
        if not self._state.definition.system:
            raise InvalidJob(
                "ctx.system_db() is for system jobs; declare @job(system=True) on "
                f"{self.job_name!r}."
            )
        watch = self._state.watch
        audit.record_use(self._state, "system_db")
        with project_identity(watch), watch.stepped_aside():
            yield
