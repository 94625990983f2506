"""Pause and resume through real RQ workers on real Redis and PostgreSQL (worker/pauses.py,
transport/pausing.py, the dequeue script's eligibility).

Every test runs the messages for real and reads the history rows: what ran, in which order,
how many attempts, and that nothing is left in Redis.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from django.core.management import CommandError, call_command

from kumiko_jobs import transport
from kumiko_jobs.models import FlowPause, JobRun, RunStatus
from kumiko_jobs.worker import pauses
from kumiko_jobs.worker.relay import relay_pending
from tests.conftest import work
from tests.integration.test_fair_dequeue import starts
from tests.testapp import jobs

pytestmark = pytest.mark.usefixtures("live_db")


def statuses(schema: str) -> list[str]:
    return list(
        JobRun.objects.filter(schema_name=schema)
        .order_by("queued_at")
        .values_list("status", flat=True)
    )


def command(*args: str) -> str:
    out = io.StringIO()
    call_command("kumiko_jobs", *args, stdout=out)
    return out.getvalue()


def test_a_paused_tenant_waits_in_order_and_resumes_where_it_was(tenants):
    queue = transport.get_queue("default")
    assert command("pause", "--tenant", "t1") == "paused tenant t1\n"
    for i in range(3):
        jobs.probe.enqueue(tenant="t1", tag=f"p{i}")
        jobs.probe.enqueue(tenant="t2", tag=f"q{i}")
    work()
    assert statuses("t2") == ["succeeded"] * 3
    assert statuses("t1") == ["queued"] * 3
    assert queue.count == 3  # RQ still counts them as waiting
    assert relay_pending(grace=0).pushed == 0  # RQ holds them: nothing to push again
    run = JobRun.objects.filter(schema_name="t1").first()
    assert run is not None and pauses.paused_by_rule(run) == "tenant t1"

    jobs.probe.enqueue(tenant="t1", tag="p3")  # a new arrival of a paused tenant waits too
    work()
    assert statuses("t1") == ["queued"] * 4

    assert command("resume", "--tenant", "t1") == "resumed tenant t1\n"
    work()
    assert statuses("t1") == ["succeeded"] * 4
    assert [tag for schema, tag in starts() if schema == "t1"] == ["p0", "p1", "p2", "p3"]
    assert set(JobRun.objects.values_list("attempts", flat=True)) == {1}  # none ran twice
    assert queue.count == 0


def test_a_job_paused_in_one_tenant_is_held_and_everything_else_runs(tenants):
    pauses.pause(job="testapp.probe", tenant="t1")
    jobs.probe.enqueue(tenant="t1", tag="held-0")
    jobs.list_tags.enqueue(tenant="t1", tag="other-job")
    jobs.probe.enqueue(tenant="t2", tag="other-tenant")
    jobs.probe.enqueue(tenant="t1", tag="held-1")
    work()
    done = {tag for _, tag in starts()}
    assert done == {"other-job", "other-tenant"}
    assert transport.get_queue("default").count == 2
    pauses.resume(job="testapp.probe", tenant="t1")
    work()
    assert [tag for _, tag in starts()][-2:] == ["held-0", "held-1"]
    assert JobRun.objects.filter(status=RunStatus.SUCCEEDED).count() == 4


def test_a_paused_job_and_a_paused_queue(tenants):
    pauses.pause(job="testapp.probe")
    jobs.probe.enqueue(tenant="t1", tag="a")
    jobs.probe.enqueue(tenant="t2", tag="b")
    jobs.list_tags.enqueue(tenant="t2", tag="c")
    work()
    assert {tag for _, tag in starts()} == {"c"}
    pauses.pause(queue="default")
    pauses.resume(job="testapp.probe")
    work()
    assert {tag for _, tag in starts()} == {"c"}  # the queue is paused now
    pauses.resume(queue="default")
    work()
    assert {tag for _, tag in starts()} == {"a", "b", "c"}


def test_a_paused_tenants_fan_out_children_wait(tenants):
    pauses.pause(tenant="t2")
    jobs.fanned.enqueue(tag="everyone")
    work()
    children = dict(JobRun.objects.exclude(schema_name="").values_list("schema_name", "status"))
    assert children == {"t1": "succeeded", "t2": "queued", "t3": "succeeded"}
    pauses.resume(tenant="t2")
    work()
    assert JobRun.objects.exclude(status=RunStatus.SUCCEEDED).count() == 0


def test_a_pause_lost_by_redis_is_restored_by_the_next_maintenance_round(tenants, redis_conn):
    pauses.pause(tenant="t1")
    for key in redis_conn.scan_iter(match=f"{transport.keys.PAUSE_PREFIX}*"):
        redis_conn.delete(key)  # as a failover to a replica that never saw the pause
    relay_pending()  # what every maintenance round runs first
    jobs.probe.enqueue(tenant="t1", tag="still-paused")
    work()
    assert statuses("t1") == ["queued"]
    pauses.resume(tenant="t1")
    work()
    assert statuses("t1") == ["succeeded"]


def test_pause_refuses_what_names_nothing_or_too_much(tenants):
    cases = [
        (("--queue", "nosuch"), "no queue 'nosuch' in RQ_QUEUES"),
        (("--queue", "default", "--job", "testapp.probe"), "pause a queue on its own"),
        (("--job", "testapp.nosuch"), "Pause a registered job by its name"),
        (("--tenant", "nosuch"), "no tenant with schema 'nosuch'"),
        ((), "name what to pause"),
    ]
    for args, message in cases:
        for verb in ("pause", "resume"):
            with pytest.raises(CommandError, match=message):
                command(verb, *args)
    assert FlowPause.objects.count() == 0
    assert command("pause", "--queue", "default") == "paused queue default\n"
    assert command("pause", "--queue", "default") == "queue default was paused already\n"
    assert command("resume", "--job", "testapp.probe") == "job testapp.probe was not paused\n"
    assert command("resume", "--queue", "default") == "resumed queue default\n"


@contextmanager
def held_in_t1(name: str, *tags: str) -> Iterator[None]:
    """A job named ``name`` (a probe) declared for the block, paused in t1, with one run per
    tag enqueued there and a worker gone over them: they are held."""
    from kumiko_jobs.definition.options import build_definition
    from kumiko_jobs.definition.registry import registry
    from kumiko_jobs.enqueueing.submit import enqueue

    def odd(ctx, *, tag: str) -> None:
        jobs.probe.func(ctx, tag=tag)

    with registry.override(build_definition(odd, {"name": name})):
        pauses.pause(job=name, tenant="t1")
        for tag in tags:
            enqueue(name, tenant="t1", tag=tag)
        work()
        yield


def test_a_held_job_whose_name_looks_like_a_lane_is_released_into_its_own_lane(tenants):
    # A held list's key is lane + "held:" + job + TAB + bucket; a job name may hold ":1:held:",
    # which a pattern over the key took for the lane's end (the messages went to a lane no
    # worker reads, and were "released" while their job was still paused).
    name = "testapp.odd:1:held:x"
    with held_in_t1(name, "odd-0", "odd-1"):
        relay_pending()  # a maintenance round re-asserts the pauses: still held
        work()
        assert statuses("t1") == ["queued"] * 2
        pauses.resume(job=name, tenant="t1")
        work()
        assert statuses("t1") == ["succeeded"] * 2
        assert [tag for _, tag in starts()] == ["odd-0", "odd-1"]
    assert transport.get_queue("default").count == 0


def test_a_held_list_is_released_into_the_lane_it_was_held_in(tenants, redis_conn):
    # Queue and job names may both hold ':<digits>:held:': with a queue named
    # 'default:0:held:x' (its lane added below, as its first message would; check E018 now
    # refuses such a name), the held list of job 'x:1:held:job' on 'default' also begins with
    # that lane + 'held:', read as job 'job' there: the longest-lane reading released it while
    # its job was paused, into the other queue's bucket. The lane recorded when the list was
    # held says which it is.
    from kumiko_jobs.transport.keys import FAIR_PREFIX

    name = "x:1:held:job"
    decoy = f"{FAIR_PREFIX}default:0:held:x:1:"
    with held_in_t1(name, "lane-0", "lane-1"):
        redis_conn.sadd(f"{FAIR_PREFIX}lanes", decoy)
        relay_pending()  # a maintenance round re-asserts the pauses: nothing is released
        assert redis_conn.keys(f"{decoy}b:*") == []
        work()
        assert statuses("t1") == ["queued"] * 2
        pauses.resume(job=name, tenant="t1")
        work()
        assert statuses("t1") == ["succeeded"] * 2
        assert [tag for _, tag in starts()] == ["lane-0", "lane-1"]
        assert redis_conn.hlen(f"{FAIR_PREFIX}hold-lanes") == 0  # forgotten with the list
