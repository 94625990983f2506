"""``settings.KUMIKO_JOBS``: the library's own settings, validated once.

Every option kumiko_jobs has goes through this module, so that option names and defaults
live in one place (``KumikoSettings``) and their rules in one other (``conf_validation.py``,
which reads nothing): an unknown key is refused with a did-you-mean hint, a bad value with the
rule it breaks, and ``get_or_none`` lets code that runs while Django starts leave the report to
system check E001. Tests override the setting with Django's ``override_settings``
(the cache is cleared on ``setting_changed``). Settings kumiko_jobs reads but does not own
(Django's, RQ's, django-tenants') are project_settings.py's; these two modules are the only
readers of ``django.conf.settings``. The test hooks at the end read the environment, never a
setting, so that no deployment can switch them on by accident.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any, Literal

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver

from . import conf_validation
from .rates import Rate

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
    OPERATOR_RECORD_TABLES: tuple[str, ...] = ()
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
    RELAY_ROWS_PER_ROUND: int = 20_000
    HISTORY_SYNCHRONOUS_COMMIT: bool = True
    # The start and finish of every run as prepared statements on the project's connection
    # (history/prepared.py), with DB_ROLES on only. Off behind a transaction pooler that does not
    # keep them (PgBouncer before 1.22, or max_prepared_statements = 0).
    HISTORY_PREPARED_STATEMENTS: bool = True
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


def _validate(raw: Mapping[str, Any]) -> KumikoSettings:
    """``raw`` judged by the rules of ``conf_validation`` against the options declared above."""
    defaults = {f.name: f.default for f in dataclasses.fields(KumikoSettings)}
    return KumikoSettings(**conf_validation.validated(raw, defaults))


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
