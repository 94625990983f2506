"""RQ workers with per-run hygiene and JSON-only messages.

``Worker`` (the default, set ``RQ["WORKER_CLASS"] = "kumiko_jobs.worker.Worker"``) runs jobs in
the worker process like RQ's ``SimpleWorker``: about five times the throughput of forking
for short database jobs, because the connection is reused. Its cost is that a run could leak
state into the next one, so after every run it goes back to the public schema and drops
connections the run left unusable.

``ForkingWorker`` keeps RQ's fork-per-job isolation. The parent closes its database
connections before forking (a socket shared by two processes corrupts both), and the work
horse flushes telemetry before it exits.
"""

from __future__ import annotations

from typing import Any

from django.db import connections

from . import telemetry_flush
from .steps.tenancy import reset_connections
from .transport import ForkingWorkerBase, Serializer, SimpleWorkerBase


def _json_only(kwargs: dict[str, Any]) -> dict[str, Any]:
    # django-rq's rqworker passes --serializer (pickle by default); kumiko reads JSON only.
    kwargs["serializer"] = Serializer
    return kwargs


class Worker(SimpleWorkerBase):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **_json_only(kwargs))

    def execute_job(self, job: Any, queue: Any) -> None:
        try:
            super().execute_job(job, queue)
        finally:
            reset_connections()


class ForkingWorker(ForkingWorkerBase):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **_json_only(kwargs))

    def fork_work_horse(self, job: Any, queue: Any) -> None:
        connections.close_all()
        super().fork_work_horse(job, queue)

    def perform_job(self, job: Any, queue: Any, execution: Any) -> bool:
        try:
            return bool(super().perform_job(job, queue, execution))
        finally:
            if self.is_horse:
                telemetry_flush.flush()
                connections.close_all()
