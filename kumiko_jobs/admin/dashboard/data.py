"""What the dashboard pages show, as JSON-ready dicts: the request's filters, the history's
aggregates (history/stats.py) and the load Redis reports (transport/depths.py).

The charts of a day or a week read up to a week of the history; they change slowly, so they
are kept in Django's cache for ``CACHE_SECONDS`` of their window while the live parts (queues,
workers, scheduler, running runs) are read on every refresh.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any
from urllib.parse import urlencode

from django.core.cache import cache
from django.utils import timezone

from ...core import project_settings
from ...history import stats
from ...transport import RedisError, depths, scheduler_liveness

# Seconds the history part is kept per window (and for the console); 0: computed every time.
CACHE_SECONDS = {"hour": 0, "day": 60, "week": 300, "console": 60}
MAX_FILTER = 200
# A tenant's user decides what its console reads: 90 days of a busy tenant (3 % of 10 million
# runs) took 2.4 s (bench/dashboard_scale.py), 14 days 0.3 s, so a month at most.
MAX_CONSOLE_DAYS = 30


class BadFilter(ValueError):
    """A dashboard parameter that cannot be used; the message names the fix."""


def window_of(params: Any) -> stats.Window:
    """The ``window`` parameter (hour, day or week; hour when absent)."""
    name = params.get("window") or "hour"
    if name not in stats.WINDOWS:
        raise BadFilter(f"window={name!r} is not one of: {', '.join(stats.WINDOWS)}.")
    return stats.WINDOWS[name]


def _text(params: Any, name: str, limit: int) -> str:
    value = str(params.get(name) or "")
    if "\x00" in value or len(value) > limit:
        raise BadFilter(f"{name} must be at most {limit} characters, without NUL.")
    return value


def operator_scope(params: Any) -> stats.Scope:
    """The operators' filters: ``queue`` (one of RQ_QUEUES), ``job``, ``tenant`` (a schema name,
    ``-`` for system runs), each optional."""
    queue = _text(params, "queue", MAX_FILTER)
    if queue and queue not in project_settings.rq_queue_names():
        names = ", ".join(project_settings.rq_queue_names())
        raise BadFilter(f"queue={queue!r} is not in RQ_QUEUES ({names}).")
    tenant = _text(params, "tenant", 63)
    return stats.Scope(
        queue=queue,
        job=_text(params, "job", MAX_FILTER),
        tenant=None if not tenant else ("" if tenant == "-" else tenant),
    )


def _cached(key: str, seconds: int, build: Any) -> Any:
    if not seconds:
        return build()
    found = cache.get(key)
    if found is None:
        found = build()
        cache.set(key, found, seconds)
    return found


def _scope_key(prefix: str, window: stats.Window, scope: stats.Scope) -> str:
    return f"kumiko_jobs.dashboard:{prefix}:{window.name}:{scope.queue}|{scope.job}|{scope.tenant}"


def operator_data(params: Any, runs_url: str) -> dict[str, Any]:
    """Everything the operators' dashboard shows, for its filters (``params``)."""
    window, scope = window_of(params), operator_scope(params)
    now = timezone.now()

    def history() -> dict[str, Any]:
        return {
            "series": stats.series(window, scope, now),
            "failures": stats.failures(window, scope, now),
            "worker_time": stats.worker_time(window, scope, now),
        }

    found = _cached(_scope_key("ops", window, scope), CACHE_SECONDS[window.name], history)
    for group in found["failures"]:
        group["link"] = failure_link(runs_url, group, scope)
    return {
        "generated_at": now.isoformat(),
        "filters": {
            "window": window.name,
            "queue": scope.queue,
            "job": scope.job,
            "tenant": params.get("tenant") or "",
        },
        **found,
        "backlog": stats.tenant_backlog(scope),
        "running": stats.running_runs(),
        **live(now),
    }


def failure_link(runs_url: str, group: dict[str, Any], scope: stats.Scope) -> str:
    """The run list filtered to one failure group (job and error type), and the dashboard's
    tenant when one is chosen."""
    query: dict[str, str] = {"status__exact": "failed", "job": group["job"]}
    query["error_type__exact"] = group["error_type"]
    if scope.tenant is not None:
        query["tenant"] = scope.tenant or "-"
    return f"{runs_url}?{urlencode(query)}"


def live(now: datetime) -> dict[str, Any]:
    """Queues, workers and the scheduler, from Redis; ``redis_error`` says why they are missing
    when Redis cannot be read (the history's parts still show)."""
    try:
        queues = depths.queue_depths()
        listed, total = depths.workers()
    except (RedisError, OSError) as exc:
        return {
            "queues": [],
            "workers": {"total": 0, "listed": []},
            "scheduler": "",
            "redis_error": str(exc),
        }
    return {
        "queues": [{"queue": q.queue, "waiting": q.waiting, "started": q.started} for q in queues],
        "workers": {"total": total, "listed": [_worker(w, now) for w in listed]},
        "scheduler": scheduler_liveness.overdue_problem(),
        "redis_error": "",
    }


def _worker(worker: depths.WorkerState, now: datetime) -> dict[str, Any]:
    def ago(moment: datetime | None) -> float | None:
        return None if moment is None else round((now - moment).total_seconds(), 1)

    return {
        "name": worker.name,
        "queues": list(worker.queues),
        "state": worker.state,
        "kumiko": worker.kumiko,
        "heartbeat_ago_s": ago(worker.last_heartbeat),
        "run_id": worker.run_id,
        "rq_job_id": worker.rq_job_id,
        "busy_for_s": ago(worker.busy_since) if worker.rq_job_id else None,
    }


def console_data(schema: str, params: Any) -> dict[str, Any]:
    """A tenant's console: its own days and jobs, for ``schema`` only. Only ``days`` and ``job``
    are read from ``params``; no parameter can name another schema."""
    refusal = f"days must be a whole number from 1 to {MAX_CONSOLE_DAYS}."
    try:
        days = int(params.get("days") or 14)
    except ValueError:
        raise BadFilter(refusal) from None
    if not 1 <= days <= MAX_CONSOLE_DAYS:
        raise BadFilter(refusal)
    job = _text(params, "job", MAX_FILTER)
    now = timezone.now()

    def build() -> dict[str, Any]:
        return {
            "days": stats.tenant_days(schema, days, job, now),
            "jobs": stats.tenant_failure_rates(schema, days, now),
        }

    key = f"kumiko_jobs.console:{schema}:{days}:{job}"
    return {
        "generated_at": now.isoformat(),
        "filters": {"days": days, "job": job},
        **_cached(key, CACHE_SECONDS["console"], build),
    }
