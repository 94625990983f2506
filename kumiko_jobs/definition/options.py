"""``@job``'s options: each one checked when the module that declares the job is imported.

A typo or a wrong type fails at start-up with a message that names the fix, never in a worker
at 3 a.m. This module turns the keyword arguments of ``@job`` into a ``JobDefinition`` (or an
``InvalidJob``); it holds no state. Single values are parsed by ``option_values.py``, the
options that only make sense together (triggers, concurrency, ``unique=``) checked by
``option_rules.py``; ``build_definition`` calls them in the order mistakes are reported.
"""

from __future__ import annotations

import difflib
import inspect
import re
from collections.abc import Callable, Mapping
from typing import Any

from django.apps import apps

from ..core.exceptions import InvalidJob
from ..core.grants import Grant
from . import option_values as parse
from .job import CONCURRENCY_MODES, PRIORITY_MAX, PRIORITY_MIN, EscapeHatch, JobDefinition
from .option_rules import trigger_options, unique_options

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
    "tenant_operable": "bool (False: only operators retry or cancel its runs)",
}


def is_async(func: Callable[..., Any]) -> bool:
    """An ``async def`` body (run through ``async_body.call_async``), which ``atomic=`` refuses."""
    return inspect.iscoroutinefunction(func)


def build_definition(func: Callable[..., Any], options: Mapping[str, Any]) -> JobDefinition:
    """Validate ``@job`` options for ``func`` and return its definition."""
    where = getattr(func, "__qualname__", repr(func))
    _refuse_unknown(where, options)
    params = _keyword_arguments(where, func)
    name, queue = _name_and_queue(where, func, options)
    escape_hatch = _kind_flags(where, options)
    system = bool(options.get("system", False))
    tenant_visible_run = parse.argument_names(
        where, "tenant_visible_run", options.get("tenant_visible_run", ()), params
    )
    failure = parse.failure_visibility(where, options.get("tenant_visible_failure"), params)
    if system and (tenant_visible_run or failure):
        raise parse.fail(where, "system jobs run for no tenant; drop tenant_visible_run/_failure.")
    tenant_may_start = bool(options.get("tenant_may_start", False))
    if tenant_may_start and not system:
        raise parse.fail(
            where,
            "tenant_may_start=True lets tenant runs start a system job; this job is a tenant "
            "job, which tenant runs start anyway. Drop the option, or declare system=True.",
        )
    description = options.get("description") or inspect.getdoc(func) or ""
    triggers = trigger_options(where, options, system)
    atomic = bool(options.get("atomic", False))
    if atomic:
        _check_atomic(where, func, system, escape_hatch, triggers)
    unique, unique_for = unique_options(where, options, params, triggers)
    return JobDefinition(
        name=name,
        func=func,
        queue=queue,
        retries=parse.bounded_retries(where, options.get("retries")),
        backoff=parse.backoff(where, options.get("backoff", "exponential")),
        timeout=parse.int_option(where, "timeout", options.get("timeout"), 1),
        tenant_visible_run=tenant_visible_run,
        tenant_visible_failure=failure,
        escape_hatch=escape_hatch,
        system=system,
        manual=bool(options.get("manual", False)),
        tenant_may_start=tenant_may_start,
        atomic=atomic,
        max_defers=parse.int_option(
            where, "max_defers", options.get("max_defers"), 0, maximum=MAX_DEFERS_LIMIT
        ),
        description=str(description).split("\n\n")[0],
        unique=unique,
        unique_for=unique_for,
        priority=parse.priority(where, options.get("priority", 0)),
        rate_limit=parse.rate(where, "rate_limit", options.get("rate_limit")),
        tenant_rate_limit=parse.rate(where, "tenant_rate_limit", options.get("tenant_rate_limit")),
        rate_limit_by=parse.rate_limit_by(where, options, params),
        tenant_operable=_tenant_operable(where, options, system),
        **triggers,
    )


def _refuse_unknown(where: str, options: Mapping[str, Any]) -> None:
    """An option ``@job`` does not know, with the closest one it does."""
    unknown = set(options) - set(_OPTION_TYPES)
    if unknown:
        hints = []
        for key in sorted(unknown):
            close = difflib.get_close_matches(key, list(_OPTION_TYPES), n=1)
            hints.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        raise parse.fail(
            where, f"unknown option {', '.join(hints)}. Options: {sorted(_OPTION_TYPES)}."
        )


def _keyword_arguments(where: str, func: Callable[..., Any]) -> list[str]:
    """The job's arguments after the context, which it must take first."""
    if not callable(func):
        raise InvalidJob(f"@job decorates a function, got {func!r}.")
    signature = inspect.signature(func)
    positional = [
        p
        for p in signature.parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    if not positional:
        raise parse.fail(
            where, "the job must take the context as first argument: def job(ctx, *, ...)."
        )
    return [p.name for p in signature.parameters.values()][1:]


def _name_and_queue(
    where: str, func: Callable[..., Any], options: Mapping[str, Any]
) -> tuple[str, str | None]:
    """The job's name (``"<app_label>.<function>"`` by default) and its queue (None: the
    default queue)."""
    module = getattr(func, "__module__", "") or ""
    name = options.get("name") or _default_name(module, func.__name__)
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise parse.fail(where, f"name={name!r} must match {_NAME_RE.pattern}.")
    queue = options.get("queue")
    if queue is not None and (
        not isinstance(queue, str) or not queue or len(queue) > QUEUE_MAX_LENGTH
    ):
        raise parse.fail(
            where,
            f"queue must be the name of an RQ_QUEUES entry (at most {QUEUE_MAX_LENGTH} "
            f"characters), got {queue!r:.120}.",
        )
    return name, queue


def _kind_flags(where: str, options: Mapping[str, Any]) -> EscapeHatch | None:
    """The yes-or-no options and the escape hatch, checked for their types."""
    for flag in ("system", "manual", "tenant_may_start", "atomic", "tenant_operable"):
        if not isinstance(options.get(flag, False), bool):
            raise parse.fail(where, f"{flag} must be True or False, got {options[flag]!r}.")
    escape_hatch = options.get("escape_hatch")
    if escape_hatch is not None and not isinstance(escape_hatch, EscapeHatch):
        raise parse.fail(where, "escape_hatch must be EscapeHatch(reason=..., grants=[...]).")
    return escape_hatch


def _tenant_operable(where: str, options: Mapping[str, Any], system: bool) -> bool:
    """``tenant_operable=`` (its type checked with the other flags): False only on a tenant job."""
    operable = bool(options.get("tenant_operable", True))
    if not operable and system:
        raise parse.fail(
            where,
            "tenant_operable=False keeps a tenant's members from retrying or cancelling its runs; "
            "a system job's runs belong to no tenant, so no member acts on them anyway. Drop "
            "the option.",
        )
    return operable


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
        raise parse.fail(
            where,
            "atomic=True is for tenant jobs: a system job writes inside ctx.system_db(), on the "
            "project's connection, which is not the body's transaction under DB_ROLES.",
        )
    if triggers.get("per_tenant"):
        raise parse.fail(
            where,
            "atomic=True cannot be combined with per_tenant=True: the fan-out parent run "
            "enqueues its children instead of writing, so there is nothing to make atomic. "
            "Declare the per-tenant work as its own atomic job and enqueue it from the fan-out.",
        )
    if is_async(func):
        raise parse.fail(
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
        raise parse.fail(
            where,
            f"atomic=True cannot be combined with the grant(s) {other}: with DB_ROLES their "
            "blocks run on other logins (global_writes: the tenant's writer; "
            "cross_tenant_reads: the other tenant's reader), outside the run's transaction. "
            "Move that work to a separate job.",
        )


def _default_name(module: str, func_name: str) -> str:
    """``"<app_label>.<function>"``: the app label of the app whose module holds the job."""
    best = None
    for config in apps.get_app_configs():
        inside = module == config.name or module.startswith(config.name + ".")
        if inside and (best is None or len(config.name) > len(best.name)):
            best = config
    label = best.label if best else module.rsplit(".", 1)[0].rsplit(".", 1)[-1]
    return f"{label}.{func_name}"
