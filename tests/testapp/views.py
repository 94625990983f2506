"""An ordinary task-status view, as a project would write one (test_task_results_by_id): it
asks the backend for the result whose id is in the URL, with no check of its own."""

from __future__ import annotations

from django.http import Http404, HttpRequest, JsonResponse
from django.tasks import TaskResultStatus, default_task_backend
from django.tasks.exceptions import TaskResultDoesNotExist

from kumiko_jobs.enqueueing.handle import RunHandle
from kumiko_jobs.models import JobRun


def task_status(request: HttpRequest, result_id: str) -> JsonResponse:
    try:
        result = default_task_backend.get_result(result_id)
    except TaskResultDoesNotExist:
        raise Http404("no such task result") from None
    body = {
        "status": str(result.status),
        "args": result.args,
        "kwargs": result.kwargs,
        "errors": [
            {"class": e.exception_class_path, "traceback": e.traceback} for e in result.errors
        ],
    }
    if result.status == TaskResultStatus.SUCCESSFUL:
        body["return_value"] = result.return_value
    return JsonResponse(body)


def run_status(request: HttpRequest, run_id: str) -> JsonResponse:
    try:
        row = RunHandle(run_id=run_id, job_name="", schema_name=None).refresh()
    except JobRun.DoesNotExist:
        raise Http404("no such run") from None
    return JsonResponse({"status": row.status, "result": row.result, "payload": row.payload})
