"""System checks of what the enqueue path needs from the project: every job's queue is in
``RQ_QUEUES`` (E006) and reads and writes JSON (E010, W002 for queues no job uses), and a
``TENANT_RATE_LIMIT`` callable imports (E017).

Registered at import (``kumiko_jobs.checks`` imports this module at start-up). The jobs are the
registry's, read when the check runs.
"""

from __future__ import annotations

from typing import Any

from django.core import checks
from django.core.exceptions import ImproperlyConfigured

from .. import transport
from ..core import conf, project_settings
from ..definition.registry import registry
from .tenant_settings import import_rate_callable


@checks.register()
def check_job_queues(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """A ``TENANT_RATE_LIMIT`` callable that does not import (E017) and queues that are not in
    ``RQ_QUEUES`` (E006); nothing while the settings cannot be read (E001 says why)."""
    settings = conf.get_or_none()
    if settings is None:
        return []
    return [*_tenant_rate_errors(settings), *_queue_errors(settings.DEFAULT_QUEUE)]


def _tenant_rate_errors(settings: conf.KumikoSettings) -> list[checks.CheckMessage]:
    """A ``TENANT_RATE_LIMIT`` callable that cannot be imported fails here, at start-up, not at
    the first enqueue (E017)."""
    if not isinstance(settings.TENANT_RATE_LIMIT, str):
        return []
    try:
        import_rate_callable(settings.TENANT_RATE_LIMIT)
    except ImproperlyConfigured as exc:
        return [
            checks.Error(
                str(exc),
                hint="Fix settings.KUMIKO_JOBS['TENANT_RATE_LIMIT'] (see docs/settings.md).",
                id="kumiko_jobs.E017",
            )
        ]
    return []


def _queue_errors(default_queue: str) -> list[checks.CheckMessage]:
    known = set(project_settings.rq_queue_names())
    wanted: dict[str, list[str]] = {}
    for definition in registry:
        wanted.setdefault(definition.queue or default_queue, []).append(definition.name)
    errors: list[checks.CheckMessage] = []
    for queue, jobs in sorted(wanted.items()):
        if queue not in known:
            errors.append(
                checks.Error(
                    f"Queue {queue!r} used by {', '.join(jobs[:5])} is not in RQ_QUEUES.",
                    hint=f"Add RQ_QUEUES[{queue!r}] or change the job's queue=.",
                    id="kumiko_jobs.E006",
                )
            )
    if default_queue not in known and not errors:
        errors.append(
            checks.Error(
                f"KUMIKO_JOBS['DEFAULT_QUEUE'] is {default_queue!r}, which is not in RQ_QUEUES.",
                hint="Add it to RQ_QUEUES or set DEFAULT_QUEUE to one that is.",
                id="kumiko_jobs.E006",
            )
        )
    return errors


@checks.register()
def check_queue_serializers(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Every queue kumiko uses reads and writes JSON, in every process, django-rq's pages too.

    kumiko's own processes force JSON, but django-rq's views and any plain RQ tool load jobs
    with the queue's configured serializer, pickle by default: a job hash planted in Redis would
    run code in the web process when a queue page lists it.
    """

    try:
        default_queue = conf.get().DEFAULT_QUEUE
    except ImproperlyConfigured:
        return []  # reported by check_settings
    used = {default_queue, *((d.queue or default_queue) for d in registry)}
    errors: list[checks.CheckMessage] = []
    for name in project_settings.rq_queue_names():
        if transport.is_json_serializer(project_settings.rq_queue_config(name).get("SERIALIZER")):
            continue
        fix = f'Add "SERIALIZER": "{transport.JSON_SERIALIZER_PATH}" to RQ_QUEUES[{name!r}].'
        if name in used:
            errors.append(
                checks.Error(
                    f"RQ_QUEUES[{name!r}] has no JSON SERIALIZER: django-rq's pages and plain "
                    "RQ tools would unpickle what Redis holds for this kumiko queue.",
                    hint=fix,
                    id="kumiko_jobs.E010",
                )
            )
        else:
            errors.append(
                checks.Warning(
                    f"RQ_QUEUES[{name!r}] has no JSON SERIALIZER: django-rq's pages unpickle "
                    "its jobs, so whoever can write to that Redis can run code in the web "
                    "process.",
                    hint=fix,
                    id="kumiko_jobs.W002",
                )
            )
    return errors
