"""System check of the worker class RQ starts: a plain RQ worker reads pickle and skips
kumiko's per-run hygiene (W001). Registered at import (``kumiko_jobs.checks`` imports this
module at start-up)."""

from __future__ import annotations

from typing import Any

from django.core import checks

from ..core import conf, project_settings
from ..core.checks import names_subclass
from .classes import ForkingWorker, Worker


@checks.register()
def check_worker_class(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """``RQ['WORKER_CLASS']`` should be kumiko's ``Worker`` or ``ForkingWorker`` (or a
    subclass); nothing while the settings cannot be read (E001 says why)."""
    if conf.get_or_none() is None:
        return []
    worker = project_settings.rq_option("WORKER_CLASS")
    if names_subclass(worker, Worker) or names_subclass(worker, ForkingWorker):
        return []
    return [
        checks.Warning(
            f"RQ['WORKER_CLASS'] is {worker!r}; a plain RQ worker reads pickle unless "
            "started with --serializer rq.serializers.JSONSerializer, and skips kumiko's "
            "per-run hygiene.",
            hint="Set RQ['WORKER_CLASS'] = 'kumiko_jobs.worker.Worker' (or ForkingWorker).",
            id="kumiko_jobs.W001",
        )
    ]
