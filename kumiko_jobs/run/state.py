"""What the runner's steps share about one execution (``RunState``) and which run is current.

``RunState`` is made of parts, each with one writer, so that a reader knows where a value
comes from: the ``Delivery`` (envelope, definition, RQ id, queue, worker: frozen, set once by
whoever starts the run; ``state.envelope`` and ``state.definition`` read it), the ``Ending``
(outcome, error, deferral, next message: the steps that decide it), the ``Tenancy`` (the
records step's tenant lookup, the gates step's subject; the tenant is on the ``Watch``), the
``Timing`` (records), the ``Cancellation`` (``ctx.check_cancelled()``), the ``Atomicity``
(the atomic step), the ``Alarm`` (the worker's timeout), the kept ``ctx.log`` lines
(run/joblog), the guard's ``Watch`` (guard/watch), the audit's uses (history/audit) and the
follow-up batch (enqueueing/followups). ``current_run`` says which run this thread executes,
for the run side and above (the worker's timeout, the Django tasks backend)."""

from __future__ import annotations

import contextlib
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ..core import current
from ..core.grants import Grant
from ..core.outcome import DeferralKind, Outcome
from ..enqueueing.followups import FollowupBatch, collecting
from ..enqueueing.workflow_release import WorkflowLink
from ..guard.watch import Watch, watching
from ..history import audit
from .joblog import AttemptLog
from .progress import Progress
from .rendered_errors import RenderedError, render_error

if TYPE_CHECKING:
    from ..core.envelope import Envelope
    from ..definition.job import JobDefinition

# The run executing in this thread, for the run side and above (the guard, the worker's timeout,
# the Django tasks backend). Modules below the run side read core.current.current_envelope.
current_run: ContextVar[RunState | None] = ContextVar("kumiko_jobs_current_run", default=None)


@contextlib.contextmanager
def running(state: RunState) -> Iterator[None]:
    """``state`` is the current run inside the block: ``current_run``, the context variables
    of core.current, its follow-up batch and its Watch (runner.run_state and testing run the
    pipeline in it). When the block ends the run has ended: the Watch says so to any thread that
    still carries the run's context."""
    token = current_run.set(state)
    watch = state.watch
    watch.thread = threading.get_ident()
    try:
        # The run's Watch is current for the whole run, not only the body: a connection made
        # from the run's context in another thread, or after the run, is refused by it.
        with current.running(state.envelope), collecting(state.followups), watching(watch):
            yield
    finally:
        watch.ended = True
        current_run.reset(token)


@dataclass(frozen=True, slots=True)
class Deferral:
    """Returned by ``ctx.defer``; the job returns it to ask for a later resumption."""

    seconds: float


@dataclass(frozen=True, slots=True)
class Delivery:
    """The message being run and where it came from: set once by whoever starts the run (the
    runner, the boot gates, ``testing.run_jobs``), read by the steps, never changed.

    ``rq_job_id`` and ``queue`` are the RQ job's (the history's ``rq_job_id``, the span's
    destination, a refusal's record), ``worker_name`` the worker's (the attempt's ``worker``).
    """

    envelope: Envelope
    definition: JobDefinition
    rq_job_id: str = ""
    queue: str = ""
    worker_name: str = ""
    # Run inline inside the caller's open transaction (``testing.run_jobs`` in pytest-django's
    # ``db`` fixture): the body must see that transaction's rows, so it runs on the caller's
    # connection as the project user (no tenant login). Set here, by whoever starts the run,
    # and never read from a context variable that job code could set for later runs.
    in_callers_transaction: bool = False
    # An ``atomic=True`` run's secret for this delivery: the records step writes its hash on
    # the run's row with the start, the atomic step hands it to the success function, which
    # refuses without it (history/atomic_sql.py, ``atomic_digest``). Only this process holds it.
    atomic_secret: str = field(default_factory=lambda: secrets.token_hex(32), repr=False)


@dataclass(slots=True)
class Ending:
    """How the attempt ends: its part of ``RunState``, written only through the methods below.

    Each method is one outcome and sets the fields that go with it together: a retry carries its
    next message, a drop its reason, a cancellation no failure key and no next message. The
    steps that decide (the runner's body, gates, fan-out, deferral, records) call them; the
    records step, the report, the span and the tests' ``Ran`` only read. ``outcome`` is None
    until a step decides (the records step then writes ``failed``).
    """

    outcome: Outcome | None = None
    error: BaseException | None = None
    # The job body's exception, rendered inside the guarded tenant context (db_guard step).
    rendered_error: RenderedError | None = None
    error_traceback: str = ""
    # The message key of the failure the tenant sees (JobFailure), if any.
    failure_key: str | None = None
    result: Any = None
    drop_reason: str = ""
    # A deferred attempt: how long, and whether the job or a gate asked.
    deferral_seconds: float | None = None
    deferral_kind: DeferralKind = DeferralKind.JOB
    # (envelope, delay in seconds) to push once the history is written
    reschedule: tuple[Envelope, float] | None = None
    superseded: bool = False  # the history refused the outcome (``supersede``)

    def supersede(self) -> None:
        """The run stopped being this attempt's before the records step wrote its outcome: the
        outcome stays for the log, and nothing of it is pushed or signalled (``run.entry``)."""
        self.superseded, self.reschedule = True, None

    def succeed(self, result: Any = None) -> None:
        """The body (or the fan-out) returned ``result``, already made storable; or an atomic
        attempt taken for a failure had committed after all (records step): no error, no next."""
        self.outcome, self.result, self.reschedule = Outcome.SUCCEEDED, result, None
        self.error = self.rendered_error = self.failure_key = None
        self.error_traceback = ""

    def defer(self, seconds: float, kind: DeferralKind) -> None:
        """Postponed by the job (``ctx.defer``) or a gate; the deferral step schedules it."""
        self.outcome, self.deferral_seconds, self.deferral_kind = Outcome.DEFERRED, seconds, kind

    def resume_in(self, envelope: Envelope) -> None:
        """The deferred run resumes as ``envelope`` after the deferral's seconds."""
        self.reschedule = (envelope, self.deferral_seconds or 0.0)

    def drop(self, reason: str) -> None:
        """Not run: a message the run does not wait for, or an inactive tenant's."""
        self.outcome, self.drop_reason = Outcome.DROPPED, reason

    def fail(self, error: BaseException | None = None, *, traceback: str | None = None) -> None:
        """Failed for good (no next message); ``error`` replaces the one noted, if given."""
        self.outcome, self.reschedule = Outcome.FAILED, None
        if error is not None:
            self.error = error
        if traceback is not None:
            self.error_traceback = traceback

    def retry(
        self, error: BaseException, traceback: str, next_attempt: Envelope, delay: float
    ) -> None:
        """Failed with attempts left: ``next_attempt`` is pushed after ``delay`` seconds."""
        self.outcome, self.error, self.error_traceback = Outcome.RETRYING, error, traceback
        self.reschedule = (next_attempt, delay)

    def cancel(self, error: BaseException | None) -> None:
        """Cancelled on an operator's request: not retried, not resumed, no tenant failure.
        ``error`` (None: keep the job's own ``JobCancelled``) replaces the recorded one."""
        if error is not None:
            self.error, self.error_traceback, self.rendered_error = error, "", None
        self.outcome, self.reschedule, self.failure_key = Outcome.CANCELLED, None, None

    def show_tenant(self, message_key: str) -> None:
        """The failure the tenant sees is ``message_key`` (written as a JobFailure)."""
        self.failure_key = message_key

    def note_rendered(self, rendered: RenderedError) -> None:
        """The body's exception, rendered where it was raised (db_guard step)."""
        self.rendered_error = rendered

    def described_error(self) -> RenderedError | None:
        """``error`` as text (None: no error); see ``rendering_of``."""
        return None if self.error is None else self.rendering_of(self.error)

    def rendering_of(self, error: BaseException) -> RenderedError:
        """``error`` as text: the job's exception as the db_guard step rendered it, or one of
        kumiko's own exceptions (gates, deferral), which are safe to render anywhere."""
        rendered = self.rendered_error
        if rendered is not None and rendered.error is error:
            return rendered
        return render_error(error)


@dataclass(frozen=True, slots=True)
class Found:
    """The records step found the message's tenant with the run's start."""

    tenant: Any


@dataclass(frozen=True, slots=True)
class Missing:
    """The records step looked, and no tenant has the message's schema."""

    tenant: None = None


# What the records step learnt of the tenant; the gates step decides what a missing tenant means.
TenantLookup = Found | Missing


@dataclass(slots=True)
class Tenancy:
    """Whose run this is, as far as the history needs it; the tenant itself is on the guard's
    ``Watch`` (``RunState.tenant``), which the gates step sets from ``lookup``.

    Each field has one writer: ``lookup`` the records step (the tenant loaded with the run's
    start; None: it did not look, e.g. a pipeline without that step), ``subject`` the gates
    step (what the run is about, for ``JobFailure`` rows and the fan-out's children).
    """

    lookup: TenantLookup | None = None
    subject: str = ""


@dataclass(slots=True)
class Timing:
    """When the attempt started (the records step's part): the wall clock for the history,
    the monotonic clock for its duration."""

    started_at: datetime | None = None
    started_monotonic: float = field(default_factory=time.monotonic)


@dataclass(slots=True)
class Alarm:
    """The attempt's timeout (the worker's death penalty writes it, the body reads it).

    Once ``fired`` (its seconds) the attempt is timed out, whatever the job's code catches or
    returns (runner._final_timeout). ``hooks`` are called, in the run's thread, from the
    alarm's signal handler when it fires: an async body registers the cancellation of its
    coroutine there (async_body.call_async).
    """

    fired: int | None = None
    hooks: list[Callable[[], None]] = field(default_factory=list)

    def note_timeout(self, seconds: int) -> None:
        """The attempt's timeout fired: from now on it is timed out."""
        self.fired = seconds
        for hook in list(self.hooks):
            hook()


@dataclass(slots=True)
class Cancellation:
    """Whether the job acknowledged an operator's cancellation: ``ctx.check_cancelled()`` raised
    ``JobCancelled`` (its only writer), and the deferral step then ends the run cancelled
    whatever the body did after catching it (``settle_cancellation``). The request itself is in
    process memory (run/cancellation), brought by the worker's beat.
    """

    acknowledged: bool = False

    def acknowledge(self) -> None:
        """The job saw the request (``ctx.check_cancelled()`` is raising ``JobCancelled``)."""
        self.acknowledged = True


@dataclass(slots=True)
class Atomicity:
    """An ``atomic=True`` run's transaction (the atomic step's part; the records step settles
    ``in_doubt``). ``committed`` once the body's writes and the success (with a ``riding_end``,
    its finish too) committed together; ``in_doubt`` while nobody knows: its COMMIT met a lost
    connection, and the server may have committed it (the records step asks the run's row)."""

    committed: bool = False
    in_doubt: bool = False
    riding_end: Any = None  # the attempt's end the success function wrote (0029), or None

    def note_committed(self, committed: bool = True) -> None:
        """Whether the transaction holding the body's writes and the success committed."""
        self.committed, self.in_doubt = committed, False

    def note_in_doubt(self) -> None:
        """The COMMIT was sent and its reply lost: committed or not, the row says."""
        self.in_doubt = True


@dataclass(slots=True)
class RunState:
    """Mutable state of one execution, shared by the pipeline's steps (parts: module docstring)."""

    delivery: Delivery
    tenancy: Tenancy = field(default_factory=Tenancy)
    timing: Timing = field(default_factory=Timing)
    ending: Ending = field(default_factory=Ending)
    cancellation: Cancellation = field(default_factory=Cancellation)
    atomicity: Atomicity = field(default_factory=Atomicity)
    # What the attempt enqueued (enqueue.followups), sent if it succeeds; made from the envelope.
    followups: FollowupBatch = field(init=False)
    log: AttemptLog = field(default_factory=AttemptLog)
    # The escape-hatch uses the run reported (audit.record_use), made from the definition.
    audit_uses: audit.AuditUses = field(init=False)
    alarm: Alarm = field(default_factory=Alarm)
    # The workflow the run is a step of (set by records from its start statement) and the
    # steps its finish released, pushed by the runner's dispatch (enqueueing/workflow_release).
    workflow: WorkflowLink = field(default_factory=WorkflowLink)
    # The job's last ctx.progress() and whether the row has it (run/progress).
    progress: Progress = field(default_factory=Progress)
    # The guard's part: grants open, violations, session marks, the installed guard, the
    # body's database identity (guard_watch). Built from the envelope and the definition.
    watch: Watch = field(init=False)

    def __post_init__(self) -> None:
        env, definition = self.envelope, self.definition
        self.watch = Watch(
            job=env.job,
            schema=env.schema,
            origin=env.origin,
            # The definition keeps the user's words (validated); the guard speaks Grant.
            declared_grants=frozenset(Grant(g) for g in definition.grants),
            system=definition.system,
            atomic=definition.atomic,
            in_callers_transaction=self.delivery.in_callers_transaction,
        )
        self.followups = FollowupBatch(parent=env)
        hatch = definition.escape_hatch
        self.audit_uses = audit.AuditUses(
            reason=hatch.reason if hatch else "system job", system=definition.system
        )

    @classmethod
    def new(cls, envelope: Envelope, definition: JobDefinition, *, tenant: Any = None) -> RunState:
        """A run of ``definition`` for ``envelope``, as the gates step leaves it when ``tenant``
        is given: for tests and benchmarks that drive one step (the guard, the audit) alone."""
        state = cls(Delivery(envelope, definition))
        state.tenant = tenant
        return state

    @property
    def envelope(self) -> Envelope:
        """The message being run (the delivery's; read-only, as the whole delivery is)."""
        return self.delivery.envelope

    @property
    def definition(self) -> JobDefinition:
        """The job the message names, from this worker's registry (the delivery's)."""
        return self.delivery.definition

    @property
    def tenant(self) -> Any:
        """The run's tenant (None: a system run); kept on the Watch, which the guard reads.
        Set by the gates step."""
        return self.watch.tenant

    @tenant.setter
    def tenant(self, tenant: Any) -> None:
        """Set by the gates step; on the Watch, so the guard checks against the tenant entered."""
        self.watch.tenant = tenant

    def note_timeout(self, seconds: int) -> None:
        """The attempt's timeout fired (the worker's death penalty calls this on the current
        run): the alarm's part records it and cancels what registered."""
        self.alarm.note_timeout(seconds)

    @property
    def final_attempt(self) -> bool:
        """No retry follows this attempt, whatever happens (``retries`` used up)."""
        return self.envelope.attempt >= self.max_attempts

    @property
    def max_attempts(self) -> int:
        """The job's attempts in all: its first plus ``retries``."""
        return self.definition.max_attempts
