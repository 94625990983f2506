"""What the dashboard pages show, as JSON-ready dicts: the request's filters, the history's
aggregates (history/stats.py) and the load Redis reports (transport/depths.py).

A chart's points that have ended are kept in Django's cache (``history_points``), so a refresh
reads the history of the current point only, the window's failure groups (the rollup's, and
the raw history after it: one statement), and the live parts (queues, workers, scheduler,
running runs) from Redis; the console's numbers are kept for ``CACHE_SECONDS``.
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlencode

from django.core.cache import cache
from django.utils import timezone

from ...core import project_settings
from ...history import console, failure_groups, shares, stats, tenant_rollup
from ...models import FlowPause
from ...transport import RedisError, depths, scheduler_liveness

# Kept this long (seconds; 0: computed on every request): the console's numbers, and the
# tenants' share of worker time, a sum over the whole window (not per point).
CACHE_SECONDS = {"console": 60, "worker_time": 60}
# A chart's point is kept once it ended this long ago: runs stamp their start and finish just
# before they commit, so a point this old gets no more rows.
SETTLED = timedelta(seconds=60)
# Off: every point is computed on every request (bench/dashboard_scale.py's cold figures).
POINT_CACHE = True
MAX_FILTER = 200
# A tenant's user decides what its console reads: at most the days its rollup keeps
# (history/tenant_rollup.py), a month.
MAX_CONSOLE_DAYS = tenant_rollup.CONSOLE_DAYS


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


def _point_key(window: stats.Window, scope: stats.Scope, start: datetime) -> str:
    who = _digest(scope.queue, scope.job, scope.tenant)
    # v2: points without their failures (the window's groups are read whole, failure_groups).
    step = int(window.step.total_seconds())
    return f"kumiko_jobs.dashboard.v2:{step}:{who}:{start.timestamp()}"


def history_points(window: stats.Window, scope: stats.Scope, now: datetime) -> list[dict[str, Any]]:
    """The window's points, oldest first. A point that ended more than ``SETTLED`` ago is read
    from the cache when it is there (and kept there once computed): only the points since the
    oldest one missing are queried, so a refresh reads the current point's runs, not the
    window's."""
    origin = stats.bucket_start(window, now)
    starts = [origin + n * window.step for n in range(int(window.span / window.step))]
    settled = [s for s in starts if s + window.step <= now - SETTLED] if POINT_CACHE else []
    keys = {s: _point_key(window, scope, s) for s in settled}
    found = cache.get_many(list(keys.values())) if keys else {}
    missing = [s for s in starts if keys.get(s) not in found]
    computed = stats.points(window, scope, missing[0], origin + window.span) if missing else {}
    keep = {keys[s]: computed[s.isoformat()] for s in missing if s in keys}
    if keep:
        cache.set_many(keep, int((window.span + window.step).total_seconds()))
    return [
        {
            "t": s.isoformat(),
            **(found[keys[s]] if keys.get(s) in found else computed[s.isoformat()]),
        }
        for s in starts
    ]


def window_failures(
    window: stats.Window, scope: stats.Scope, now: datetime
) -> list[dict[str, Any]]:
    """The window's failures by job and error type, the ``failure_groups.FAILURE_GROUPS`` most
    frequent, merged and ranked by the database (history/failure_groups.py: the rollup's
    buckets and the raw history after them), not kept with the points: a week holds
    thousands of (job, error, hour) groups, and the page shows 20."""
    since = stats.bucket_start(window, now)
    return failure_groups.failure_groups(window, scope, since, since + window.span)


def _digest(*parts: Any) -> str:
    # Filters are the operator's text, and memcached refuses spaces and long keys.
    return hashlib.sha256(repr(parts).encode()).hexdigest()


def operator_data(
    params: Any, runs_url: str, retry_url: str = "", *, pause_url: str = "", resume_url: str = ""
) -> dict[str, Any]:
    """Everything the operators' dashboard shows, for its filters (``params``). With
    ``retry_url`` (the bulk retry page, for operators who may use it), each failure group
    links to the retry of all its runs too; with ``pause_url`` (the pauses' add form) the
    page offers to pause a queue, a failing job or a backlogged tenant, and with
    ``resume_url`` (the pauses' list) to resume each pause in force."""
    window, scope = window_of(params), operator_scope(params)
    now = timezone.now()
    points = history_points(window, scope, now)
    failures = window_failures(window, scope, now)
    worker_time = _cached(
        f"kumiko_jobs.worker_time:{window.name}:{_digest(scope.queue, scope.job, scope.tenant)}",
        CACHE_SECONDS["worker_time"],
        lambda: shares.worker_time(window, scope, now),
    )
    for group in failures:
        group["link"] = failure_link(runs_url, group, scope)
        group["retry_link"] = failure_link(retry_url, group, scope) if retry_url else ""
    return {
        "generated_at": now.isoformat(),
        "filters": {
            "window": window.name,
            "queue": scope.queue,
            "job": scope.job,
            "tenant": params.get("tenant") or "",
        },
        "series": {
            "window": window.name,
            "step_seconds": window.step.total_seconds(),
            "points": points,
        },
        "failures": failures,
        "worker_time": worker_time,
        "backlog": shares.tenant_backlog(scope),
        "pauses": pauses_in_force(resume_url),
        "pause_url": pause_url,
        "running": shares.running_runs(),
        **live(now),
    }


# The pauses listed; more than this many in force is a flow-control policy, not an incident.
MAX_PAUSES_SHOWN = 50


def pauses_in_force(resume_url: str) -> list[dict[str, Any]]:
    """The pauses in force, newest first, each with its resume (the pause's delete page under
    ``resume_url``, the pauses' list; nothing without it)."""
    return [
        {
            "queue": p.queue,
            "job_name": p.job_name,
            "schema_name": p.schema_name,
            "paused_at": p.paused_at.isoformat(),
            "paused_by": p.paused_by,
            "resume_link": f"{resume_url}{p.pk}/delete/" if resume_url else "",
        }
        for p in FlowPause.objects.order_by("-paused_at")[:MAX_PAUSES_SHOWN]
    ]


def failure_link(runs_url: str, group: dict[str, Any], scope: stats.Scope) -> str:
    """The run list (or its bulk retry page) filtered to one failure group (job and error type),
    and the dashboard's tenant when one is chosen: a group of system runs (``system``) by the
    tenant they count for (``flow_schema``; ``""``: the system's own), as the group counted
    them."""
    query: dict[str, str] = {"status__exact": "failed", "job": group["job"]}
    query["error_type__exact"] = group["error_type"]
    if scope.tenant is not None and group.get("system"):
        query.update(tenant="-", flow_schema__exact=scope.tenant)
    elif scope.tenant is not None:
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


def console_data(schema: str, params: Any, runs_url: str = "") -> dict[str, Any]:
    """A tenant's console: its own days and jobs, for ``schema`` only. Only ``days`` and ``job``
    are read from ``params``; no parameter can name another schema. With ``runs_url`` (the run
    list on the tenant's domain) each job that failed links to its failed runs there
    (``failed_link``), where the tenant's members who may retry them do."""
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
        return console.console(schema, days, job, now)

    key = f"kumiko_jobs.console:{_digest(schema, days, job)}"
    numbers = _cached(key, CACHE_SECONDS["console"], build)
    jobs = [
        {**row, "failed_link": _failed_runs_link(runs_url, row) if runs_url else ""}
        for row in numbers.get("jobs", [])
    ]
    return {
        "generated_at": now.isoformat(),
        "filters": {"days": days, "job": job},
        **numbers,
        "jobs": jobs,
    }


def _failed_runs_link(runs_url: str, row: dict[str, Any]) -> str:
    # The tenant's own run list (its queryset is the domain's schema): no tenant parameter.
    if not row.get("failed"):
        return ""
    return f"{runs_url}?{urlencode({'job': row['job'], 'status__exact': 'failed'})}"
