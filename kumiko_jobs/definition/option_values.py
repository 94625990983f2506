"""``@job``'s options one at a time: each parser checks one value and returns it in the form the
definition keeps (``Backoff``, ``Rate``, a tuple of argument names), or raises the
``InvalidJob`` that names the fix. ``options.py`` calls them in order; ``option_rules.py``
checks the options that only make sense together.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..core import conf
from ..core.exceptions import InvalidJob, message_key_problem
from ..core.rates import Rate, parse_rate
from .job import PRIORITY_MAX, PRIORITY_MIN, Backoff, FailureVisibility


def fail(func_name: str, message: str) -> InvalidJob:
    """The error of ``@job`` on ``func_name``, naming it first."""
    return InvalidJob(f"@job on {func_name}: {message}")


def backoff(where: str, value: Any) -> Backoff:
    """``backoff=``: "fixed", "exponential" or a dict of type, delay and max_delay."""
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
    raise fail(
        where,
        f"backoff={value!r} is not valid; use 'fixed', 'exponential' or "
        "{'type': 'fixed'|'exponential', 'delay': seconds >= 0, 'max_delay': seconds}.",
    )


def argument_names(where: str, option: str, value: Any, params: Sequence[str]) -> tuple[str, ...]:
    """A list of the job's keyword arguments (``tenant_visible_run``, ``unique``, ...)."""
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise fail(where, f"{option} must be a list of argument names, got {value!r}.")
    missing = [v for v in value if v not in params]
    if missing:
        raise fail(
            where,
            f"{option} names {missing}, which are not keyword arguments of the job "
            f"(it has {list(params)}).",
        )
    return tuple(value)


def int_option(
    where: str, option: str, value: Any, minimum: int, maximum: int | None = None
) -> int | None:
    """An integer option of at least ``minimum`` (and at most ``maximum``), or None."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise fail(where, f"{option} must be an integer >= {minimum}, got {value!r}.")
    if maximum is not None and value > maximum:
        raise fail(where, f"{option}={value} is over the upper bound {maximum}.")
    return value


def rate(where: str, option: str, value: Any) -> Rate | None:
    """``rate_limit=`` / ``tenant_rate_limit=``: "<starts>/<s|m|h>", or None."""
    if value is None:
        return None
    try:
        return parse_rate(value)
    except ValueError as exc:
        raise fail(where, f"{option}: {exc}.") from exc


def rate_limit_by(where: str, options: Mapping[str, Any], params: Sequence[str]) -> str | None:
    """The argument whose value keys ``rate_limit``'s window (one per external account...)."""
    name = options.get("rate_limit_by")
    if name is None:
        return None
    if options.get("rate_limit") is None:
        raise fail(where, "rate_limit_by= needs rate_limit= (the limit of each key's window).")
    if not isinstance(name, str) or name not in params:
        raise fail(
            where,
            f"rate_limit_by={name!r} must name a keyword argument of the job "
            f"(it has {list(params)}).",
        )
    return name


def priority(where: str, value: Any) -> int:
    """``priority=``: an integer from ``PRIORITY_MIN`` to ``PRIORITY_MAX``."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or not (PRIORITY_MIN <= value <= PRIORITY_MAX)
    ):
        raise fail(
            where,
            f"priority={value!r}; a priority is an integer from {PRIORITY_MIN} to {PRIORITY_MAX} "
            "(higher runs first within its queue, 0 is the default).",
        )
    return value


def bounded_retries(where: str, value: Any) -> int | None:
    """``retries=``: at least 0 and at most ``MAX_RETRIES`` (when the settings are valid)."""
    settings = conf.get_or_none()
    retries = int_option(where, "retries", value, 0)
    # Invalid settings: the bound is unknown, and check E001 stops every command that runs jobs.
    limit = settings.MAX_RETRIES if settings is not None else None
    if retries is not None and limit is not None and retries > limit:
        raise fail(
            where,
            f"retries={retries} is over KUMIKO_JOBS['MAX_RETRIES']={limit}. Retry less, or "
            "raise MAX_RETRIES if every attempt really can succeed where the last failed.",
        )
    return retries


def failure_visibility(where: str, value: Any, params: Sequence[str]) -> FailureVisibility | None:
    """``tenant_visible_failure=``: a message key and the arguments that name the subject."""
    if value is None:
        return None
    if not isinstance(value, Mapping) or set(value) - {"message_key", "subject_fields"}:
        raise fail(
            where,
            "tenant_visible_failure must be {'message_key': 'app.key', 'subject_fields': [...]}.",
        )
    key = value.get("message_key")
    if not isinstance(key, str) or not key.strip():
        raise fail(where, "tenant_visible_failure needs a message_key, e.g. 'billing.sync_failed'.")
    problem = message_key_problem(key)
    if problem is not None:
        raise fail(where, f"tenant_visible_failure: {problem}.")
    fields = argument_names(
        where, "tenant_visible_failure['subject_fields']", value.get("subject_fields", ()), params
    )
    return FailureVisibility(message_key=key, subject_fields=fields)
