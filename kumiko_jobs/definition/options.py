"""``@job``'s options: each one checked when the module that declares the job is imported.

A typo or a wrong type fails at start-up with a message that names the fix, never in a worker
at 3 a.m. This module turns the keyword arguments of ``@job`` into a ``JobDefinition`` (or an
``InvalidJob``); it holds no state.
"""

from __future__ import annotations

import difflib
import inspect
import re
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any

from django.apps import apps

from ..core import conf
from ..core.exceptions import InvalidJob, message_key_problem
from ..core.grants import Grant
from ..core.rates import Rate, parse_rate
from .cron import check_cron, check_timezone
from .job import (
    CONCURRENCY_MODES,
    PRIORITY_MAX,
    PRIORITY_MIN,
    Backoff,
    EscapeHatch,
    FailureVisibility,
    JobDefinition,
)

_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.:-]{0,199}$")
# The history column the queue name lands in (models.JobRun.queue).
QUEUE_MAX_LENGTH = 100
# A per-job max_defers above this is a mistake, not a policy (and each deferral is a message).
MAX_DEFERS_LIMIT = 1_000_000

_OPTION_TYPES: dict[str, str] = {
    "name": "str",
    "queue": "str",
    "retries": "int >= 0",
    "backoff": "str or dict",
    "timeout": "int > 0 (seconds)",
    "tenant_visible_run": "list of argument names",
    "tenant_visible_failure": "dict(message_key=..., subject_fields=[...])",
    "escape_hatch": "EscapeHatch",
    "system": "bool",
    "manual": "bool",
    "max_defers": "int >= 0",
    "description": "str",
    "cron": "crontab string",
    "timezone": "IANA time zone name",
    "per_tenant": "bool",
    "on": "event name or list of names",
    "where": "dict of payload values",
    "concurrency": "one of " + ", ".join(CONCURRENCY_MODES),
    "debounce": "seconds > 0",
    "max_per_tenant": "int >= 1",
    "tenant_concurrency": "int >= 1",
    "run_on_boot": "bool",
    "boot_gate": "bool",
    "tenant_may_start": "bool (system jobs only)",
    "atomic": "bool (tenant jobs whose whole effect is in the default database)",
    "unique": "True or list of argument names",
    "unique_for": "seconds > 0 or timedelta (with unique=)",
    "priority": f"int from {PRIORITY_MIN} to {PRIORITY_MAX} (higher first)",
    "rate_limit": "'<starts>/<s|m|h>' across all tenants, e.g. '100/m'",
    "tenant_rate_limit": "'<starts>/<s|m|h>' per tenant, e.g. '10/m'",
    "rate_limit_by": "an argument name: one rate_limit window per value of it",
}


def is_async(func: Callable[..., Any]) -> bool:
    """An ``async def`` body (run through ``async_body.call_async``), which ``atomic=`` refuses."""
    return inspect.iscoroutinefunction(func)


def _fail(func_name: str, message: str) -> InvalidJob:
    return InvalidJob(f"@job on {func_name}: {message}")


def _parse_backoff(where: str, value: Any) -> Backoff:
    if isinstance(value, Backoff):
        return value
    if value in ("fixed", "exponential"):
        return Backoff(kind=value)
    if isinstance(value, Mapping):
        unknown = set(value) - {"type", "delay", "max_delay"}
        kind = value.get("type", "exponential")
        delay = value.get("delay", 1.0)
        max_delay = value.get("max_delay", 3600.0)
        numbers_ok = all(
            isinstance(v, int | float) and not isinstance(v, bool) and v >= 0
            for v in (delay, max_delay)
        )
        if not unknown and kind in ("fixed", "exponential") and numbers_ok:
            return Backoff(kind=kind, delay=float(delay), max_delay=float(max_delay))
    raise _fail(
        where,
        f"backoff={value!r} is not valid; use 'fixed', 'exponential' or "
        "{'type': 'fixed'|'exponential', 'delay': seconds >= 0, 'max_delay': seconds}.",
    )


def _names(where: str, option: str, value: Any, params: Sequence[str]) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise _fail(where, f"{option} must be a list of argument names, got {value!r}.")
    missing = [v for v in value if v not in params]
    if missing:
        raise _fail(
            where,
            f"{option} names {missing}, which are not keyword arguments of the job "
            f"(it has {list(params)}).",
        )
    return tuple(value)


def _int_option(
    where: str, option: str, value: Any, minimum: int, maximum: int | None = None
) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise _fail(where, f"{option} must be an integer >= {minimum}, got {value!r}.")
    if maximum is not None and value > maximum:
        raise _fail(where, f"{option}={value} is over the upper bound {maximum}.")
    return value


def _rate(where: str, option: str, value: Any) -> Rate | None:
    if value is None:
        return None
    try:
        return parse_rate(value)
    except ValueError as exc:
        raise _fail(where, f"{option}: {exc}.") from exc


def _rate_limit_by(where: str, options: Mapping[str, Any], params: Sequence[str]) -> str | None:
    """The argument whose value keys ``rate_limit``'s window (one per external account...)."""
    name = options.get("rate_limit_by")
    if name is None:
        return None
    if options.get("rate_limit") is None:
        raise _fail(where, "rate_limit_by= needs rate_limit= (the limit of each key's window).")
    if not isinstance(name, str) or name not in params:
        raise _fail(
            where,
            f"rate_limit_by={name!r} must name a keyword argument of the job "
            f"(it has {list(params)}).",
        )
    return name


def _priority(where: str, value: Any) -> int:
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or not (PRIORITY_MIN <= value <= PRIORITY_MAX)
    ):
        raise _fail(
            where,
            f"priority={value!r}; a priority is an integer from {PRIORITY_MIN} to {PRIORITY_MAX} "
            "(higher runs first within its queue, 0 is the default).",
        )
    return value


def _bounded_retries(where: str, value: Any) -> int | None:
    settings = conf.get_or_none()
    retries = _int_option(where, "retries", value, 0)
    # Invalid settings: the bound is unknown, and check E001 stops every command that runs jobs.
    limit = settings.MAX_RETRIES if settings is not None else None
    if retries is not None and limit is not None and retries > limit:
        raise _fail(
            where,
            f"retries={retries} is over KUMIKO_JOBS['MAX_RETRIES']={limit}. Retry less, or "
            "raise MAX_RETRIES if every attempt really can succeed where the last failed.",
        )
    return retries


def build_definition(func: Callable[..., Any], options: Mapping[str, Any]) -> JobDefinition:
    """Validate ``@job`` options for ``func`` and return its definition."""
    where = getattr(func, "__qualname__", repr(func))
    unknown = set(options) - set(_OPTION_TYPES)
    if unknown:
        hints = []
        for key in sorted(unknown):
            close = difflib.get_close_matches(key, list(_OPTION_TYPES), n=1)
            hints.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        raise _fail(where, f"unknown option {', '.join(hints)}. Options: {sorted(_OPTION_TYPES)}.")
    if not callable(func):
        raise InvalidJob(f"@job decorates a function, got {func!r}.")
    signature = inspect.signature(func)
    positional = [
        p
        for p in signature.parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    if not positional:
        raise _fail(where, "the job must take the context as first argument: def job(ctx, *, ...).")
    params = [p.name for p in signature.parameters.values()][1:]

    module = getattr(func, "__module__", "") or ""
    name = options.get("name") or _default_name(module, func.__name__)
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise _fail(where, f"name={name!r} must match {_NAME_RE.pattern}.")
    queue = options.get("queue")
    if queue is not None and (
        not isinstance(queue, str) or not queue or len(queue) > QUEUE_MAX_LENGTH
    ):
        raise _fail(
            where,
            f"queue must be the name of an RQ_QUEUES entry (at most {QUEUE_MAX_LENGTH} "
            f"characters), got {queue!r:.120}.",
        )
    for flag in ("system", "manual", "tenant_may_start", "atomic"):
        if not isinstance(options.get(flag, False), bool):
            raise _fail(where, f"{flag} must be True or False, got {options[flag]!r}.")
    escape_hatch = options.get("escape_hatch")
    if escape_hatch is not None and not isinstance(escape_hatch, EscapeHatch):
        raise _fail(where, "escape_hatch must be EscapeHatch(reason=..., grants=[...]).")
    system = bool(options.get("system", False))
    tenant_visible_run = _names(
        where, "tenant_visible_run", options.get("tenant_visible_run", ()), params
    )
    failure = _parse_failure(where, options.get("tenant_visible_failure"), params)
    if system and (tenant_visible_run or failure):
        raise _fail(where, "system jobs run for no tenant; drop tenant_visible_run/_failure.")
    tenant_may_start = bool(options.get("tenant_may_start", False))
    if tenant_may_start and not system:
        raise _fail(
            where,
            "tenant_may_start=True lets tenant runs start a system job; this job is a tenant "
            "job, which tenant runs start anyway. Drop the option, or declare system=True.",
        )
    description = options.get("description") or inspect.getdoc(func) or ""
    triggers = _trigger_options(where, options, system)
    atomic = bool(options.get("atomic", False))
    if atomic:
        _check_atomic(where, func, system, escape_hatch, triggers)
    unique, unique_for = _unique_options(where, options, params, triggers)
    return JobDefinition(
        name=name,
        func=func,
        queue=queue,
        retries=_bounded_retries(where, options.get("retries")),
        backoff=_parse_backoff(where, options.get("backoff", "exponential")),
        timeout=_int_option(where, "timeout", options.get("timeout"), 1),
        tenant_visible_run=tenant_visible_run,
        tenant_visible_failure=failure,
        escape_hatch=escape_hatch,
        system=system,
        manual=bool(options.get("manual", False)),
        tenant_may_start=tenant_may_start,
        atomic=atomic,
        max_defers=_int_option(
            where, "max_defers", options.get("max_defers"), 0, maximum=MAX_DEFERS_LIMIT
        ),
        description=str(description).split("\n\n")[0],
        unique=unique,
        unique_for=unique_for,
        priority=_priority(where, options.get("priority", 0)),
        rate_limit=_rate(where, "rate_limit", options.get("rate_limit")),
        tenant_rate_limit=_rate(where, "tenant_rate_limit", options.get("tenant_rate_limit")),
        rate_limit_by=_rate_limit_by(where, options, params),
        **triggers,
    )


def _check_atomic(
    where: str,
    func: Callable[..., Any],
    system: bool,
    escape_hatch: EscapeHatch | None,
    triggers: Mapping[str, Any],
) -> None:
    """``atomic=True`` only where one transaction on the body's connection can hold the whole
    effect: the combinations below would write on another connection (or none at all)."""
    if system:
        raise _fail(
            where,
            "atomic=True is for tenant jobs: a system job writes inside ctx.system_db(), on the "
            "project's connection, which is not the body's transaction under DB_ROLES.",
        )
    if triggers.get("per_tenant"):
        raise _fail(
            where,
            "atomic=True cannot be combined with per_tenant=True: the fan-out parent run "
            "enqueues its children instead of writing, so there is nothing to make atomic. "
            "Declare the per-tenant work as its own atomic job and enqueue it from the fan-out.",
        )
    if is_async(func):
        raise _fail(
            where,
            "atomic=True needs a synchronous body: an async body's queries (the async ORM) run "
            "on other connections, outside the run's transaction.",
        )
    # unsafe_raw stays on the body's connection; system_identity (ctx.act_as) switches no
    # connection. The other two switch the body to another login for their block.
    other = sorted(
        set(escape_hatch.grants if escape_hatch else ()) - {Grant.UNSAFE_RAW, Grant.SYSTEM_IDENTITY}
    )
    if other:
        raise _fail(
            where,
            f"atomic=True cannot be combined with the grant(s) {other}: with DB_ROLES their "
            "blocks run on other logins (global_writes: the tenant's writer; "
            "cross_tenant_reads: the other tenant's reader), outside the run's transaction. "
            "Move that work to a separate job.",
        )


def _unique_options(
    where: str, options: Mapping[str, Any], params: Sequence[str], triggers: Mapping[str, Any]
) -> tuple[tuple[str, ...] | None, float]:
    """``unique=`` and ``unique_for=`` (enqueueing/unique.py), checked against the job's
    arguments and the concurrency modes that would contradict them."""
    value, window = options.get("unique"), options.get("unique_for")
    if value is None or value is False:
        if window is not None:
            raise _fail(where, "unique_for= needs unique= (the arguments that make a run unique).")
        return None, 0.0
    if value is True:
        names: tuple[str, ...] = tuple(params)
    else:
        names = _names(where, "unique", value, params)
        if not names:
            raise _fail(
                where,
                "unique=[] names no argument; use unique=True (all arguments) or "
                "concurrency='skip' (one active run of the job per tenant, whatever its "
                "arguments).",
            )
    mode = triggers.get("concurrency", "parallel")
    if mode in ("replace", "debounce"):
        raise _fail(
            where,
            f"unique= returns the waiting run of the same arguments; concurrency={mode!r} "
            "cancels it for the newer enqueue. Choose one of the two.",
        )
    if triggers.get("boot_gate"):
        raise _fail(where, "boot_gate=True runs inline at worker start: unique= has no runs.")
    seconds = 0.0
    if window is not None:
        raw = window.total_seconds() if isinstance(window, timedelta) else window
        if isinstance(raw, bool) or not isinstance(raw, int | float) or not raw > 0:
            raise _fail(where, f"unique_for must be seconds > 0 or a timedelta, got {window!r}.")
        seconds = float(raw)
    return names, seconds


def _trigger_options(where: str, options: Mapping[str, Any], system: bool) -> dict[str, Any]:
    """cron, events, fan-out, concurrency and boot options, checked together."""
    out: dict[str, Any] = {}
    for flag in ("per_tenant", "run_on_boot", "boot_gate"):
        value = options.get(flag, False)
        if not isinstance(value, bool):
            raise _fail(where, f"{flag} must be True or False, got {value!r}.")
        out[flag] = value
    if system and out["per_tenant"]:
        raise _fail(where, "a job is either system=True (public schema) or per_tenant=True.")
    cron = options.get("cron")
    if cron is not None:
        out["cron"] = check_cron(where, cron, per_tenant=out["per_tenant"])
        out["timezone"] = check_timezone(where, options.get("timezone", "UTC"))
        if not (system or out["per_tenant"]):
            raise _fail(
                where,
                f"cron={cron!r} runs for no tenant: declare system=True (one run "
                "in the public schema) or per_tenant=True (one run per tenant).",
            )
    elif "timezone" in options:
        raise _fail(where, "timezone= only applies to cron jobs.")
    on = options.get("on", ())
    events = (on,) if isinstance(on, str) else on
    if not isinstance(events, Sequence) or not all(isinstance(e, str) and e for e in events):
        raise _fail(where, f"on= must be an event name or a list of names, got {on!r}.")
    out["on"] = tuple(events)
    where_filter = options.get("where", {})
    if not isinstance(where_filter, Mapping) or (where_filter and not events):
        raise _fail(where, "where= is an equality filter on event payloads: a dict, with on=.")
    out["where"] = dict(where_filter)
    mode = options.get("concurrency", "parallel")
    if mode not in CONCURRENCY_MODES:
        raise _fail(where, f"concurrency={mode!r}; use one of {CONCURRENCY_MODES}.")
    out["concurrency"] = mode
    debounce = options.get("debounce")
    if mode == "debounce":
        if isinstance(debounce, bool) or not isinstance(debounce, int | float) or debounce <= 0:
            raise _fail(where, "concurrency='debounce' needs debounce=<seconds > 0>.")
        out["debounce"] = float(debounce)
    elif debounce is not None:
        raise _fail(where, "debounce= needs concurrency='debounce'.")
    out["max_per_tenant"] = _int_option(where, "max_per_tenant", options.get("max_per_tenant"), 1)
    out["tenant_concurrency"] = _int_option(
        where, "tenant_concurrency", options.get("tenant_concurrency"), 1
    )
    if out["boot_gate"] and not system:
        raise _fail(
            where, "boot_gate=True runs once at worker start, for no tenant: declare system=True."
        )
    if out["run_on_boot"] and not (system or out["per_tenant"]):
        raise _fail(
            where,
            "run_on_boot=True enqueues without a tenant: declare system=True or per_tenant=True.",
        )
    limited = mode != "parallel" or out["max_per_tenant"] or out["tenant_concurrency"]
    if out["boot_gate"] and (out["per_tenant"] or limited or out["run_on_boot"]):
        # A boot gate is not enqueued: every worker runs it inline before its first message,
        # so there is no queue for a concurrency option to act on.
        raise _fail(
            where,
            "boot_gate=True runs inline at worker start; it cannot be combined "
            "with per_tenant, run_on_boot, concurrency=, max_per_tenant or tenant_concurrency.",
        )
    if cron is not None and mode == "debounce":
        # Debounce waits for a quiet period after a burst of enqueues; a schedule has no
        # bursts, and every tick would only be delayed and then replace its predecessor.
        raise _fail(
            where,
            "concurrency='debounce' coalesces bursts of enqueues; a cron schedule has none. "
            "Use 'skip' (drop a tick while the last one is active) or 'sequential'.",
        )
    return out


def _parse_failure(where: str, value: Any, params: Sequence[str]) -> FailureVisibility | None:
    if value is None:
        return None
    if not isinstance(value, Mapping) or set(value) - {"message_key", "subject_fields"}:
        raise _fail(
            where,
            "tenant_visible_failure must be {'message_key': 'app.key', 'subject_fields': [...]}.",
        )
    key = value.get("message_key")
    if not isinstance(key, str) or not key.strip():
        raise _fail(
            where, "tenant_visible_failure needs a message_key, e.g. 'billing.sync_failed'."
        )
    problem = message_key_problem(key)
    if problem is not None:
        raise _fail(where, f"tenant_visible_failure: {problem}.")
    fields = _names(
        where, "tenant_visible_failure['subject_fields']", value.get("subject_fields", ()), params
    )
    return FailureVisibility(message_key=key, subject_fields=fields)


def _default_name(module: str, func_name: str) -> str:
    """``"<app_label>.<function>"``: the app label of the app whose module holds the job."""
    best = None
    for config in apps.get_app_configs():
        inside = module == config.name or module.startswith(config.name + ".")
        if inside and (best is None or len(config.name) > len(best.name)):
            best = config
    label = best.label if best else module.rsplit(".", 1)[0].rsplit(".", 1)[-1]
    return f"{label}.{func_name}"
