"""What a job is: its validated options (``JobDefinition``) and the values they hold.

Kept apart from the option parsing (``options``) and the registry: the run side, the enqueue
side and the admin read a definition's facts (its queue, timeout, attempts, deferrals) through
the properties here, so each default is applied in one place, read at each use so that
``override_settings`` applies.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Self

from ..core import conf
from ..core.exceptions import InvalidJob
from ..core.grants import Grant
from ..core.rates import Rate

GRANTS = tuple(grant.value for grant in Grant)  # plain words: error messages show them
# The history column the reason lands in (EscapeHatchUse.reason).
REASON_MAX_LENGTH = 500
BackoffKind = Literal["fixed", "exponential"]
Concurrency = Literal["parallel", "skip", "replace", "debounce", "sequential"]
CONCURRENCY_MODES = ("parallel", "skip", "replace", "debounce", "sequential")
# Priorities as in Django's task framework (django.tasks): higher first.
PRIORITY_MIN, PRIORITY_MAX = -100, 100


@dataclass(frozen=True, slots=True)
class Backoff:
    """Delay before attempt n+1: ``delay``, or ``delay * 2**(n-1)`` capped at ``max_delay``."""

    kind: BackoffKind = "exponential"
    delay: float = 1.0
    max_delay: float = 3600.0

    def seconds_after(self, attempt: int) -> float:
        """The wait before the attempt after ``attempt`` (1 = the first)."""
        if self.kind == "fixed":
            return self.delay
        # The exponent is capped: 2**64 s is past any max_delay, and a float cannot hold 2**1024.
        return float(min(self.delay * 2 ** min(attempt - 1, 64), self.max_delay))


@dataclass(frozen=True, slots=True)
class EscapeHatch:
    """A declared, reasoned permission to step outside the tenant's schema."""

    reason: str
    grants: tuple[str, ...]

    def __init__(self, reason: str, grants: Sequence[str]):
        if not isinstance(reason, str) or not reason.strip():
            raise InvalidJob(
                "EscapeHatch needs a reason: say why the job must leave its tenant, e.g. "
                "EscapeHatch(reason='rebuilds the shared price index', grants=['global_writes'])."
            )
        if isinstance(grants, str) or not grants:
            raise InvalidJob(
                f"EscapeHatch(grants=...) must be a non-empty list of grants from {GRANTS}."
            )
        unknown = [g for g in grants if g not in GRANTS]
        if unknown:
            raise InvalidJob(
                f"EscapeHatch has unknown grant(s) {unknown}; use grants from {GRANTS}."
            )
        if len(reason.strip()) > REASON_MAX_LENGTH:
            raise InvalidJob(
                f"EscapeHatch reason is {len(reason.strip())} characters; keep it under "
                f"{REASON_MAX_LENGTH} (the audit row stores it with every reported use)."
            )
        object.__setattr__(self, "reason", reason.strip())
        object.__setattr__(self, "grants", tuple(dict.fromkeys(grants)))


@dataclass(frozen=True, slots=True)
class FailureVisibility:
    """What a tenant sees of a failed run: a translatable message and the arguments named."""

    message_key: str
    subject_fields: tuple[str, ...] = ()


@dataclass(frozen=True, eq=False)
class JobDefinition:
    """A registered job: its validated options. ``@job`` returns the subclass
    ``kumiko_jobs.enqueueing.api.Job``, whose ``enqueue`` / ``enqueue_in`` / ``enqueue_at`` run
    it."""

    name: str
    func: Callable[..., Any]
    queue: str | None = None
    retries: int | None = None
    backoff: Backoff = field(default_factory=Backoff)
    timeout: int | None = None
    tenant_visible_run: tuple[str, ...] = ()
    tenant_visible_failure: FailureVisibility | None = None
    escape_hatch: EscapeHatch | None = None
    system: bool = False
    manual: bool = False
    max_defers: int | None = None
    description: str = ""
    cron: str | None = None
    timezone: str = "UTC"
    per_tenant: bool = False
    on: tuple[str, ...] = ()
    where: Mapping[str, Any] = field(default_factory=dict)
    concurrency: Concurrency = "parallel"
    debounce: float = 0.0
    max_per_tenant: int | None = None
    tenant_concurrency: int | None = None
    run_on_boot: bool = False
    boot_gate: bool = False
    # A system job that tenant runs may enqueue (as follow-ups) with arguments of their choosing.
    tenant_may_start: bool = False
    # The body's writes and the run's success commit in one transaction (docs/reliability.md,
    # "Exactly once for database-only jobs").
    atomic: bool = False
    # Unique jobs (enqueueing/unique.py): the arguments whose values make two enqueues "the
    # same run" (all of them for ``unique=True``); None when the job is not unique.
    unique: tuple[str, ...] | None = None
    # How long after a run of the same key finished a new enqueue still returns it (seconds).
    unique_for: float = 0.0
    # A Django task's priority above 0 puts its messages at the front of the queue (set by
    # task_jobs.register_task_jobs: @job has no such option).
    front_by_priority: bool = False
    # The priority level of its messages in their queue (-100..100, higher first, FIFO within
    # a level; docs/design.md, "Flow control"). ``using(priority=...)`` overrides it per enqueue.
    priority: int = 0
    # Rate limits by time window (core/rates.py), enforced at the start by the fair dequeue
    # (docs/design.md, "Flow control: rate limits"): across all tenants (per value of the
    # ``rate_limit_by`` argument when given), and per tenant.
    rate_limit: Rate | None = None
    tenant_rate_limit: Rate | None = None
    rate_limit_by: str | None = None
    # Whether a tenant's members holding ``operate_tenant_runs`` may retry and cancel its runs on
    # their tenant's domain (admin/tenant_acts.py); False leaves them to the operators.
    tenant_operable: bool = True

    def __call__(self, ctx: Any, /, **kwargs: Any) -> Any:
        """Call the function directly (tests, with any context); no pipeline, no guard, no
        history."""
        return self.func(ctx, **kwargs)

    # --- derived facts: the job's option, else the project's default (read at each use, so
    # override_settings applies) -----------------------------------------------------------

    @property
    def queue_name(self) -> str:
        """The RQ queue its messages go to (``queue=``, else ``DEFAULT_QUEUE``)."""
        return self.queue or conf.get().DEFAULT_QUEUE

    @property
    def timeout_seconds(self) -> int:
        """How long an attempt may run (``timeout=``, else ``DEFAULT_TIMEOUT``)."""
        return self.timeout or conf.get().DEFAULT_TIMEOUT

    @property
    def max_attempts(self) -> int:
        """The first attempt and every retry."""
        return 1 + (conf.get().DEFAULT_RETRIES if self.retries is None else self.retries)

    @property
    def effective_max_defers(self) -> int:
        """How often a run may defer itself (``max_defers=``, else ``MAX_DEFERS``)."""
        return conf.get().MAX_DEFERS if self.max_defers is None else self.max_defers

    @property
    def grants(self) -> tuple[str, ...]:
        """What its escape hatch permits (none without one)."""
        return self.escape_hatch.grants if self.escape_hatch else ()

    @property
    def subject_fields(self) -> tuple[str, ...]:
        """The arguments a tenant may see of its runs (``tenant_visible_run`` and the failure's
        ``subject_fields``, once each, in that order): what the run's subject is built from."""
        fields = list(self.tenant_visible_run)
        if self.tenant_visible_failure:
            fields += [f for f in self.tenant_visible_failure.subject_fields if f not in fields]
        return tuple(fields)

    def using(self, *, priority: int) -> Self:
        """This job with another priority for the enqueues made through the copy:
        ``sync_invoice.using(priority=10).enqueue(invoice_id=7)``. The run keeps it for every
        message (retries, deferrals, the relay's)."""
        if (
            isinstance(priority, bool)
            or not isinstance(priority, int)
            or not (PRIORITY_MIN <= priority <= PRIORITY_MAX)
        ):
            raise InvalidJob(
                f"Job {self.name!r}: using(priority={priority!r}); a priority is an integer "
                f"from {PRIORITY_MIN} to {PRIORITY_MAX} (higher runs first, 0 is the default)."
            )
        return dataclasses.replace(self, priority=priority)

    def bind_arguments(self, kwargs: Mapping[str, Any]) -> None:
        """Raise InvalidJob when ``kwargs`` do not fit the function's signature."""
        if _fits(self.func, kwargs):
            return
        shape = _keyword_shape(self.func)
        if shape is not None and not shape[3]:
            # Python's bind() names a missing argument before an unknown one: a misspelt
            # name (nid for note_id) would read as "missing 'note_id'" only. Both, then.
            unknown = sorted(set(kwargs) - shape[2] - {shape[0]})
            missing = sorted(shape[1] - set(kwargs))
            if unknown:
                plural = "s" if len(unknown) > 1 else ""
                raise InvalidJob(
                    f"Job {self.name!r}: unexpected keyword argument{plural} "
                    f"{', '.join(map(repr, unknown))}"
                    + (f", missing {', '.join(map(repr, missing))}" if missing else "")
                    + f" (it takes {', '.join(sorted(shape[2])) or 'none'})."
                    " Pass the job's keyword arguments."
                )
        try:
            _signature(self.func).bind(None, **kwargs)
        except TypeError as exc:
            raise InvalidJob(
                f"Job {self.name!r}: {exc}. Pass the job's keyword arguments."
            ) from None

    def __repr__(self) -> str:
        return f"<JobDefinition {self.name}>"


def _fits(func: Callable[..., Any], kwargs: Mapping[str, Any]) -> bool:
    """Do ``kwargs`` surely bind (as ``bind_arguments`` binds them)? Compares names only, as
    ``Signature.bind`` does for keyword arguments, for the usual shape ``(ctx, [*,] names...,
    [**extra])``; False (any doubt, any other shape) sends the call to ``bind``, which names
    the problem."""
    shape = _keyword_shape(func)
    if shape is None:
        return False
    first, required, allowed, any_name = shape
    names = kwargs.keys()
    return required <= names and (any_name or names <= allowed) and first not in names


_Shape = tuple[str, frozenset[str], frozenset[str], bool]


@functools.cache
def _keyword_shape(func: Callable[..., Any]) -> _Shape | None:
    """(the context parameter's name, the names without a default, the names a keyword can
    bind, takes ``**kwargs``) of a function shaped ``(ctx, [*,] names..., [**extra])``; None
    for any other shape."""
    P = inspect.Parameter
    params = list(_signature(func).parameters.values())
    if not params or params[0].kind not in (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD):
        return None
    rest = params[1:]
    if any(p.kind in (P.POSITIONAL_ONLY, P.VAR_POSITIONAL) for p in rest):
        return None
    by_keyword = [p for p in rest if p.kind is not P.VAR_KEYWORD]
    return (
        params[0].name,
        frozenset(p.name for p in by_keyword if p.default is P.empty),
        frozenset(p.name for p in by_keyword),
        len(by_keyword) < len(rest),
    )


@functools.cache
def _signature(func: Callable[..., Any]) -> inspect.Signature:
    """``inspect.signature`` once per job function: it builds a new Signature on every call,
    which was a tenth of a bulk enqueue's time per item."""
    return inspect.signature(func)
