"""What a job sees (``JobContext``) and what the runner's steps share (``RunState``)."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from ..core import current
from ..core.exceptions import InvalidJob, JobCancelled
from ..core.grants import Grant
from ..core.scrubbing import MASK, is_sensitive_key, scrub
from ..enqueueing.followups import FollowupBatch, collecting, prepare_followup
from ..guard.watch import Watch
from ..history import audit
from . import cancellation

if TYPE_CHECKING:
    from ..core.envelope import Envelope
    from ..definition.job import JobDefinition

logger = logging.getLogger("kumiko_jobs.job")

# EscapeHatchUse.actor: "user:<pk>" of the user a job acts as.
ACTOR_MAX_LENGTH = 100

# The run executing in this thread, for the run side and above (the guard, the worker's timeout,
# the Django tasks backend). Modules below the run side read core.current.current_envelope.
current_run: ContextVar[RunState | None] = ContextVar("kumiko_jobs_current_run", default=None)


@contextlib.contextmanager
def running(state: RunState) -> Iterator[None]:
    """``state`` is the current run inside the block: ``current_run``, the context variables
    of core.current, and its follow-up batch (runner.run_state and testing run the pipeline
    in it)."""
    token = current_run.set(state)
    try:
        with current.running(state.envelope), collecting(state.followups):
            yield
    finally:
        current_run.reset(token)


@dataclass(frozen=True, slots=True)
class Deferral:
    """Returned by ``ctx.defer``; the job returns it to ask for a later resumption."""

    seconds: float


@dataclass(frozen=True, slots=True)
class RenderedError:
    """An exception of the job body, turned into text where it was raised.

    Rendering runs the exception's own code (``__str__``, ``__repr__`` of its causes and notes):
    the ``db_guard`` step renders it while the run's tenant and the guard are still in place,
    and everything after the body (history, logs, spans) uses this text instead of rendering
    the exception again in the public schema, outside the guard.
    """

    error: BaseException
    type_name: str
    message: str
    traceback: str


def render_error(error: BaseException) -> RenderedError:
    """``error`` as text; an exception whose rendering fails still gives a message."""
    name = type(error).__name__
    try:
        message = str(error)
    except Exception as exc:  # a broken (or refused: DatabaseAccessDenied) __str__
        message = f"<the {name} could not be rendered: {type(exc).__name__}>"
    try:
        text = "".join(traceback.format_exception(error))
    except Exception as exc:
        text = f"{name}: {message}\n<traceback not rendered: {type(exc).__name__}>"
    # Storable from the start: a NUL in an exception's text made the history's final write
    # fail, which left the run ``running``.
    return RenderedError(error, name, storable(message), storable(text))


@dataclass(slots=True)
class RunState:
    """Mutable state of one execution, shared by the pipeline's steps."""

    envelope: Envelope
    definition: JobDefinition
    rq_job_id: str = ""
    queue: str = ""
    worker_name: str = ""
    # The tenant the message names, as the records step loaded it (None: no such tenant).
    tenant_loaded: bool = False
    loaded_tenant: Any = None
    ctx: JobContext | None = None
    started_at: datetime | None = None
    started_monotonic: float = field(default_factory=time.monotonic)
    # outcome: "succeeded" | "failed" | "retrying" | "deferred" | "dropped"
    outcome: str = ""
    error: BaseException | None = None
    error_traceback: str = ""
    failure_key: str | None = None
    result: Any = None
    deferral_seconds: float | None = None
    deferred_by_gate: bool = False
    drop_reason: str = ""
    # (envelope, delay in seconds) to push once the history is written
    reschedule: tuple[Envelope, float] | None = None
    # What the attempt enqueued (enqueue.followups), sent if it succeeds; made from the envelope.
    followups: FollowupBatch = field(init=False)
    log_lines: list[dict[str, Any]] = field(default_factory=list)
    # Bytes of JSON the kept ctx.log lines take, and the marker line once lines are dropped.
    log_bytes: int = 0
    log_overflow: dict[str, Any] | None = None
    # The escape-hatch uses the run reported (audit.record_use), made from the definition.
    audit_uses: audit.AuditUses = field(init=False)
    # Set by the worker's death penalty when the attempt's timeout fires (its seconds): from then
    # on the attempt is timed out, whatever the job's code catches or returns (runner.call_job).
    timeout_fired: int | None = None
    # Called (in the run's thread, from the alarm's signal handler) when the timeout fires:
    # an async body registers the cancellation of its coroutine here (async_body.call_async).
    timeout_hooks: list[Callable[[], None]] = field(default_factory=list)
    # The job acknowledged a cancellation (ctx.check_cancelled() raised): the run ends cancelled.
    cancel_acknowledged: bool = False
    subject: str = ""
    # The job body's exception, rendered inside the guarded tenant context (db_guard step).
    rendered_error: RenderedError | None = None
    # An atomic run's body and success committed together (steps.atomic).
    atomic_committed: bool = False
    # The guard's part: grants open, violations, session marks, the installed guard, the
    # body's database identity (guard_watch). Built from the envelope and the definition.
    watch: Watch = field(init=False)

    def __post_init__(self) -> None:
        env, definition = self.envelope, self.definition
        self.watch = Watch(
            job=env.job,
            schema=env.schema,
            origin=env.origin,
            declared_grants=frozenset(definition.grants),
            system=definition.system,
            atomic=definition.atomic,
        )
        self.followups = FollowupBatch(parent=env)
        hatch = definition.escape_hatch
        self.audit_uses = audit.AuditUses(
            reason=hatch.reason if hatch else "system job", system=definition.system
        )

    @property
    def tenant(self) -> Any:
        """The run's tenant (None: a system run); kept on the Watch, which the guard reads.
        Set by the gates step."""
        return self.watch.tenant

    @tenant.setter
    def tenant(self, tenant: Any) -> None:
        self.watch.tenant = tenant

    def note_timeout(self, seconds: int) -> None:
        """The attempt's timeout fired: from now on it is timed out (runner._final_timeout)."""
        self.timeout_fired = seconds
        for hook in list(self.timeout_hooks):
            hook()

    def described_error(self) -> RenderedError | None:
        """``error`` as text: the job's exception as the db_guard step rendered it, or one of
        kumiko's own exceptions (gates, deferral), which are safe to render anywhere."""
        error = self.error
        if error is None:
            return None
        rendered = self.rendered_error
        if rendered is not None and rendered.error is error:
            return rendered
        return render_error(error)

    @property
    def final_attempt(self) -> bool:
        return self.envelope.attempt >= self.max_attempts

    @property
    def max_attempts(self) -> int:
        return self.definition.max_attempts


class JobLog:
    """``ctx.log``: lines kept on the attempt record and sent to the ``kumiko_jobs.job`` logger.

    Every line is scrubbed (values of sensitive keys masked, secrets in text hidden) and capped:
    ``LOG_LINE_BYTES`` per line, ``LOG_LINES_PER_ATTEMPT`` lines and ``LOG_BYTES_PER_ATTEMPT``
    bytes per attempt. Lines past a cap are dropped and counted on one marker line, so a job
    that logs in a loop cannot grow its attempt row (and the admin page showing it) without
    bound.
    """

    def __init__(self, state: RunState, limit: int, bound: Mapping[str, Any] | None = None):
        self._state = state
        self._limit = limit
        self._bound: dict[str, Any] = dict(bound or {})

    def child(self, **bound: Any) -> JobLog:
        """A log for one part of the job: every line carries ``bound`` (the call's own fields
        win on a clash). Lines go to the same attempt record, under the same caps."""
        return JobLog(self._state, self._limit, {**self._bound, **bound})

    def _emit(self, level: int, msg: str, data: dict[str, Any]) -> None:
        from ..core import conf

        if level < logging.INFO and not logger.isEnabledFor(level):
            # Debug lines follow the kumiko_jobs.job logger's level, on the attempt record too:
            # a job may log verbosely in a loop without filling its record (and scrubbing
            # costs nothing) unless someone turned debug logging on. Info and above are always
            # kept: the record is the operators' view whatever the logging setup.
            return
        if self._bound:
            data = {**self._bound, **data}
        settings = conf.get()
        entry = log_entry(level, msg, data, settings.SENSITIVE_KEYS, settings.LOG_LINE_BYTES)
        self._keep(entry, settings.LOG_BYTES_PER_ATTEMPT)
        fields = entry["data"]
        logger.log(level, "%s %s", entry["msg"], fields or "", extra={"kumiko_data": fields})

    def _keep(self, entry: dict[str, Any], byte_limit: int) -> None:
        state = self._state
        size = entry_size(entry)
        if state.log_overflow is None:
            if len(state.log_lines) < self._limit and state.log_bytes + size <= byte_limit:
                state.log_lines.append(entry)
                state.log_bytes += size
                return
            state.log_overflow = {
                "t": entry["t"],
                "level": "WARNING",
                "msg": (
                    f"ctx.log: {len(state.log_lines)} lines ({state.log_bytes} bytes) kept; "
                    f"later lines dropped (LOG_LINES_PER_ATTEMPT={self._limit}, "
                    f"LOG_BYTES_PER_ATTEMPT={byte_limit})"
                ),
                "data": {"dropped_lines": 0, "dropped_bytes": 0},
            }
            state.log_lines.append(state.log_overflow)
        state.log_overflow["data"]["dropped_lines"] += 1
        state.log_overflow["data"]["dropped_bytes"] += size

    def debug(self, msg: str, **data: Any) -> None:
        self._emit(logging.DEBUG, msg, data)

    def info(self, msg: str, **data: Any) -> None:
        self._emit(logging.INFO, msg, data)

    def warning(self, msg: str, **data: Any) -> None:
        self._emit(logging.WARNING, msg, data)

    warn = warning

    def error(self, msg: str, **data: Any) -> None:
        self._emit(logging.ERROR, msg, data)


def log_entry(
    level: int, msg: object, data: Mapping[str, Any], keys: Sequence[str], line_bytes: int
) -> dict[str, Any]:
    """One ``ctx.log`` line as stored: scrubbed, and about ``line_bytes`` of JSON at most.

    The message takes what it needs of the budget first; the fields share the rest in the
    order given, and fields that no longer fit are counted in ``"…dropped_fields"``. Markers
    ("[... N more characters]", the count) may add a few dozen bytes.
    """
    text = _fitted(str(msg), keys, line_bytes)
    budget = max(0, line_bytes - entry_size(text))
    fields: dict[str, Any] = {}
    dropped = 0
    for key, value in data.items():
        name = storable(str(key))[:100]
        if is_sensitive_key(name, keys):
            shown: Any = MASK
        elif value is None or isinstance(value, bool | int | float):
            shown = _number(value)
        else:
            text_value = value if isinstance(value, str) else _repr(value)
            shown = _fitted(text_value, keys, max(budget - len(name) - 8, 1))
        cost = entry_size({name: shown})
        if cost > budget:
            dropped += 1
            continue
        fields[name] = shown
        budget -= cost
    if dropped:
        fields["…dropped_fields"] = dropped
    return {"t": time.time(), "level": logging.getLevelName(level), "msg": text, "data": fields}


def _fitted(text: str, keys: Sequence[str], budget: int) -> str:
    """``text`` scrubbed and storable, cut until its JSON takes about ``budget`` bytes.

    Cut before scrubbing (linear time); cut again when escaping grew it (a NUL becomes four
    characters, a non-ASCII one six), halving at most a few times.
    """
    limit = budget
    while True:
        fitted = storable(scrub(text, keys, limit=limit))
        if limit == 0 or entry_size(fitted) <= budget + 40:
            return fitted
        limit //= 2


def entry_size(value: Any) -> int:
    # ASCII JSON: one character per byte, and never smaller than PostgreSQL's UTF-8 copy.
    return len(json.dumps(value, default=str))


def storable(text: str) -> str:
    """Text PostgreSQL's text and jsonb can hold: NUL and lone surrogates escaped."""
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _number(value: bool | int | float | None) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        # jsonb has no NaN or Infinity: such a line would make the whole attempt unwritable.
        return repr(value)
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 2**63:
        return str(value)
    return value


def _repr(value: Any) -> str:
    try:
        text = repr(value)
    except RecursionError:
        return f"<a {type(value).__name__} nested too deeply to show>"
    except Exception as exc:  # a broken __repr__ must not fail the job that logs it
        return f"<a {type(value).__name__} whose repr() raised {type(exc).__name__}>"
    return text


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
        self.log = JobLog(state, log_limit)

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
            self._state.cancel_acknowledged = True
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

    # --- escape hatches -------------------------------------------------------------------

    def _require(self, grant: str) -> None:
        if grant not in self._state.definition.grants:
            raise InvalidJob(
                f"Job {self.job_name!r} used ctx.{grant}() without declaring it. Add "
                f"escape_hatch=EscapeHatch(reason='why', grants=[{grant!r}]) to its @job."
            )

    @contextlib.contextmanager
    def _granted(self, grant: str) -> Iterator[None]:
        # SQL grants are reported by the guard when a statement actually needs them.
        self._require(grant)
        with self._state.watch.hatch(grant):
            yield

    def unsafe_raw(self) -> contextlib.AbstractContextManager[None]:
        """Allow SQL the guard cannot verify (DDL, COPY, SET, multi-statements)."""
        return self._granted(Grant.UNSAFE_RAW.value)

    @contextlib.contextmanager
    def global_writes(self) -> Iterator[None]:
        """Allow writes to shared (public) tables. With DB_ROLES the block logs in as the
        tenant's writer (its own privileges plus writes on the shared tables)."""
        # tenant_connections imports django-tenants' backend, which needs the app registry;
        # this module is imported while apps load (the logging filter).
        from ..guard.connections import writer_identity

        with self._granted(Grant.GLOBAL_WRITES.value), writer_identity(self._state.watch):
            yield

    @contextlib.contextmanager
    def cross_tenant_reads(self, tenant: Any) -> Iterator[None]:
        """Read another tenant's schema, SELECT only, then come back."""
        from django.db import connection as default_connection

        from ..guard.connections import read_identity  # (in the function: see global_writes)

        watch = self._state.watch
        # django-tenants' wrapper (with DB_ROLES, the other tenant's role's, for the block)
        connection: Any = default_connection
        with self._granted(Grant.CROSS_TENANT_READS.value), read_identity(watch, tenant):
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
        with self._granted(Grant.SYSTEM_IDENTITY.value), current.acting_as(user):
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
        from ..guard.connections import project_identity  # (in the function: see global_writes)

        watch = self._state.watch
        audit.record_use(self._state, "system_db")
        with project_identity(watch), watch.stepped_aside():
            yield
