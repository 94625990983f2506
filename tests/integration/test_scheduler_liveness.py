"""Delayed work overdue because no scheduler runs: the worker log, the admin and W003 say so.

Real Redis, rq-scheduler's own sorted set and a real RQ worker. A scheduled message is made
overdue the way a missing scheduler leaves it: due in the past and still in the set (its score
is moved back, instead of waiting SCHEDULER_OVERDUE_AFTER seconds). One scheduler round (what
``rqscheduler`` does every interval) moves it, and every report goes quiet.
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta

import pytest
from django.core import checks

from kumiko_jobs import transport
from kumiko_jobs.checks import check_scheduler_running
from kumiko_jobs.models import JobRun, RunStatus
from kumiko_jobs.transport.scheduler_liveness import RateLimitedWarning, overdue_problem
from tests.conftest import work
from tests.integration.test_admin import RUNS, client_for, make_user
from tests.testapp import jobs

pytestmark = pytest.mark.usefixtures("live_db")
SCHEDULED = transport.Scheduler.scheduled_jobs_key


def overdue_retry(redis_conn) -> JobRun:
    """A run whose retry waits in rq-scheduler's set, due ten minutes ago."""
    handle = jobs.probe.enqueue_in(timedelta(minutes=5), tenant="t1", tag="late")
    [job_id] = transport.scheduled_job_ids("default")
    redis_conn.zadd(SCHEDULED, {job_id: time.time() - 600})
    return JobRun.objects.get(pk=handle.run_id)


def test_nothing_scheduled_nothing_said(tenants):
    assert overdue_problem() == ""
    assert check_scheduler_running() == []


def test_work_not_yet_overdue_is_not_reported(tenants, redis_conn):
    # Due in five minutes: waiting, as it should; a scheduler has nothing to do yet.
    jobs.probe.enqueue_in(timedelta(minutes=5), tenant="t1", tag="later")
    assert transport.scheduled_job_ids("default")
    assert overdue_problem() == ""


def test_overdue_without_scheduler_is_reported_then_cleared_by_a_scheduler_round(
    tenants, redis_conn
):
    run = overdue_retry(redis_conn)
    assert run.status == RunStatus.QUEUED

    problem = overdue_problem()
    assert "1 scheduled message(s)" in problem and "no scheduler is running" in problem
    assert "manage.py rqscheduler" in problem
    [warning] = check_scheduler_running()
    assert warning.id == "kumiko_jobs.W003" and warning.level == checks.WARNING

    # What rqscheduler does once per interval: the message is moved, runs, nothing is overdue.
    assert transport.move_due_scheduled_jobs("default") == 1
    work()
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCEEDED
    assert overdue_problem() == ""
    assert check_scheduler_running() == []


def test_a_registered_but_idle_scheduler_gets_other_advice(tenants, redis_conn):
    overdue_retry(redis_conn)
    scheduler = transport.scheduler_for("default")
    scheduler.register_birth()  # alive (its key expires after its interval), but not moving
    try:
        problem = overdue_problem()
    finally:
        scheduler.register_death()
    assert "registered but does not move them" in problem


def test_the_threshold_comes_from_the_setting(tenants, redis_conn, settings):
    overdue_retry(redis_conn)  # 600 s late
    settings.KUMIKO_JOBS = {**settings.KUMIKO_JOBS, "SCHEDULER_OVERDUE_AFTER": 3600}
    assert overdue_problem() == ""
    settings.KUMIKO_JOBS = {**settings.KUMIKO_JOBS, "SCHEDULER_OVERDUE_AFTER": 0}  # off
    assert overdue_problem() == ""


def test_the_worker_log_says_it_once_per_period(tenants, redis_conn, caplog):
    overdue_retry(redis_conn)
    caplog.set_level(logging.WARNING, logger="kumiko_jobs.scheduler")
    # A real burst worker: its beat thread checks once when it starts.
    work()
    said = [r.getMessage() for r in caplog.records if r.name == "kumiko_jobs.scheduler"]
    assert len(said) == 1 and "no scheduler is running" in said[0], said

    # Rate limit: polled again and again, one warning per period; then "over" once.
    caplog.clear()
    warning = RateLimitedWarning(every=3600, check_every=0)
    for _ in range(5):
        warning.poll("w1")
    assert transport.move_due_scheduled_jobs("default") == 1
    warning.poll("w1")
    warning.poll("w1")
    said = [r.getMessage() for r in caplog.records if r.name == "kumiko_jobs.scheduler"]
    assert len(said) == 2, said
    assert "no scheduler is running" in said[0] and "none overdue" in said[1]


def test_admin_banner_for_operators_only(tenants, redis_conn):
    overdue_retry(redis_conn)
    operator = client_for("localhost", "public", make_user("public", "operator", superuser=True))
    clerk = client_for(
        "t1.localhost", "t1", make_user("t1", "clerk", perms=("view_jobrun", "view_jobfailure"))
    )
    page = operator.get(RUNS).content.decode()
    assert "Scheduler: 1 scheduled message(s)" in page and "no scheduler is running" in page
    # Tenants cannot start a scheduler and must not learn about the platform's queues.
    assert "Scheduler:" not in clerk.get(RUNS).content.decode()

    transport.move_due_scheduled_jobs("default")
    assert "Scheduler:" not in operator.get(RUNS).content.decode()
