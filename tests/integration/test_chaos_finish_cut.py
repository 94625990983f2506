"""A finish cut off: the run's effect committed, then its connection lost (issue 28).

The soak's plain duplicates were mostly not SIGKILLs: a worker whose session PostgreSQL ended
(``pg_terminate_backend``, a restart) or the network cut between the job's effect and the
commit of its success lost the finish, moved on, and left the run ``running``; the sweep then
abandoned it and a retry repeated the effect. The worker now asks the row on a new connection
and writes the finish again while the run still runs that attempt
(``run.steps.finish_retries.write_finish``).

An atomic run's success, recorded inside the body's transaction, met the same fault in the
soak: its session ended before the success function ran, and the run was failed for good
(``Unrecoverable``), as if the job had ended its own transaction. Nothing had committed (the
transaction died with the session), so it is now retried like any run whose database went away.

Here a real in-process worker runs a job that commits its effect and then has PostgreSQL end
the worker's own session (the real ``pg_terminate_backend``, nothing mocked): the finish, or
the atomic success, meets a dead connection.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any
from urllib.parse import unquote, urlparse

import pytest
from django.db import connection
from psycopg.conninfo import make_conninfo

from kumiko_jobs.history import transitions
from kumiko_jobs.models import JobAttempt, JobRun, RunStatus
from tests.conftest import probes, work
from tests.testapp import jobs

pytestmark = pytest.mark.usefixtures("live_db")


def _dsn(*, admin: bool = False) -> str:
    """The project's login (a role may end its own sessions), or with ``admin`` the suite's
    administrator where the suite runs as a non-superuser project user (tests/settings.py):
    a tenant login's session is another role's."""
    s = connection.settings_dict
    user, password = s["USER"], s["PASSWORD"] or ""
    admin_url = os.environ.get("KUMIKO_TEST_ADMIN_DATABASE_URL")
    if admin and admin_url:
        url = urlparse(admin_url)
        user, password = unquote(url.username or ""), unquote(url.password or "")
    return make_conninfo(
        host=s["HOST"] or "127.0.0.1",
        port=str(s["PORT"] or 5432),
        user=user,
        password=password,
        dbname=s["NAME"],
    )


def test_a_finish_whose_connection_was_lost_is_written_again(tenants: dict[str, Any]) -> None:
    connection.ensure_connection()
    history_pid = connection.connection.info.backend_pid  # the in-process worker's history
    handle = jobs.effect_then_history_lost.enqueue(
        tenant="t1", tag="finish-cut", history_pid=history_pid, dsn=_dsn()
    )
    work()

    connection.close()  # the test's own view: whatever the worker left, a new session
    run = JobRun.objects.get(pk=handle.run_id)
    attempts = list(
        JobAttempt.objects.filter(run=run).order_by("number").values_list("number", "outcome")
    )
    # The session was ended: the probe proves the body ran and the finish met a dead one.
    effects = [p.attempt for p in probes("t1") if p.tag == "finish-cut"]
    assert effects == [1]
    # Written again on a new connection: succeeded on the first attempt, nothing left running
    # for the sweep to abandon (and a retry to repeat the effect).
    assert (run.status, run.attempts) == (RunStatus.SUCCEEDED, 1), attempts
    assert attempts == [(1, "succeeded")]


def test_a_finish_that_had_committed_is_not_written_again(tenants: dict[str, Any]) -> None:
    handle = jobs.probe.enqueue(tenant="t1", tag="finish-committed")
    work()
    run = JobRun.objects.get(pk=handle.run_id)
    assert run.status == RunStatus.SUCCEEDED

    def write() -> None:
        raise AssertionError("written again over a committed finish")

    # The row no longer runs attempt 1: the lost reply's finish had committed.
    assert transitions.write_if_still_running(str(handle.run_id), 1, write) is False
    assert JobAttempt.objects.filter(run=run).count() == 1
    # ...and its own attempt row, by the finished_at it wrote, says it was this finish; another
    # time (an attempt row the sweep would have written) is not.
    finished_at = JobAttempt.objects.get(run=run).finished_at
    assert transitions.attempt_recorded(str(handle.run_id), 1, finished_at)
    later = finished_at + timedelta(microseconds=1)
    assert not transitions.attempt_recorded(str(handle.run_id), 1, later)
    assert not transitions.attempt_recorded(str(handle.run_id), 2, finished_at)


def test_an_atomic_success_whose_session_was_lost_is_retried(tenants: dict[str, Any]) -> None:
    handle = jobs.atomic_then_session_lost.enqueue(
        tenant="t1", tag="atomic-cut", dsn=_dsn(admin=True)
    )
    work(scheduler_rounds=2)  # the retry (no delay) goes through the scheduled set

    run = JobRun.objects.get(pk=handle.run_id)
    attempts = list(
        JobAttempt.objects.filter(run=run)
        .order_by("number")
        .values_list("number", "outcome", "error_type")
    )
    # The first attempt's transaction died with its session: no effect, and a retry, not a
    # final failure; the second attempt's effect and success committed together: once.
    assert [p.attempt for p in probes("t1") if p.tag == "atomic-cut"] == [2], attempts
    assert run.status == RunStatus.SUCCEEDED, attempts
    assert [(n, o) for n, o, _ in attempts] == [(1, "retrying"), (2, "succeeded")]
    assert attempts[0][2] == "OperationalError"
