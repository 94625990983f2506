"""Flow control through the outbox relay and the Django task backend (issue 24, "Done when").

The relay path: runs enqueued inside ``transaction.atomic()`` while Redis does not answer are
committed (their rows are the outbox) and not pushed; the relay (``relay_pending``, what every
worker's maintenance round runs) pushes them later from the rows. What the push would have
decided (the priority level, the rate-limit windows, the bucket a pause parks) must come out
of the row the same, and a unique key must hold while the run exists only as a row.

The task backend: a Django task's ``priority`` is a kumiko priority level (not RQ's
``at_front``), and rate limits (``TENANT_RATE_LIMIT``) and pauses (``manage.py kumiko_jobs
pause --job <task path>`` and ``--tenant``) apply to task runs as to any job's.

Real PostgreSQL, Redis and in-process RQ workers; order is read from the attempts' starts.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from uuid import UUID

import pytest
from django.conf import settings
from django.core.management import call_command
from django.db import transaction
from django.test import override_settings
from django_tenants.utils import schema_context

from kumiko_jobs import transport
from kumiko_jobs.enqueueing import outbox
from kumiko_jobs.models import JobAttempt, JobRun, RunStatus
from kumiko_jobs.worker import pauses
from kumiko_jobs.worker.relay import relay_pending
from tests.conftest import probes, work
from tests.integration.test_flow_end_to_end_scheduler import attempt_order
from tests.integration.test_rate_limits import most_in_any_window, start_times
from tests.integration.test_reliability import _unreachable_redis
from tests.testapp import jobs

pytestmark = pytest.mark.usefixtures("live_db")


@contextmanager
def redis_down() -> Iterator[None]:
    """Redis unreachable for this process's pushes (the queues point at a closed port): what
    commits inside stays a row. The push-failure pause is cleared afterwards, as a push that
    works would clear it."""
    try:
        with override_settings(RQ_QUEUES=_unreachable_redis()):
            yield
    finally:
        outbox.note_push_failed(None)
    assert transport.queue_length("default") == 0


def relay_all(expected: int) -> None:
    """One relay pass pushes every run that waits only as a row; a second pushes nothing."""
    outbox.note_push_failed(None)
    assert relay_pending(grace=0).pushed == expected
    assert relay_pending(grace=0).pushed == 0


def kumiko(**extra: Any) -> dict[str, Any]:
    return {**settings.KUMIKO_JOBS, **extra}


def test_relayed_runs_keep_priority_rate_limit_unique_key_and_pause(
    tenants: Any, redis_conn: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """In one request's transaction while Redis is down: a t1 backlog at priority 0, then a t1
    run at priority 5, twelve ``rate_probe`` runs (5/s), a unique run enqueued twice, and two
    runs of the paused tenant t3. The relay pushes each once; the priority-5 run starts before
    the backlog queued ahead of it, no window holds more than five rate-probe starts, the unique
    key held while the run was only a row (one run, one effect), and t3's runs wait, in order,
    until the resume.

    Proven able to fail, one mechanism at a time in the relay's ``message_for``: ``priority=0``
    instead of the row's (the priority-5 run starts behind the backlog); ``rates`` dropped
    (more than five starts in a window); ``unique_key`` left off the row in ``row_for``
    (two runs of the key); paused tenants left out of the dequeue's sets (``assert_pauses``:
    t3's runs start). It found that the relay pushed a batch in whatever order PostgreSQL
    returned the locked rows: t1's backlog ran low3, low2, low1, low0 (now ordered by
    enqueue)."""
    pauses.pause(tenant="t3")
    with override_settings(RQ_QUEUES=_unreachable_redis()), caplog.at_level(logging.WARNING):
        try:
            with transaction.atomic():
                for i in range(4):
                    jobs.probe.enqueue(tenant="t1", tag=f"low{i}")
                hi = jobs.probe.using(priority=5).enqueue(tenant="t1", tag="hi")
                for i in range(12):
                    jobs.rate_probe.enqueue(tenant="t1" if i % 2 else "t2", tag=f"r{i}")
                first = jobs.unique_sync.enqueue(tenant="t1", invoice_id=7, note="first")
                same_request = jobs.unique_sync.enqueue(tenant="t1", invoice_id=7, note="b")
                for i in range(2):
                    jobs.probe.enqueue(tenant="t3", tag=f"p{i}")
            # Committed and still only a row: a later request gets the same run.
            later_request = jobs.unique_sync.enqueue(tenant="t1", invoice_id=7, note="c")
        finally:
            outbox.note_push_failed(None)
    assert "committed but not pushed" in caplog.text
    assert same_request.deduplicated and same_request.run_id == first.run_id
    assert later_request.deduplicated and later_request.run_id == first.run_id
    assert transport.queue_length("default") == 0
    relay_all(4 + 1 + 12 + 1 + 2)

    work()
    t1 = [tag for tag, _ in attempt_order({jobs.probe.name})]  # t3 is paused: t1's only
    assert t1 == ["hi", "low0", "low1", "low2", "low3"], t1
    times = start_times(jobs.rate_probe.name)
    assert len(times) == 12 and most_in_any_window(times, 0.95) <= 5, times
    assert [(p.tag, p.note) for p in probes("t1") if p.tag == "unique-7"] == [("unique-7", "first")]
    waiting = JobRun.objects.filter(schema_name="t3")
    assert set(waiting.values_list("status", flat=True)) == {RunStatus.QUEUED}
    assert not JobAttempt.objects.filter(run__schema_name="t3").exists()
    assert pauses.paused_by_rule(waiting.first()) == "tenant t3"  # type: ignore[arg-type]

    pauses.resume(tenant="t3")
    work()
    assert [p.tag for p in probes("t3")] == ["p0", "p1"]
    assert set(JobRun.objects.values_list("status", flat=True)) == {RunStatus.SUCCEEDED}
    assert set(JobRun.objects.values_list("attempts", flat=True)) == {1}
    assert relay_pending(grace=0).pushed == 0
    assert transport.get_queue("default").count == 0
    assert hi.run_id in {r.run_id.hex for r in JobRun.objects.filter(priority=5)}


def test_a_relayed_paused_jobs_runs_are_held_and_run_once_after_resume(tenants: Any) -> None:
    """A job paused while its runs wait only as rows: relayed, they are held (other jobs run),
    and after the resume each runs once, in order.

    Proven able to fail: with paused jobs left out of the dequeue's sets (``assert_pauses``
    writing no jobs) the held runs start first."""
    pauses.pause(job=jobs.probe.name)
    with redis_down(), transaction.atomic():
        for i in range(3):
            jobs.probe.enqueue(tenant="t1", tag=f"held{i}")
        jobs.list_tags.enqueue(tenant="t1", tag="other-job")
    relay_all(4)
    work()
    assert [tag for tag, _ in attempt_order()] == ["other-job"]
    pauses.resume(job=jobs.probe.name)
    work()
    assert [tag for tag, _ in attempt_order()] == ["other-job", "held0", "held1", "held2"]
    assert set(JobRun.objects.values_list("attempts", flat=True)) == {1}


# --- the Django task backend ---------------------------------------------------------------


def _tasks() -> Any:
    pytest.importorskip("django.tasks")
    from tests.testapp import tasks as task_module

    return task_module


def test_a_tasks_priority_is_a_kumiko_level_not_the_front_of_the_queue(tenants: Any) -> None:
    """Django's ``priority`` orders a task among everything in its queue by level, FIFO within
    a level: 5 starts before t1's kumiko backlog queued ahead of it, 0 after that backlog, and
    -5, enqueued before the 0, last. RQ's ``at_front`` would start the -5 first.

    Proven able to fail: with ``front_by_priority`` not set on task jobs (``task_jobs._register``)
    the -5 and 5 are level 0 and start in their order of arrival."""
    tasks = _tasks()
    for i in range(2):
        jobs.probe.enqueue(tenant="t1", tag=f"low{i}")
    with schema_context("t1"):
        last = tasks.add.using(priority=-5).enqueue(5, 5)
        middle = tasks.add.enqueue(0, 0)
        first = tasks.add.using(priority=5).enqueue(9, 9)
    work()
    rows = JobRun.objects.filter(schema_name="t1").order_by("started_at")
    order = [r.payload.get("tag") or r.run_id.hex for r in rows]
    assert order == [first.id, "low0", "low1", middle.id, last.id], order
    levels = dict(JobRun.objects.values_list("pk", "priority"))
    assert [levels[UUID(r)] for r in (first.id, middle.id, last.id)] == [5, 0, -5]


def test_a_task_enqueued_while_redis_is_down_keeps_its_priority_through_the_relay(
    tenants: Any,
) -> None:
    """A task enqueued in a request's transaction while Redis is down: the relay pushes it from
    its row at the task's level, so it starts before the backlog queued ahead of it.

    Proven able to fail: with the relay passing ``priority=0`` instead of the row's level."""
    tasks = _tasks()
    with redis_down(), transaction.atomic():
        for i in range(3):
            jobs.probe.enqueue(tenant="t1", tag=f"low{i}")
        with schema_context("t1"):
            urgent = tasks.add.using(priority=8).enqueue(4, 4)
    relay_all(4)
    work()
    started = JobRun.objects.filter(schema_name="t1").order_by("started_at")
    assert started.first().run_id.hex == urgent.id  # type: ignore[union-attr]
    assert tasks.add.get_result(urgent.id).return_value == 8


def test_tenant_rate_limit_applies_to_task_runs(tenants: Any) -> None:
    """``TENANT_RATE_LIMIT = "3/s"``: nine task runs of t1 and three of t2 start at most three
    per window per tenant, and t2's are not held behind t1's.

    Proven able to fail: without the ``t:<bucket>`` window in ``messages.rates_of``, t1's
    nine start within one window."""
    tasks = _tasks()
    with override_settings(KUMIKO_JOBS=kumiko(TENANT_RATE_LIMIT="3/s")):
        with schema_context("t1"):
            for i in range(9):
                tasks.add.enqueue(i, 0)
        with schema_context("t2"):
            for i in range(3):
                tasks.add.enqueue(i, 100)
        work()
    for schema, count in (("t1", 9), ("t2", 3)):
        times = sorted(
            a.started_at.timestamp() for a in JobAttempt.objects.filter(run__schema_name=schema)
        )
        assert len(times) == count and most_in_any_window(times, 0.95) <= 3, (schema, times)
    t2_first = JobAttempt.objects.filter(run__schema_name="t2").order_by("started_at").first()
    t1_last = JobAttempt.objects.filter(run__schema_name="t1").order_by("started_at").last()
    assert t2_first is not None and t1_last is not None
    assert t2_first.started_at < t1_last.started_at  # t2 was not behind t1's window
    assert set(JobRun.objects.values_list("status", flat=True)) == {RunStatus.SUCCEEDED}


def command(*args: str) -> str:
    out = io.StringIO()
    call_command("kumiko_jobs", *args, stdout=out)
    return out.getvalue()


def test_pausing_a_task_job_and_a_tenant_holds_task_runs_until_resume(tenants: Any) -> None:
    """``kumiko_jobs pause --job tests.testapp.tasks.add`` holds that task's runs in every
    tenant while other work runs; ``pause --tenant t2`` holds t2's task runs; after the resumes
    each runs once, in order.

    Proven able to fail: with paused jobs left out of the dequeue's sets (``assert_pauses``
    writing no jobs) the task's runs start while paused."""
    tasks = _tasks()
    job = "tests.testapp.tasks.add"
    assert command("pause", "--job", job) == f"paused job {job}\n"
    with schema_context("t1"):
        held = [tasks.add.enqueue(i, 1) for i in range(2)]
    jobs.probe.enqueue(tenant="t1", tag="other")
    work()
    assert [tag for tag, _ in attempt_order()] == ["other"]
    assert set(
        JobRun.objects.filter(pk__in=[h.id for h in held]).values_list("status", flat=True)
    ) == {RunStatus.QUEUED}
    assert command("resume", "--job", job) == f"resumed job {job}\n"
    assert command("pause", "--tenant", "t2") == "paused tenant t2\n"
    with schema_context("t2"):
        t2_run = tasks.add.enqueue(2, 2)
    work()
    assert [p.tag for p in probes("t1") if p.tag.startswith("add")] == ["add 0+1", "add 1+1"]
    assert JobRun.objects.get(pk=t2_run.id).status == RunStatus.QUEUED
    assert command("resume", "--tenant", "t2") == "resumed tenant t2\n"
    work()
    assert [p.tag for p in probes("t2")] == ["add 2+2"]
    assert set(JobRun.objects.values_list("status", flat=True)) == {RunStatus.SUCCEEDED}
    assert set(JobRun.objects.values_list("attempts", flat=True)) == {1}


def test_a_rate_limit_by_argument_holds_per_value_for_relayed_runs(tenants: Any) -> None:
    """``rate_limit="2/h", rate_limit_by="account"``: three runs for account "a" (two
    tenants) and two for "b", enqueued while Redis is down and relayed. Each account gets its
    two starts (b is not held behind a's full window), a's third waits, queued, with no
    attempt, and says it waits for a rate limit.

    Proven able to fail: with the window keyed per job only (``rates_of`` without the
    ``:k:<value>`` part) only two runs start in all."""
    from kumiko_jobs.admin.display import RunDisplay
    from kumiko_jobs.worker import Worker

    with redis_down(), transaction.atomic():
        for i in range(3):
            jobs.per_account.enqueue(tenant="t1" if i % 2 else "t2", account="a", tag=f"a{i}")
        for i in range(2):
            jobs.per_account.enqueue(tenant="t1", account="b", tag=f"b{i}")
    relay_all(5)
    queue = transport.get_queue("default")
    Worker([queue], connection=queue.connection).work(max_jobs=4, max_idle_time=5)
    assert sorted(tag for tag, _ in attempt_order()) == ["a0", "a1", "b0", "b1"]
    waiting = JobRun.objects.get(payload__tag="a2")
    assert waiting.status == RunStatus.QUEUED and not waiting.attempt_set.exists()
    assert "waiting for a rate limit" in RunDisplay().status_label(waiting)
