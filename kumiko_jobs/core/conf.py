"""``settings.KUMIKO_JOBS``: the library's own settings, validated once.

Every option kumiko_jobs has goes through this module, so that option names, defaults and
validation live in one place: an unknown key is refused with a did-you-mean hint, a bad value
with the rule it breaks, and ``get_or_none`` lets code that runs while Django starts leave the
report to system check E001. Tests override the setting with Django's ``override_settings``
(the cache is cleared on ``setting_changed``). Settings kumiko_jobs reads but does not own
(Django's, RQ's, django-tenants') are project_settings.py's; these two modules are the only
readers of ``django.conf.settings``. The test hooks at the end read the environment, never a
setting, so that no deployment can switch them on by accident.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any, Literal

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver

from .rates import Rate, parse_rate

GuardMode = Literal["enforce", "log", "off"]
InactiveTenantPolicy = Literal["skip", "defer"]
TenantDeletionPolicy = Literal["purge", "anonymise"]
FairnessMode = Literal["tenant", "fifo"]

DEFAULT_SENSITIVE_KEYS = (
    "password",
    "passwd",
    "secret",
    "token",
    "api_key",
    "apikey",
    "authorization",
    "cookie",
    "session",
    "credit_card",
    "iban",
    "private_key",
    "access_key",
    "credential",
)


# Python's json module recurses per nesting level (about 1000 levels before RecursionError).
MAX_ARGUMENT_DEPTH_LIMIT = 500


@dataclass(frozen=True, slots=True)
class KumikoSettings:
    """``settings.KUMIKO_JOBS``, validated. Every key is documented in docs/settings.md."""

    DB_GUARD: GuardMode = "enforce"
    DEFAULT_QUEUE: str = "default"
    DEFAULT_RETRIES: int = 0
    DEFAULT_TIMEOUT: int = 600
    MAX_DEFERS: int = 20
    RETENTION_DAYS: int = 30
    RESULT_TTL: int = 60
    FAILURE_TTL: int = 7 * 24 * 3600
    TENANT_ACTIVE_FIELD: str | None = None
    INACTIVE_TENANT: InactiveTenantPolicy = "skip"
    INACTIVE_TENANT_DEFER_SECONDS: int = 300
    EXTRA_SHARED_TABLES: tuple[str, ...] = ()
    SENSITIVE_KEYS: tuple[str, ...] = DEFAULT_SENSITIVE_KEYS
    MAX_ENVELOPE_BYTES: int = 512 * 1024
    ESCAPE_HATCH_DEDUPE_SECONDS: int = 60
    TENANT_CONCURRENCY: int | None = None
    TENANT_QUERYSET: str | None = None
    HOUSEKEEPING: bool = True
    RUNNING_TIMEOUT_GRACE: int = 60
    TIMEOUT_KILL_AFTER: int = 10
    # Seconds a forking worker's work horse gets to end a cancelled run itself before it is
    # killed (docs/reliability.md, Cancellation).
    CANCEL_GRACE: int = 10
    # Seconds one attempt of a boot gate may run (it runs before RQ's own timeouts apply), and
    # after which a warning says the worker is still waiting for it.
    BOOT_GATE_TIMEOUT: int = 60
    BOOT_GATE_WARN_AFTER: int = 10
    # Retention beyond runs (history/retention.py): unresolved tenant-visible failures (0 keeps them
    # until a success resolves them) and escape-hatch audit rows; a deleted tenant's history.
    FAILURE_RETENTION_DAYS: int = 0
    ESCAPE_HATCH_RETENTION_DAYS: int = 365
    TENANT_DELETION: TenantDeletionPolicy = "purge"
    LOG_LINES_PER_ATTEMPT: int = 200
    LOG_LINE_BYTES: int = 4096
    LOG_BYTES_PER_ATTEMPT: int = 256 * 1024
    MAX_FOLLOWUPS_PER_RUN: int = 1000
    MAX_RETRIES: int = 100
    MAX_FANOUT_TENANTS: int = 100_000
    # Tenants a fan-out reads, inserts (one statement) and pushes (one pipeline) at a time.
    FANOUT_CHUNK_SIZE: int = 1000
    MAX_ARGUMENT_DEPTH: int = 32
    # A killed worker's run restarts within WORKER_DEAD_AFTER + WORKER_HEARTBEAT seconds (the
    # maintenance thread looks for expired beat keys every beat: worker/maintenance.py).
    WORKER_HEARTBEAT: int = 1
    WORKER_DEAD_AFTER: int = 6
    MAINTENANCE_INTERVAL: int = 10
    RELAY_GRACE: int = 30
    HISTORY_SYNCHRONOUS_COMMIT: bool = True
    PUSH_FAILURE_PAUSE: int = 5
    # Seconds past its due time a scheduled message (retry, enqueue_in, deferral, cron tick)
    # may wait before the worker log, the admin and check W003 say that no scheduler moves it
    # (rqscheduler moves due messages every --interval seconds, 60 by default). 0: never say.
    SCHEDULER_OVERDUE_AFTER: int = 120
    # Seconds between two looks of ``rqscheduler`` (transport.Scheduler) at the earliest due
    # time between its --interval rounds, so that delays are honoured to the millisecond
    # instead of to the next round (docs/settings.md, "How precise delays are"). 0: rounds only.
    SCHEDULER_POLL: float = 0.1
    # Seconds rq-scheduler's lock lives unless its live holder renews it (transport/
    # scheduler_lock.py): a scheduler killed inside its round holds up the others this long
    # (rq-scheduler's own expiry was --interval + 10 s, and the ticks in between were lost).
    SCHEDULER_LOCK_TTL: float = 1.0
    # An alarm rung at most this many seconds late fires every tick it passed, each once (a
    # scheduler hand-over); later than that, only the latest tick (an outage of every scheduler).
    CRON_CATCH_UP: int = 5
    # Seconds after its due time a signed message is refused (core/envelope.py). Seven days: a
    # weekend-plus outage's backlog still runs, while a copy of an old message is useless well
    # before RETENTION_DAYS deletes the run it belonged to (checks.py keeps it below that).
    MESSAGE_MAX_AGE: int = 7 * 24 * 3600
    GUARD_EXTRA_FUNCTIONS: tuple[str, ...] = ()
    # Bytes of JSON a job's return value may take on its run (history/results.py); 0 keeps none.
    MAX_RESULT_BYTES: int = 64 * 1024
    # Seconds between two writes of a running run's ctx.progress() to its row (run/progress.py);
    # the last report is written with the finish in any case. 0: only with the finish.
    PROGRESS_INTERVAL: int = 5
    # Seconds a handle.wait() blocks on the done signal before it reads the row again anyway
    # (enqueueing/waiting.py): the bound for runs that end outside a worker's finish.
    WAIT_RECHECK: float = 5.0
    # The second wall (docs/guard.md, "Two walls"): tenant job bodies log in as their tenant's
    # PostgreSQL role. Off by default: turning it on needs the operator's set-up steps.
    DB_ROLES: bool = False
    # Per-tenant connections a worker keeps open (least recently used closed first).
    DB_ROLE_POOL_SIZE: int = 32
    # What sits between Django and PostgreSQL: None (a direct connection), "session" or
    # "transaction" (PgBouncer's pool modes). Transaction pooling shares server sessions
    # between clients; checks.py refuses it where that crosses tenants.
    DB_POOLER: str | None = None
    # Who belongs to a tenant, for the admin on that tenant's domain (core/audience.py): the
    # dotted path of a callable ``(user, tenant) -> bool``. Needed when users are shared (the
    # user model's app is not in TENANT_APPS); without it a tenant's domain shows no runs and
    # check E014 says so. "kumiko_jobs.core.audience.django_tenant_users" reads
    # django-tenant-users' layout.
    TENANT_MEMBERSHIP: str | None = None
    # Milliseconds PostgreSQL lets each statement of an admin list (and of a search, the
    # autocomplete's too) run before it cancels it (admin/query_strings.py); 0: no timeout.
    ADMIN_STATEMENT_TIMEOUT_MS: int = 5000
    # Which message a worker takes next (docs/design.md, "Flow control: the fair dequeue"):
    # "tenant" shares the workers' time fairly between tenants; "fifo" is arrival order.
    FAIRNESS: FairnessMode = "tenant"
    # Dotted path of a callable (schema name -> weight > 0) giving tenants their share of
    # worker time; None: every tenant weighs 1.
    TENANT_WEIGHT: str | None = None
    # Runs one in-process worker (``kumiko_jobs.worker.Worker``) executes at once, each in a
    # slot of its own (worker/slots.py; docs/design.md, "Slots"). 1: one at a time, as RQ.
    # ``KUMIKO_JOBS_WORKER_CONCURRENCY`` in the environment overrides it (worker_concurrency).
    WORKER_CONCURRENCY: int = 1
    # A rate limit per tenant across all its jobs ("100/m": at most 100 starts in any minute;
    # docs/design.md, "Flow control: rate limits"), parsed at load; or the dotted path of a
    # callable (schema name -> "100/m" or None), resolved at every push as TENANT_WEIGHT is;
    # None: no such limit.
    TENANT_RATE_LIMIT: Rate | str | None = None
    # A secret a scraper sends as ``Authorization: Bearer <token>`` to read the metrics page
    # without an operator's session (admin/dashboard/metrics_access.py); None: operators only.
    METRICS_TOKEN: str | None = None


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


def _seconds(key: str, value: Any, low: float, high: float, why: str) -> float:
    """``value`` as seconds within [low, high], or the error that names the range."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        bounds = f"at least {low:g}" if high == math.inf else f"from {low:g} to {high:g}"
        raise ImproperlyConfigured(
            f"settings.KUMIKO_JOBS[{key!r}] must be a number of seconds, {bounds} ({why}), "
            f"got {value!r}."
        )
    return float(value)


def _validate(raw: Mapping[str, Any]) -> KumikoSettings:
    if not isinstance(raw, Mapping):
        raise ImproperlyConfigured("settings.KUMIKO_JOBS must be a dict.")
    known = {f.name for f in dataclasses.fields(KumikoSettings)}
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in known:
            hint = difflib.get_close_matches(str(key).upper(), sorted(known), n=1)
            suggestion = f" Did you mean {hint[0]!r}?" if hint else ""
            raise ImproperlyConfigured(
                f"settings.KUMIKO_JOBS has an unknown key {key!r}.{suggestion} "
                f"Known keys: {', '.join(sorted(known))}."
            )
        values[key] = value
    for key, allowed in _CHOICES.items():
        if key in values and values[key] not in allowed:
            raise ImproperlyConfigured(
                f"settings.KUMIKO_JOBS[{key!r}] is {values[key]!r}; use one of {allowed}."
            )
    for key in (*_POSITIVE_INTS, *_NON_NEGATIVE_INTS):
        if key not in values:
            continue
        value = values[key]
        minimum = 1 if key in _POSITIVE_INTS else 0
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ImproperlyConfigured(
                f"settings.KUMIKO_JOBS[{key!r}] must be an integer >= {minimum}, got {value!r}."
            )
    for key in ("DEFAULT_QUEUE",):
        if key in values and (not isinstance(values[key], str) or not values[key]):
            raise ImproperlyConfigured(f"settings.KUMIKO_JOBS[{key!r}] must be a queue name.")
    for key in ("HOUSEKEEPING", "HISTORY_SYNCHRONOUS_COMMIT", "DB_ROLES"):
        if not isinstance(values.get(key, True), bool):
            raise ImproperlyConfigured(f"settings.KUMIKO_JOBS[{key!r}] must be True or False.")
    for key, (low, high, why) in _SECONDS.items():
        if key in values:
            values[key] = _seconds(key, values[key], low, high, why)
    defaults = {f.name: f.default for f in dataclasses.fields(KumikoSettings)}
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
    if "GUARD_EXTRA_FUNCTIONS" in values:
        values["GUARD_EXTRA_FUNCTIONS"] = _function_names(values["GUARD_EXTRA_FUNCTIONS"])
    for key in ("EXTRA_SHARED_TABLES", "SENSITIVE_KEYS"):
        if key in values:
            seq = values[key]
            if not isinstance(seq, list | tuple | set | frozenset) or not all(
                isinstance(v, str) for v in seq
            ):
                raise ImproperlyConfigured(
                    f"settings.KUMIKO_JOBS[{key!r}] must be a list of strings."
                )
            values[key] = tuple(v.lower() for v in seq)
    return KumikoSettings(**values)


# module.attribute, each part a Python identifier: what import_string can load.
_DOTTED_PATH = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")

_FUNCTION_NAME = re.compile(r"(?:[a-z_][a-z0-9_$]*\.)?[a-z_][a-z0-9_$]*")


def _function_names(raw: Any) -> tuple[str, ...]:
    """``GUARD_EXTRA_FUNCTIONS``: ``name`` or ``schema.name``, as PostgreSQL folds them."""
    if not isinstance(raw, list | tuple | set | frozenset) or not all(
        isinstance(v, str) for v in raw
    ):
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


@cache
def get() -> KumikoSettings:
    """The validated ``KUMIKO_JOBS`` settings (raises ``ImproperlyConfigured`` when invalid)."""
    return _validate(getattr(settings, "KUMIKO_JOBS", {}))


def get_or_none() -> KumikoSettings | None:
    """The settings, or None while they are invalid.

    For code that runs while Django starts (the app's ready(), ``@job`` at import time): a
    broken ``KUMIKO_JOBS`` is reported by the system check ``kumiko_jobs.E001`` as one clean
    error, not as a traceback out of whichever import met it first. Everything that runs jobs
    calls ``get()`` and still raises.
    """
    try:
        return get()
    except ImproperlyConfigured:
        return None


CONCURRENCY_ENV = "KUMIKO_JOBS_WORKER_CONCURRENCY"


def worker_concurrency() -> int:
    """The slots of an in-process worker: ``KUMIKO_JOBS_WORKER_CONCURRENCY`` from the worker's
    environment when set (``KUMIKO_JOBS_WORKER_CONCURRENCY=8 manage.py rqworker``: django-rq's
    command takes no options of ours), else ``WORKER_CONCURRENCY``."""
    raw = os.environ.get(CONCURRENCY_ENV, "").strip()
    if not raw:
        return get().WORKER_CONCURRENCY
    if not raw.isdigit() or int(raw) < 1:
        raise ImproperlyConfigured(
            f"{CONCURRENCY_ENV}={raw!r}: expected an integer >= 1 (the runs one worker process "
            "executes at once); unset it to use KUMIKO_JOBS['WORKER_CONCURRENCY']."
        )
    return int(raw)


@receiver(setting_changed)
def _reset(*, setting: str, **_: object) -> None:
    """Forget the validated settings when a test overrides ``KUMIKO_JOBS``.

    The other projects' settings (project_settings.py) and the transport's queues forget
    themselves through their own receivers.
    """
    if setting == "KUMIKO_JOBS":
        get.cache_clear()


# --- test hooks (environment, never settings: a deployment cannot switch them on by accident) ---

CRASH_HOOK_ENV = "KUMIKO_JOBS_TEST_CRASH_BEFORE_OUTCOME"


@dataclass(frozen=True)
class CrashHook:
    """Make the worker ``os._exit`` after a successful body, before its outcome commits."""

    probability: float  # of a successful run, 0 < p <= 1
    log_path: str  # each crash appends its run id here before exiting ("" = nowhere)


@cache
def crash_hook() -> CrashHook | None:
    """``KUMIKO_JOBS_TEST_CRASH_BEFORE_OUTCOME="<probability>[:<log file>]"`` (tests, the soak):
    the point where a crash duplicates the effect of a job that is not ``atomic`` (docs/
    reliability.md). Read once per process."""
    raw = os.environ.get(CRASH_HOOK_ENV, "").strip()
    if not raw:
        return None
    text, _, log_path = raw.partition(":")
    try:
        probability = float(text)
    except ValueError:
        probability = -1.0
    if not 0 < probability <= 1:
        raise ImproperlyConfigured(
            f"{CRASH_HOOK_ENV}={raw!r}: expected a probability in (0, 1], optionally followed by "
            f"':<file>' to log each crash's run id, e.g. '0.01:/tmp/crashes.log'; unset it to "
            "switch the hook off."
        )
    return CrashHook(probability, log_path)


def _is_dotted_path(value: object) -> bool:
    """A dotted path ("myproject.plans.rate"), not a rate ("100/m"): names, dots, no slash."""
    return (
        isinstance(value, str)
        and "/" not in value
        and "." in value
        and all(part.isidentifier() for part in value.split("."))
    )
