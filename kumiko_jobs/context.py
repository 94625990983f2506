"""What a job sees (``JobContext``) and what the runner's steps share (``RunState``)."""

from __future__ import annotations

import contextlib
import logging
import time
import traceback
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from .exceptions import InvalidJob

if TYPE_CHECKING:
    from .envelope import Envelope
    from .registry import JobDefinition

logger = logging.getLogger("kumiko_jobs.job")

# The user app code acts for inside ``ctx.act_as(user)``; read with kumiko_jobs.current_user().
_acting_user: ContextVar[Any] = ContextVar("kumiko_jobs_acting_user", default=None)
# The run executing in this thread, for the logging filter and follow-up enqueues.
current_run: ContextVar[RunState | None] = ContextVar("kumiko_jobs_current_run", default=None)


def current_user() -> Any:
    """The user a job acts for (``ctx.act_as``), or None."""
    return _acting_user.get()


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
    return RenderedError(error, name, message, text)


@dataclass(slots=True)
class RunState:
    """Mutable state of one execution, shared by the pipeline's steps."""

    envelope: Envelope
    definition: JobDefinition
    rq_job_id: str = ""
    queue: str = ""
    worker_name: str = ""
    tenant: Any = None
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
    followups: list[Any] = field(default_factory=list)
    log_lines: list[dict[str, Any]] = field(default_factory=list)
    active_grants: list[str] = field(default_factory=list)
    readable_schema: str | None = None
    guard_violations: list[str] = field(default_factory=list)
    audit_uses: list[tuple[str, str, str]] = field(default_factory=list)
    system_db_open: bool = False
    subject: str = ""
    # The job body's exception, rendered inside the guarded tenant context (db_guard step).
    rendered_error: RenderedError | None = None
    # Aliases whose session the body may have changed beyond its transaction (statements the
    # guard allowed under unsafe_raw or inside system_db, server-side cursors); all of them
    # when the guard did not watch (DB_GUARD="off"). The tenancy step resets those sessions.
    dirty_sessions: set[str] = field(default_factory=set)
    unwatched_sessions: bool = False
    # The db_guard step's installation while the body runs (it adopts connections opened
    # meanwhile); None outside the body and with DB_GUARD="off".
    guard: Any = None

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
        from . import conf

        retries = self.definition.retries
        return 1 + (conf.get().DEFAULT_RETRIES if retries is None else retries)


class JobLog:
    """``ctx.log``: lines kept on the attempt record and sent to the ``kumiko_jobs.job`` logger."""

    def __init__(self, state: RunState, limit: int):
        self._state = state
        self._limit = limit

    def _emit(self, level: int, msg: str, data: dict[str, Any]) -> None:
        lines = self._state.log_lines
        if len(lines) < self._limit:
            lines.append(
                {
                    "t": time.time(),
                    "level": logging.getLevelName(level),
                    "msg": str(msg),
                    "data": {k: _loggable(v) for k, v in data.items()},
                }
            )
        logger.log(level, "%s %s", msg, data or "", extra={"kumiko_data": data})

    def debug(self, msg: str, **data: Any) -> None:
        self._emit(logging.DEBUG, msg, data)

    def info(self, msg: str, **data: Any) -> None:
        self._emit(logging.INFO, msg, data)

    def warning(self, msg: str, **data: Any) -> None:
        self._emit(logging.WARNING, msg, data)

    warn = warning

    def error(self, msg: str, **data: Any) -> None:
        self._emit(logging.ERROR, msg, data)


def _loggable(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return repr(value)[:500]


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
        self.final_attempt = state.final_attempt
        self.triggered_by = env.triggered_by
        self.correlation_id = env.correlation_id
        self.trigger_name = env.trigger
        self.log = JobLog(state, log_limit)

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
        from .enqueueing import prepare_followup

        handle = prepare_followup(self._state, job, kwargs)
        return handle

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
        self._state.active_grants.append(grant)
        try:
            yield
        finally:
            self._state.active_grants.pop()

    def unsafe_raw(self) -> contextlib.AbstractContextManager[None]:
        """Allow SQL the guard cannot verify (DDL, COPY, SET, multi-statements)."""
        return self._granted("unsafe_raw")

    def global_writes(self) -> contextlib.AbstractContextManager[None]:
        """Allow writes to shared (public) tables."""
        return self._granted("global_writes")

    @contextlib.contextmanager
    def cross_tenant_reads(self, tenant: Any) -> Iterator[None]:
        """Read another tenant's schema, SELECT only, then come back."""
        from django.db import connection as default_connection

        connection: Any = default_connection  # django-tenants' wrapper
        with self._granted("cross_tenant_reads"):
            previous = connection.tenant
            self._state.readable_schema = tenant.schema_name
            connection.set_tenant(tenant)
            try:
                yield
            finally:
                connection.set_tenant(previous)
                self._state.readable_schema = None

    @contextlib.contextmanager
    def act_as(self, user: Any) -> Iterator[None]:
        """Make ``kumiko_jobs.current_user()`` return ``user`` for app code in this block."""
        with self._granted("system_identity"):
            from . import audit

            token = _acting_user.set(user)
            try:
                # Reported after the switch, so that the audit's actor is the user acted as.
                audit.record_use(self._state, "system_identity")
                yield
            finally:
                _acting_user.reset(token)

    @contextlib.contextmanager
    def system_db(self) -> Iterator[None]:
        """System jobs only: the guard steps aside for this block."""
        if not self._state.definition.system:
            raise InvalidJob(
                "ctx.system_db() is for system jobs; declare @job(system=True) on "
                f"{self.job_name!r}."
            )
        from . import audit

        audit.record_use(self._state, "system_db")
        self._state.system_db_open = True
        try:
            yield
        finally:
            self._state.system_db_open = False
