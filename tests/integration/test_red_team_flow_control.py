"""Red team, flow control: tenants named to collide with the dequeue's own names and separators.

django-tenants 4 accepts almost any text as a schema name (it refuses only quotes, backslashes,
";", NUL and line breaks, and a leading "pg_"): a tab, "!system" and "~other" are valid. The
fair dequeue's Redis structures use the bucket (the tenant's schema) inside members and keys
separated by tabs, and "!system"/"~other" are the buckets of system runs and foreign messages.
These tests push real messages onto real Redis and drive the real dequeue and pause scripts.
"""

from __future__ import annotations

import json
import math
import time
from typing import Any

import pytest
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from kumiko_jobs import transport
from kumiko_jobs.models import JobRun, RunStatus
from kumiko_jobs.transport import fair
from kumiko_jobs.transport.fair_policy import OTHER_BUCKET, SYSTEM_BUCKET
from kumiko_jobs.transport.rate_limits import release_caps
from kumiko_jobs.worker.relay import relay_pending
from tests.conftest import work
from tests.integration.test_reliability import status
from tests.testapp import jobs

pytestmark = pytest.mark.usefixtures("live_db")

JOB = "testapp.probe"


def message(n: int, schema: str | None, **extra: Any) -> transport.Message:
    return transport.Message(
        body="{}",
        queue="default",
        job_id=f"kj-attack-{n}",
        timeout=60,
        bucket=transport.bucket_of(schema),
        job=JOB,
        **extra,
    )


def dequeue() -> tuple[str, str]:
    """(job id, bucket) of the next pick, or ("", why) when there is none."""
    queue = transport.get_queue("default")
    reply = fair.dequeue(
        queue.connection, "default", queue.key, queue.intermediate_queue_key, "rq:job:", "tenant"
    )
    first = transport.decoded(reply[0]) or ""
    if not first:
        return "", transport.decoded(reply[1]) or ""
    return first, transport.decoded(reply[3]) or ""


def pause(*, tenants: tuple[str | None, ...] = (), job_tenants: tuple[str, ...] = ()) -> int:
    """Assert these pauses into Redis as every maintenance round does; returns what it released."""
    return transport.assert_pauses(
        transport.connection_for("default"),
        [],
        [transport.bucket_of(t) for t in tenants],
        [],
        [(JOB, transport.bucket_of(t)) for t in job_tenants],
        "tenant",
    )


def test_a_tenant_named_with_a_tab_cannot_move_its_held_runs_into_another_tenants_bucket():
    """Attack: tenant ``x<TAB>t2`` has a job paused. Its held messages sat on
    ``held:<job>\\tx\\tt2``, which the release read back as job ``<job>\\tx`` of bucket
    ``t2``: at the resume they went to the head of t2's bucket, ran as t2's share (charged to
    t2, ahead of t2's own backlog) and would wait on t2's pause or caps."""
    evil = "x\tt2"
    transport.push_many([message(0, evil), message(1, evil)])
    pause(job_tenants=(evil,))
    assert dequeue() == ("", "paused")  # held: the job is paused in that tenant
    assert pause(job_tenants=(evil,)) == 0  # the next maintenance round releases nothing
    assert dequeue() == ("", "paused")
    assert sorted(transport.waiting_job_ids("default")) == ["kj-attack-0", "kj-attack-1"]

    pause()  # the resume: they run now, from their own bucket
    picks = [dequeue(), dequeue()]
    assert [job_id for job_id, _ in picks] == ["kj-attack-0", "kj-attack-1"]
    assert {bucket for _, bucket in picks} == {transport.bucket_of(evil)} != {"t2"}


@pytest.mark.parametrize("name", [SYSTEM_BUCKET, OTHER_BUCKET])
def test_a_tenant_named_like_the_system_bucket_pauses_only_itself(name: str):
    """Attack: a tenant whose schema is ``!system`` shared the bucket of every system run, so
    pausing it (or capping or rate-limiting it) held the system's runs too, and its backlog
    took the system's share; ``~other`` is the bucket of foreign messages."""
    transport.push_many([message(0, None), message(1, name)])
    pause(tenants=(name,))
    assert dequeue() == ("kj-attack-0", SYSTEM_BUCKET)
    assert dequeue() == ("", "paused")
    pause()
    assert dequeue()[0] == "kj-attack-1"


def test_a_tenant_named_with_a_tab_comes_back_after_its_rate_window():
    """A tenant-wide rate wait is the ``rwait`` member ``<level>\\t<bucket>``; with a tab in
    the bucket it was read back as a job's wait (``<level>\\t<x>\\t<rest>``), so the bucket
    never re-entered its lane: its runs waited forever."""
    evil = "acme\ttestapp.probe"
    rates = ((f"t:{transport.bucket_of(evil)}", 1, 1),)
    transport.push_many([message(0, evil, rates=rates), message(1, evil, rates=rates)])
    assert dequeue()[0] == "kj-attack-0"
    job_id, why = dequeue()
    assert (job_id, why) == ("", "rate")
    for _ in range(60):  # the window is one second
        job_id, _ = dequeue()
        if job_id:
            break
        time.sleep(0.05)
    assert job_id == "kj-attack-1"


# --- one tenant's TENANT_WEIGHT / TENANT_RATE_LIMIT failing must not stop everyone's runs ---

WEIGHT_FAILS_FOR = {"schema": ""}
CALLS: list[str] = []


def weight_failing_for_one_tenant(schema: str) -> float:
    """TENANT_WEIGHT as a project writes it (the tenant's plan), for a tenant whose plan row
    is gone: it raises for that one tenant."""
    CALLS.append(schema)
    if schema == WEIGHT_FAILS_FOR["schema"]:
        raise LookupError(f"no plan for {schema}")
    return 1.0


def rate_failing_for_one_tenant(schema: str) -> str | None:
    return "0/m" if schema == WEIGHT_FAILS_FOR["schema"] else None


def kumiko(**extra: Any) -> dict[str, Any]:
    return {**settings.KUMIKO_JOBS, **extra}


WEIGHT = {"TENANT_WEIGHT": f"{__name__}.weight_failing_for_one_tenant"}
RATE = {"TENANT_RATE_LIMIT": f"{__name__}.rate_failing_for_one_tenant"}


@pytest.mark.parametrize("setting", [WEIGHT, RATE], ids=["weight raises", "bad rate"])
def test_the_relay_pushes_the_other_tenants_runs_when_one_tenants_setting_fails(
    tenants: Any, redis_conn: Any, setting: dict[str, str]
) -> None:
    """Attack: a tenant whose weight (or rate) the project's callable cannot give, because its
    plan row is gone. Redis lost the queued runs (a failover): the relay built every message
    in one loop, so that tenant's run raised and no tenant's run was pushed again, at every
    maintenance round. Now its runs wait (logged once, its callable called once per round)
    and the others are pushed."""
    handles = [jobs.probe.enqueue(tenant=t, tag=t) for t in ("t1", "t2", "t2", "t3")]
    redis_conn.flushdb()  # the failover to a replica that never saw the pushes
    WEIGHT_FAILS_FOR["schema"] = "t2"
    CALLS.clear()
    try:
        with override_settings(KUMIKO_JOBS=kumiko(**setting)):
            result = relay_pending(grace=0)
            work()
    finally:
        WEIGHT_FAILS_FOR["schema"] = ""
    assert result.pushed == 2
    assert [status(h.run_id) for h in handles] == ["succeeded", "queued", "queued", "succeeded"]
    if setting is WEIGHT:
        assert CALLS.count("t2") == 1
    with override_settings(KUMIKO_JOBS=kumiko(**setting)):
        assert relay_pending(grace=0).pushed == 2  # fixed: the next round pushes them
        work()
    assert {status(h.run_id) for h in handles} == {RunStatus.SUCCEEDED}


@pytest.mark.parametrize("setting", [WEIGHT, RATE], ids=["weight raises", "bad rate"])
def test_a_fan_out_reaches_every_tenant_whose_setting_works(
    tenants: Any, setting: dict[str, str]
) -> None:
    """The same tenant in a fan-out: its child's message raised in the middle of the chunk,
    so the children after it (and in later chunks) were never created or pushed, and the
    parent failed. Now that child waits (its row is written: the relay pushes it once the
    callable works) and every other tenant's child runs."""
    WEIGHT_FAILS_FOR["schema"] = "t2"
    try:
        with override_settings(KUMIKO_JOBS=kumiko(**setting)):
            jobs.fanned.enqueue(tag="everyone")
            work()
    finally:
        WEIGHT_FAILS_FOR["schema"] = ""
    children = dict(JobRun.objects.exclude(schema_name="").values_list("schema_name", "status"))
    assert children == {"t1": "succeeded", "t2": "queued", "t3": "succeeded"}
    assert JobRun.objects.get(schema_name="").status == RunStatus.SUCCEEDED
    with override_settings(KUMIKO_JOBS=kumiko(**setting)):
        assert relay_pending(grace=0).pushed == 1
        work()
    assert JobRun.objects.exclude(status=RunStatus.SUCCEEDED).count() == 0


def test_an_enqueue_whose_tenant_setting_raises_fails_naming_the_setting_and_tenant(
    tenants: Any,
) -> None:
    WEIGHT_FAILS_FOR["schema"] = "t2"
    try:
        with (
            override_settings(KUMIKO_JOBS=kumiko(**WEIGHT)),
            pytest.raises(ImproperlyConfigured, match=r"TENANT_WEIGHT.*LookupError.*'t2'"),
        ):
            jobs.probe.enqueue(tenant="t2", tag="never")
    finally:
        WEIGHT_FAILS_FOR["schema"] = ""
    assert JobRun.objects.count() == 0


# --- a paused tenant: nothing of it starts, whatever route its next message takes -------------


def test_a_tenant_paused_mid_flight_holds_its_retry_its_next_workflow_step_and_its_bulk_runs(
    tenants: Any,
) -> None:
    """Attack: the routes that push a tenant's message from inside a worker (a retry, a
    workflow step released by its predecessor's finish) or in one COPY (enqueue_many), after
    the tenant was paused. None of them starts before the resume; each runs once after it."""
    from kumiko_jobs import chain, workflow
    from kumiko_jobs.worker import pauses
    from tests.integration.test_fair_dequeue import work_some
    from tests.testapp import workflow_jobs as wf

    retried = jobs.flaky.enqueue(tenant="t1", tag="retry", fail_times=1)
    flow = workflow(
        chain(wf.record.step(tag="a", key="a"), wf.record.step(tag="b", key="b")), name="mid"
    )
    handle = flow.enqueue(tenant="t1")
    work_some(2)  # the flaky run's first attempt fails (its retry is pushed), step a succeeds
    assert JobRun.objects.get(pk=retried.run_id).attempts == 1
    assert handle.steps() == {"a": "succeeded", "b": "released"}

    pauses.pause(tenant="t1")
    bulk = jobs.probe.enqueue_many([{"tag": f"bulk-{i}"} for i in range(3)], tenant="t1")
    jobs.probe.enqueue(tenant="t2", tag="other")
    work()
    waiting = JobRun.objects.filter(schema_name="t1").exclude(status=RunStatus.SUCCEEDED)
    assert waiting.count() == 5 and {r.status for r in waiting} == {RunStatus.QUEUED}
    assert JobRun.objects.get(schema_name="t2").status == RunStatus.SUCCEEDED
    assert relay_pending(grace=0).pushed == 0  # RQ holds them: nothing pushed twice

    pauses.resume(tenant="t1")
    work()
    assert JobRun.objects.exclude(status=RunStatus.SUCCEEDED).count() == 0
    assert JobRun.objects.get(pk=retried.run_id).attempts == 2
    assert all(JobRun.objects.get(pk=h.run_id).attempts == 1 for h in bulk)
    assert handle.steps() == {"a": "succeeded", "b": "succeeded"}


def test_the_sweep_hands_back_every_tenants_abandoned_run_when_one_tenants_weight_fails(
    tenants: Any,
) -> None:
    """The same tenant among runs whose workers died: the retry's message raised inside the
    sweep's loop, so the runs after it were never handed back, at every round. Now each is
    handed back (queued); that tenant's retry is pushed by the relay once its weight works."""
    from datetime import timedelta

    from django.utils import timezone

    from kumiko_jobs.transport import keys
    from kumiko_jobs.worker.sweep import sweep

    handles = [jobs.flaky.enqueue(tenant=t, tag=t, fail_times=0) for t in ("t2", "t1", "t3")]
    transport.get_queue("default").empty()  # the messages died with their worker
    for i, handle in enumerate(handles):  # t2's run first in the sweep's order
        JobRun.objects.filter(pk=handle.run_id).update(
            status=RunStatus.RUNNING,
            attempts=1,
            started_at=timezone.now() - timedelta(hours=2, minutes=-i),
        )
    transport.connection_for("default").set(keys.WORKERS_SINCE_KEY, time.time() - 3600)
    WEIGHT_FAILS_FOR["schema"] = "t2"
    try:
        with override_settings(KUMIKO_JOBS=kumiko(**WEIGHT)):
            assert sweep().retried == 3
            work()
    finally:
        WEIGHT_FAILS_FOR["schema"] = ""
    assert [status(h.run_id) for h in handles] == ["queued", "succeeded", "succeeded"]
    with override_settings(KUMIKO_JOBS=kumiko(**WEIGHT)):
        assert relay_pending(grace=0).pushed == 1
        work()
    assert [status(h.run_id) for h in handles] == ["succeeded"] * 3


# --- a forged message's fair field (it is not signed: the dequeue reads it before any check) ---


@pytest.mark.parametrize(
    "fields",
    [
        {"weight": math.nan},
        {"weight": 1e-320},  # estimate / weight is inf: the lane's virtual time would be too
        {"priority": math.nan},  # type: ignore[dict-item]
        {"rates": (("j:forged", 1, math.inf),)},
    ],
    ids=["weight nan", "weight tiny", "level nan", "rate period inf"],
)
def test_a_forged_fair_field_cannot_stall_or_skew_the_queue_for_other_tenants(
    fields: dict[str, Any],
) -> None:
    """Attack: whoever can write to Redis pushes a message whose fair field (RQ's job meta,
    outside the signed envelope) holds NaN or a value that makes the lane's times infinite.
    The script's ZADD of a NaN score failed after it had popped the entry, and the NaN it
    had stored as the bucket's finish made every later arrival of that bucket fail the sort:
    every worker's dequeue raised, for every tenant. The worker refuses the forged body
    later; the dequeue must serve everyone meanwhile, fairly."""
    transport.push_many([message(0, "t1", **fields)])
    arrivals = ((1, "t1"), (2, "t2"), (3, "t3"), (4, "t2"), (9, "t3"))
    transport.push_many([message(n, t) for n, t in arrivals])
    picks = [dequeue() for _ in range(6)]
    assert sorted(job_id for job_id, _ in picks) == [f"kj-attack-{n}" for n in (0, 1, 2, 3, 4, 9)]
    # Later arrivals of the forged bucket and of the others are still sorted and served, in
    # turns (the lane's virtual time is a number).
    transport.push_many([message(n, t) for n, t in ((5, "t1"), (6, "t2"), (7, "t3"), (8, "t2"))])
    order = [dequeue() for _ in range(4)]
    assert sorted(job_id for job_id, _ in order) == [f"kj-attack-{n}" for n in range(5, 9)]
    assert [bucket for _, bucket in order[:3]].count("t2") == 1, order
    assert dequeue() == ("", "empty")


def test_a_forged_priority_is_not_inherited_by_the_runs_retry(tenants: Any) -> None:
    """Attack: a Redis writer sets a queued message's level to 10**9; its retry (and every
    later message of the run) inherited whatever the executing message's field said. Now
    an invalid level is not inherited: the retry has the job's own."""
    from tests.integration.test_fair_dequeue import work_some

    handle = jobs.flaky.enqueue(tenant="t1", tag="forged", fail_times=1)
    job_id = JobRun.objects.get(pk=handle.run_id).rq_job_id
    queue = transport.get_queue("default")
    forged = transport.JsonJob.fetch(job_id, connection=queue.connection)
    forged.meta["kumiko_fair"][2] = 10**9
    forged.save_meta()
    work_some(1)  # the first attempt fails; its retry is pushed
    run = JobRun.objects.get(pk=handle.run_id)
    assert run.attempts == 1 and run.status == RunStatus.QUEUED
    (retry_id,) = [i for i in transport.waiting_job_ids("default") if i != job_id]
    retry = transport.JsonJob.fetch(retry_id, connection=queue.connection)
    assert retry.meta["kumiko_fair"][2] == 0


def test_messages_of_one_push_that_differ_only_in_their_caps_keep_their_own_caps() -> None:
    """The push wrote one meta per distinct fair field, but its cache of them left the caps
    out: a message pushed with an uncapped one of the same tenant, job, weight, level and
    windows took the first's (no cap), and started over its cap."""
    capped = (("t:t1", 1, "t"),)
    transport.push_many([message(0, "t1"), message(1, "t1", caps=capped)])
    connection = transport.get_queue("default").connection
    metas = [transport.JsonJob.fetch(f"kj-attack-{n}", connection=connection).meta for n in (0, 1)]
    assert [len(m["kumiko_fair"]) for m in metas] == [4, 6]
    assert metas[1]["kumiko_fair"][5] == [["t:t1", 1, "t"]]
    assert dequeue()[0] == "kj-attack-0"
    assert dequeue()[0] == "kj-attack-1"  # takes the cap's one slot
    transport.push_many([message(2, "t1", caps=capped)])
    assert dequeue() == ("", "paused")  # held by the cap


def test_a_paused_job_s_set_aside_runs_keep_their_order_through_the_pause() -> None:
    """A sequential job (cap 1) of t1: m0 runs, m1 is set aside at the cap, m2 arrives, then
    the job is paused in t1. The pause held m2 (the bucket's head) first and m1 (woken by
    m0's release) after it, and the resume put them back as [m2, m1]: m2 ran first."""
    caps = (("j:testapp.probe\tt1", 1, "j"),)
    connection = transport.get_queue("default").connection
    transport.push_many([message(0, "t1", caps=caps)])
    assert dequeue()[0] == "kj-attack-0"
    transport.push_many([message(1, "t1", caps=caps)])
    assert dequeue() == ("", "paused")  # m1 set aside: the job is at its cap
    transport.push_many([message(2, "t1", caps=caps)])
    pause(job_tenants=("t1",))
    assert dequeue() == ("", "paused")
    release_caps(connection, "kj-attack-0", json.dumps([list(c) for c in caps]))
    assert dequeue() == ("", "paused")
    pause()  # the resume
    assert dequeue()[0] == "kj-attack-1"
    release_caps(connection, "kj-attack-1", json.dumps([list(c) for c in caps]))
    assert dequeue()[0] == "kj-attack-2"
