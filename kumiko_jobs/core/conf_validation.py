"""The rules ``settings.KUMIKO_JOBS`` must meet: ``conf.py``'s validation, one rule a function.

``conf.py`` names every option and its default and is the one reader of the setting; this
module only judges a mapping it is handed. Each rule looks at the values given (defaults fill
in what a rule compares against), raises ``ImproperlyConfigured`` with the fix, or converts a
value in place (seconds to ``float``, a rate to ``Rate``, lists to lowered tuples). The rules
run in the order of ``RULES``, so of several mistakes the first one listed is reported.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from .rates import parse_rate

# Python's json module recurses per nesting level (about 1000 levels before RecursionError).
MAX_ARGUMENT_DEPTH_LIMIT = 500

_CHOICES: dict[str, tuple[str | None, ...]] = {
    "DB_GUARD": ("enforce", "log", "off"),
    "INACTIVE_TENANT": ("skip", "defer"),
    "TENANT_DELETION": ("purge", "anonymise"),
    "DB_POOLER": (None, "session", "transaction"),
    "FAIRNESS": ("tenant", "fifo"),
}
_POSITIVE_INTS = (
    "DEFAULT_TIMEOUT",
    "MAX_ENVELOPE_BYTES",
    "LOG_LINES_PER_ATTEMPT",
    "LOG_LINE_BYTES",
    "LOG_BYTES_PER_ATTEMPT",
    "MAX_FOLLOWUPS_PER_RUN",
    "MAX_FANOUT_TENANTS",
    "FANOUT_CHUNK_SIZE",
    "MAX_ARGUMENT_DEPTH",
    "WORKER_HEARTBEAT",
    "WORKER_DEAD_AFTER",
    "TIMEOUT_KILL_AFTER",
    "CANCEL_GRACE",
    "BOOT_GATE_TIMEOUT",
    "BOOT_GATE_WARN_AFTER",
    "MESSAGE_MAX_AGE",
    "DB_ROLE_POOL_SIZE",
    "WORKER_CONCURRENCY",
    "RELAY_ROWS_PER_ROUND",
)
_NON_NEGATIVE_INTS = (
    "DEFAULT_RETRIES",
    "MAX_RETRIES",
    "MAX_DEFERS",
    "RETENTION_DAYS",
    "FAILURE_RETENTION_DAYS",
    "ESCAPE_HATCH_RETENTION_DAYS",
    "RESULT_TTL",
    "FAILURE_TTL",
    "INACTIVE_TENANT_DEFER_SECONDS",
    "ESCAPE_HATCH_DEDUPE_SECONDS",
    "RUNNING_TIMEOUT_GRACE",
    "MAINTENANCE_INTERVAL",
    "RELAY_GRACE",
    "PUSH_FAILURE_PAUSE",
    "SCHEDULER_OVERDUE_AFTER",
    "CRON_CATCH_UP",
    "MAX_RESULT_BYTES",
    "PROGRESS_INTERVAL",
    "ADMIN_STATEMENT_TIMEOUT_MS",
)
_BOOLEANS = (
    "HOUSEKEEPING",
    "HISTORY_SYNCHRONOUS_COMMIT",
    "HISTORY_PREPARED_STATEMENTS",
    "DB_ROLES",
)

# Settings in seconds that take fractions: (lowest, highest, what the default is and does).
_SECONDS: dict[str, tuple[float, float, str]] = {
    "SCHEDULER_POLL": (
        0.0,
        60.0,
        "0.1 by default; 0 moves delayed messages only every rqscheduler --interval",
    ),
    "SCHEDULER_LOCK_TTL": (
        0.2,
        60.0,
        "1 by default: how long a killed rqscheduler holds up the others",
    ),
    "WAIT_RECHECK": (
        0.1,
        math.inf,
        "5 by default: how often handle.wait() reads the row without a signal",
    ),
}

# module.attribute, each part a Python identifier: what import_string can load.
_DOTTED_PATH = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")

_FUNCTION_NAME = re.compile(r"(?:[a-z_][a-z0-9_$]*\.)?[a-z_][a-z0-9_$]*")

# A rule: the values given (changed in place where it converts one) and every default.
Rule = Callable[[dict[str, Any], Mapping[str, Any]], None]


def validated(raw: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """The values of ``raw`` (a ``KUMIKO_JOBS`` setting) once every rule has passed, converted
    where a rule converts; ``defaults``: every known key and its default."""
    if not isinstance(raw, Mapping):
        raise ImproperlyConfigured("settings.KUMIKO_JOBS must be a dict.")
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in defaults:
            hint = difflib.get_close_matches(str(key).upper(), sorted(defaults), n=1)
            suggestion = f" Did you mean {hint[0]!r}?" if hint else ""
            raise ImproperlyConfigured(
                f"settings.KUMIKO_JOBS has an unknown key {key!r}.{suggestion} "
                f"Known keys: {', '.join(sorted(defaults))}."
            )
        values[key] = value
    for rule in RULES:
        rule(values, defaults)
    return values


def _choices(values: dict[str, Any], defaults: Mapping[str, Any]) -> None:
    for key, allowed in _CHOICES.items():
        if key in values and values[key] not in allowed:
            raise ImproperlyConfigured(
                f"settings.KUMIKO_JOBS[{key!r}] is {values[key]!r}; use one of {allowed}."
            )


def _integers(values: dict[str, Any], defaults: Mapping[str, Any]) -> None:
    for key in (*_POSITIVE_INTS, *_NON_NEGATIVE_INTS):
        if key not in values:
            continue
        value = values[key]
        minimum = 1 if key in _POSITIVE_INTS else 0
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ImproperlyConfigured(
                f"settings.KUMIKO_JOBS[{key!r}] must be an integer >= {minimum}, got {value!r}."
            )


def _names_and_flags(values: dict[str, Any], defaults: Mapping[str, Any]) -> None:
    key = "DEFAULT_QUEUE"
    if key in values and (not isinstance(values[key], str) or not values[key]):
        raise ImproperlyConfigured(f"settings.KUMIKO_JOBS[{key!r}] must be a queue name.")
    for key in _BOOLEANS:
        if not isinstance(values.get(key, True), bool):
            raise ImproperlyConfigured(f"settings.KUMIKO_JOBS[{key!r}] must be True or False.")


def _seconds(values: dict[str, Any], defaults: Mapping[str, Any]) -> None:
    """The fractional seconds, each within its range, as ``float``."""
    for key, (low, high, why) in _SECONDS.items():
        if key not in values:
            continue
        value = values[key]
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not low <= value <= high
        ):
            bounds = f"at least {low:g}" if high == math.inf else f"from {low:g} to {high:g}"
            raise ImproperlyConfigured(
                f"settings.KUMIKO_JOBS[{key!r}] must be a number of seconds, {bounds} ({why}), "
                f"got {value!r}."
            )
        values[key] = float(value)


def _bounds_between_settings(values: dict[str, Any], defaults: Mapping[str, Any]) -> None:
    """The settings that are bounded by another one (or by what Python can read)."""
    beat = values.get("WORKER_HEARTBEAT", defaults["WORKER_HEARTBEAT"])
    if values.get("WORKER_DEAD_AFTER", defaults["WORKER_DEAD_AFTER"]) < 2 * beat:
        # One late beat (a busy machine) must not make a live worker look dead.
        raise ImproperlyConfigured(
            "settings.KUMIKO_JOBS['WORKER_DEAD_AFTER'] must be at least twice "
            f"WORKER_HEARTBEAT ({beat} s)."
        )
    if values.get("MAX_ARGUMENT_DEPTH", 0) > MAX_ARGUMENT_DEPTH_LIMIT:
        # Deeper than this, json.loads / json.dumps themselves raise RecursionError.
        raise ImproperlyConfigured(
            "settings.KUMIKO_JOBS['MAX_ARGUMENT_DEPTH'] must be at most "
            f"{MAX_ARGUMENT_DEPTH_LIMIT}."
        )
    max_retries = values.get("MAX_RETRIES", defaults["MAX_RETRIES"])
    if values.get("DEFAULT_RETRIES", defaults["DEFAULT_RETRIES"]) > max_retries:
        raise ImproperlyConfigured(
            f"settings.KUMIKO_JOBS['DEFAULT_RETRIES'] is over MAX_RETRIES ({max_retries})."
        )


def _tenant_hooks(values: dict[str, Any], defaults: Mapping[str, Any]) -> None:
    """The settings that name a project's callable or field for its tenants."""
    queryset_path = values.get("TENANT_QUERYSET")
    if queryset_path is not None and (
        not isinstance(queryset_path, str) or "." not in queryset_path
    ):
        raise ImproperlyConfigured(
            "settings.KUMIKO_JOBS['TENANT_QUERYSET'] must be the dotted path of a callable "
            "returning a tenant queryset, or None."
        )
    membership = values.get("TENANT_MEMBERSHIP")
    if membership is not None and (
        not isinstance(membership, str) or not _DOTTED_PATH.fullmatch(membership)
    ):
        raise ImproperlyConfigured(
            "settings.KUMIKO_JOBS['TENANT_MEMBERSHIP'] must be the dotted path of a callable "
            "(user, tenant) -> bool, such as 'kumiko_jobs.core.audience.django_tenant_users' "
            f"for django-tenant-users, or None; got {membership!r}."
        )
    active_field = values.get("TENANT_ACTIVE_FIELD")
    if active_field is not None and not isinstance(active_field, str):
        raise ImproperlyConfigured(
            "settings.KUMIKO_JOBS['TENANT_ACTIVE_FIELD'] must be a field name or None."
        )
    weight_path = values.get("TENANT_WEIGHT")
    if weight_path is not None and (not isinstance(weight_path, str) or "." not in weight_path):
        raise ImproperlyConfigured(
            "settings.KUMIKO_JOBS['TENANT_WEIGHT'] must be the dotted path of a callable that "
            "takes a tenant's schema name and returns its weight (a number > 0), or None."
        )


def _tenant_limits(values: dict[str, Any], defaults: Mapping[str, Any]) -> None:
    """``TENANT_RATE_LIMIT`` (a rate, parsed here, or a callable's path), the metrics token and
    ``TENANT_CONCURRENCY``."""
    tenant_rate = values.get("TENANT_RATE_LIMIT")
    if tenant_rate is not None and not _is_dotted_path(tenant_rate):
        try:
            values["TENANT_RATE_LIMIT"] = parse_rate(tenant_rate)
        except ValueError as exc:
            raise ImproperlyConfigured(
                f"settings.KUMIKO_JOBS['TENANT_RATE_LIMIT']: {exc}; or the dotted path of a "
                "callable taking a tenant's schema name and returning such a rate or None "
                "(e.g. by plan); or None for no limit."
            ) from exc
    token = values.get("METRICS_TOKEN")
    if token is not None and (not isinstance(token, str) or not token or token != token.strip()):
        raise ImproperlyConfigured(
            "settings.KUMIKO_JOBS['METRICS_TOKEN'] must be a non-empty string without "
            "surrounding spaces (e.g. os.environ['KUMIKO_METRICS_TOKEN']), or None to keep the "
            "metrics page for operators' sessions only."
        )
    tc = values.get("TENANT_CONCURRENCY")
    if tc is not None and (isinstance(tc, bool) or not isinstance(tc, int) or tc < 1):
        raise ImproperlyConfigured(
            "settings.KUMIKO_JOBS['TENANT_CONCURRENCY'] must be None or an integer >= 1."
        )


def _name_lists(values: dict[str, Any], defaults: Mapping[str, Any]) -> None:
    """The lists of names, lowered into tuples: PostgreSQL functions, tables, sensitive keys."""
    if "GUARD_EXTRA_FUNCTIONS" in values:
        values["GUARD_EXTRA_FUNCTIONS"] = _function_names(values["GUARD_EXTRA_FUNCTIONS"])
    for key in ("EXTRA_SHARED_TABLES", "OPERATOR_RECORD_TABLES", "SENSITIVE_KEYS"):
        if key in values:
            seq = values[key]
            if not _is_list_of_strings(seq):
                raise ImproperlyConfigured(
                    f"settings.KUMIKO_JOBS[{key!r}] must be a list of strings."
                )
            # Relation names as PostgreSQL stores them (a quoted "Mixed_Case" keeps its case);
            # the older list and the keys are lowered, as documented.
            keep = key == "OPERATOR_RECORD_TABLES"
            values[key] = tuple(v if keep else v.lower() for v in seq)


RULES: tuple[Rule, ...] = (
    _choices,
    _integers,
    _names_and_flags,
    _seconds,
    _bounds_between_settings,
    _tenant_hooks,
    _tenant_limits,
    _name_lists,
)


def _is_list_of_strings(value: Any) -> bool:
    return isinstance(value, list | tuple | set | frozenset) and all(
        isinstance(v, str) for v in value
    )


def _function_names(raw: Any) -> tuple[str, ...]:
    """``GUARD_EXTRA_FUNCTIONS``: ``name`` or ``schema.name``, as PostgreSQL folds them."""
    if not _is_list_of_strings(raw):
        raise ImproperlyConfigured(
            "settings.KUMIKO_JOBS['GUARD_EXTRA_FUNCTIONS'] must be a list of function names "
            "such as ['unaccent', 'similarity', 'public.st_distance']."
        )
    names = tuple(v.strip().lower() for v in raw)
    for name in names:
        if not _FUNCTION_NAME.fullmatch(name):
            raise ImproperlyConfigured(
                f"settings.KUMIKO_JOBS['GUARD_EXTRA_FUNCTIONS'] has {name!r}: use a function "
                f"name ('unaccent') or a schema-qualified one ('extensions.unaccent'), without "
                f"parentheses or argument types."
            )
    return names


def _is_dotted_path(value: object) -> bool:
    """A dotted path ("myproject.plans.rate"), not a rate ("100/m"): names, dots, no slash."""
    return (
        isinstance(value, str)
        and "/" not in value
        and "." in value
        and all(part.isidentifier() for part in value.split("."))
    )
