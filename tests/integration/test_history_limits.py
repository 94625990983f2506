"""Text a job or an operator chooses is cut to its column's limit before it is written.

``history/transitions.py`` holds one bound per column. An exception's class name (the run's
and the attempt's ``error_type``, 200 characters) was written whole: a job raising an
exception with a longer name made its finish fail, and the run stayed ``running`` for the sweep.
A pause's author (``FlowPause.paused_by``, 150) was cut by the admin only, not by the command
line; a write origin's request path was cut by a number of its own.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import AnonymousUser
from django.http import HttpRequest, HttpResponse
from django.test import RequestFactory

from kumiko_jobs.history.transitions import ERROR_TYPE_LIMIT, ORIGIN_PATH_LIMIT, PAUSED_BY_LIMIT
from kumiko_jobs.models import FlowPause, JobAttempt, JobRun, RunStatus
from kumiko_jobs.origin import KumikoJobsMiddleware, request_origin
from kumiko_jobs.worker import pauses
from tests.conftest import work

JOB_PREFIX = "limits"
LONG_NAME = "Named" + "X" * 245  # 250 characters: past the 200 of error_type
LongNamed = type(LONG_NAME, (Exception,), {})


def raises_long_named(ctx: Any) -> None:
    raise LongNamed("its class name is longer than the column")


def test_an_error_type_longer_than_its_column_is_cut(tenants: dict[str, Any], declare) -> None:
    assert ERROR_TYPE_LIMIT == 200 < len(LONG_NAME)
    job = declare(raises_long_named)  # no retries: the attempt's failure is final
    handle = job.enqueue(tenant=tenants["t1"])
    work()

    run = JobRun.objects.get(pk=handle.run_id)
    # Recorded, not left running: the name cut to the column, the message whole.
    assert run.status == RunStatus.FAILED
    assert run.error_type == LONG_NAME[:ERROR_TYPE_LIMIT]
    assert "longer than the column" in run.error_message
    (attempt,) = JobAttempt.objects.filter(run=run)
    assert (attempt.outcome, attempt.error_type) == ("failed", LONG_NAME[:ERROR_TYPE_LIMIT])


def test_a_pause_by_a_long_name_is_cut(tenants: dict[str, Any]) -> None:
    who = "operator-" + "y" * 300
    assert pauses.pause(queue="default", by=who)  # as the command line passes it: whole
    try:
        assert FlowPause.objects.get(queue="default").paused_by == who[:PAUSED_BY_LIMIT]
        assert PAUSED_BY_LIMIT == 150
    finally:
        pauses.resume(queue="default")


def test_a_write_origin_keeps_the_path_to_its_limit() -> None:
    request = RequestFactory().get("/" + "p" * 400)
    request.user = AnonymousUser()
    seen: list[dict[str, Any] | None] = []

    def view(request: HttpRequest) -> HttpResponse:
        seen.append(request_origin())
        return HttpResponse()

    KumikoJobsMiddleware(view)(request)
    (origin,) = seen
    assert origin is not None and origin["anonymous"] is True
    assert origin["path"] == ("/" + "p" * 400)[:ORIGIN_PATH_LIMIT]
