"""The fair dequeue through real RQ workers on real Redis and PostgreSQL (transport/fair.py).

Order, never time: a run's place among the starts (``JobRun.started_at`` ordered, written by
one in-process worker, so the order is the worker's) is what the assertions read. The
script's arithmetic is compared with the pure policy (``fair_policy.Lane``) event by event.
"""

from __future__ import annotations

import signal
from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings

from bench import soak
from kumiko_jobs import transport
from kumiko_jobs.models import JobRun, RunStatus
from kumiko_jobs.transport import fair
from kumiko_jobs.transport.fair_policy import Lane
from kumiko_jobs.worker import Worker
from tests.conftest import work
from tests.integration.test_reliability import status
from tests.integration.test_reliability import workers as workers
from tests.testapp import jobs

pytestmark = pytest.mark.usefixtures("live_db")


def kumiko(**extra: Any) -> dict[str, Any]:
    return {**settings.KUMIKO_JOBS, **extra}


def starts() -> list[tuple[str, str]]:
    """(schema, tag) of every run, in the order the worker started them."""
    rows = JobRun.objects.exclude(started_at=None).order_by("started_at", "pk")
    return [(r.schema_name, r.payload.get("tag", "")) for r in rows]


def work_some(count: int) -> None:
    """One burst worker that stops after ``count`` messages."""
    queue = transport.get_queue("default")
    Worker([queue], connection=queue.connection).work(burst=True, max_jobs=count)


def test_a_backlog_does_not_make_another_tenant_wait(tenants):
    for i in range(200):
        jobs.probe.enqueue(tenant="t1", tag=f"a{i}")
    work_some(20)  # the worker is deep in t1's backlog when t2 arrives
    for i in range(3):
        jobs.probe.enqueue(tenant="t2", tag=f"b{i}")
    work()
    order = starts()
    assert len(order) == 203
    after_push = order[20:]
    first_b = next(i for i, (schema, _) in enumerate(after_push) if schema == "t2")
    # t2 re-enters at the lane's virtual time, level with t1's next message: it starts at
    # once or right after one t1 run (FIFO: the 180 t1 runs ahead of it).
    assert first_b <= 1, after_push[:5]
    b_places = [i for i, (schema, _) in enumerate(after_push) if schema == "t2"]
    assert b_places[-1] < 10, b_places  # all three within the next few runs, interleaved


def test_fifo_within_a_tenant_while_tenants_interleave(tenants):
    for i in range(30):
        jobs.probe.enqueue(tenant="t1", tag=f"{i:02}")
        if i % 3 == 0:
            jobs.probe.enqueue(tenant="t2", tag=f"{i:02}")
    work()
    order = starts()
    for schema in ("t1", "t2"):
        tags = [tag for s, tag in order if s == schema]
        assert tags == sorted(tags), (schema, tags)
    # interleaved, not t1's 30 first: t2's last run starts before t1's last few
    assert [s for s, _ in order][-1] == "t1"
    assert max(i for i, (s, _) in enumerate(order) if s == "t2") < 25


@override_settings(KUMIKO_JOBS=kumiko(FAIRNESS="fifo"))
def test_fifo_mode_keeps_the_order_of_arrival(tenants):
    pushed = []
    for i in range(40):
        schema = "t1" if i < 30 else "t2"
        jobs.probe.enqueue(tenant=schema, tag=f"{i:02}")
        pushed.append((schema, f"{i:02}"))
    work()
    assert starts() == pushed


def test_rq_counts_every_waiting_message(tenants):
    queue = transport.get_queue("default")
    for i in range(12):
        jobs.probe.enqueue(tenant="t1" if i % 2 else "t2", tag=f"c{i}")
    assert queue.count == 12
    work_some(5)  # sorted into their buckets by the first dequeue: tokens stand for them
    assert queue.count == 7
    assert JobRun.objects.filter(status=RunStatus.QUEUED).count() == 7
    work()
    assert queue.count == 0
    assert JobRun.objects.filter(status=RunStatus.SUCCEEDED).count() == 12


def test_a_message_deleted_from_rq_keeps_counts_true_and_the_relay_pushes_it(tenants):
    queue = transport.get_queue("default")
    handles = [jobs.probe.enqueue(tenant="t1", tag=f"d{i}") for i in range(4)]
    work_some(1)  # sorts all four, runs the first
    victim = transport.JsonJob.fetch(
        f"kj-{handles[2].run_id}-a1-d0-g0", connection=queue.connection
    )
    victim.delete()  # what django-rq's "delete" does
    work()
    assert queue.count == 0  # the vanished message's token went with it
    assert status(handles[2].run_id) == RunStatus.QUEUED
    from kumiko_jobs.worker.relay import relay_pending

    assert relay_pending(grace=0).pushed == 1
    work()
    assert status(handles[2].run_id) == RunStatus.SUCCEEDED


def test_the_script_picks_what_the_pure_policy_picks(tenants, redis_conn):
    """Push real messages for three tenants (t3 weighing 2), then alternate dequeue and charge
    with chosen durations, on Redis and on a ``Lane``: the buckets picked, in order, agree."""
    durations = {"t1": 0.1, "t2": 1.0, "t3": 0.1}
    weights = {"t1": 1.0, "t2": 1.0, "t3": 2.0}
    with override_settings(KUMIKO_JOBS=kumiko(TENANT_WEIGHT=f"{__name__}.weight_of")):
        for i in range(30):
            for schema in ("t1", "t2", "t3"):
                jobs.probe.enqueue(tenant=schema, tag=f"{schema}-{i}")
    queue = transport.get_queue("default")
    lane = Lane()
    for i in range(30):
        for schema in ("t1", "t2", "t3"):
            lane.enter(schema, f"{schema}-{i}", weights[schema])
    got, expected = [], []
    for _ in range(60):
        reply = fair.dequeue(
            redis_conn,
            "default",
            queue.key,
            queue.intermediate_queue_key,
            transport.JsonJob.redis_job_namespace_prefix,
            "tenant",
        )
        bucket = transport.decoded(reply[3])
        assert bucket is not None
        charge = fair.Charge(
            transport.decoded(reply[2]) or "",
            bucket,
            float(reply[4]),
            float(reply[5]),
            "tenant",
        )
        with redis_conn.pipeline() as pipe:
            fair.charge_on(pipe, charge, durations[bucket])
            pipe.execute()
        got.append(bucket)
        picked = lane.pick()
        assert picked is not None
        expected.append(picked[0])
        lane.charge(picked[0], durations[picked[0]], picked[2], picked[3])
        assert float(reply[4]) == pytest.approx(picked[2])
    assert got == expected
    # worker seconds per weight, over the last 40 picks: t2 (10x slower) is not 10x ahead
    seconds = {b: sum(durations[b] for s in got[20:] if s == b) for b in durations}
    assert seconds["t2"] < 3 * seconds["t1"], seconds


def weight_of(schema: str) -> float:
    """TENANT_WEIGHT for the test above: t3 has twice the others' share."""
    return 2.0 if schema == "t3" else 1.0


def test_a_worker_killed_mid_run_loses_nothing_among_backlogged_tenants(tenants, workers):
    """A real ``rqworker`` is SIGKILLed in the middle of a run while two tenants' backlogs
    wait in their buckets; a second worker sweeps it, and every run succeeds exactly once."""
    sleeper = soak.job("soak.sleeper").enqueue(tenant="t1", tag="victim", seconds=60)
    victim = workers.start()
    workers.wait_for("the long run to start", lambda: status(sleeper.run_id) == RunStatus.RUNNING)
    handles = [
        jobs.probe.enqueue(tenant=schema, tag=f"k{i}") for i in range(10) for schema in ("t1", "t2")
    ]
    victim.send_signal(signal.SIGKILL)
    assert victim.wait() == -signal.SIGKILL
    workers.start()
    workers.wait_for(
        "every run to succeed",
        lambda: (
            JobRun.objects.filter(
                pk__in=[h.run_id for h in handles], status=RunStatus.SUCCEEDED
            ).count()
            == len(handles)
        ),
    )
    # The killed run is retried by the sweep; the probes each ran once (one attempt each).
    assert set(
        JobRun.objects.filter(pk__in=[h.run_id for h in handles]).values_list("attempts", flat=True)
    ) == {1}
    assert transport.get_queue("default").count == 0


def test_all_workers_serve_a_lone_tenant(tenants):
    """Work-conserving: two workers take turns on one tenant's backlog; neither finds the
    queue empty while a message waits (each takes messages until the backlog is gone)."""
    for i in range(20):
        jobs.probe.enqueue(tenant="t1", tag=f"l{i}")
    work_some(7)
    work_some(7)  # a second worker, while the first one's tenant still has a backlog
    assert JobRun.objects.filter(status=RunStatus.SUCCEEDED).count() == 14
    work()
    assert JobRun.objects.filter(status=RunStatus.SUCCEEDED).count() == 20


# --- priorities ---------------------------------------------------------------------------


def test_higher_priority_first_fifo_within_a_level_fair_across_tenants(tenants):
    for i in range(6):
        jobs.probe.enqueue(tenant="t1", tag=f"low{i}")
    urgent = jobs.probe.using(priority=5)
    for i in range(4):
        urgent.enqueue(tenant="t1", tag=f"hi-t1-{i}")
    urgent.enqueue(tenant="t2", tag="hi-t2-0")
    jobs.probe.using(priority=-3).enqueue(tenant="t2", tag="lowest")
    work()
    order = starts()
    assert [tag for _, tag in order[:5]] == ["hi-t1-0", "hi-t2-0", "hi-t1-1", "hi-t1-2", "hi-t1-3"]
    assert [tag for _, tag in order[5:11]] == [f"low{i}" for i in range(6)]
    assert order[-1] == ("t2", "lowest")
    assert JobRun.objects.get(payload__tag="hi-t2-0").priority == 5


def test_a_retry_and_a_relayed_message_keep_the_runs_priority(tenants, redis_conn):
    handle = jobs.flaky.using(priority=7).enqueue(tenant="t1", tag="p", fail_times=1)
    work_some(1)  # the first attempt fails; its retry is pushed by the worker
    retry = transport.JsonJob.fetch(f"kj-{handle.run_id}-a2-d0-g0", connection=redis_conn)
    assert retry.meta["kumiko_fair"][2] == 7
    retry.delete()  # lost: the relay pushes it again from the row
    from kumiko_jobs.worker.relay import relay_pending

    assert relay_pending(grace=0).pushed == 1
    again = transport.JsonJob.fetch(f"kj-{handle.run_id}-a2-d0-g0", connection=redis_conn)
    assert again.meta["kumiko_fair"][2] == 7
    work()
    assert status(handle.run_id) == RunStatus.SUCCEEDED


def test_priorities_are_checked_where_they_are_given():
    from kumiko_jobs.core.exceptions import InvalidJob
    from kumiko_jobs.definition.options import build_definition

    def body(ctx: Any) -> None: ...

    for bad in (101, -101, "5", True, 1.5):
        with pytest.raises(InvalidJob, match="a priority is an integer from -100 to 100"):
            jobs.probe.using(priority=bad)  # type: ignore[arg-type]
        with pytest.raises(InvalidJob, match="a priority is an integer from -100 to 100"):
            build_definition(body, {"priority": bad})
    assert build_definition(body, {"priority": -100}).priority == -100
    assert jobs.probe.using(priority=100).priority == 100
    assert jobs.probe.priority == 0  # the registered job is unchanged


def zero_weight(schema: str) -> float:
    return 0


def test_a_bad_tenant_weight_fails_the_enqueue_with_the_fix_and_writes_nothing(tenants):
    from django.core.exceptions import ImproperlyConfigured

    for path, message in (
        (f"{__name__}.zero_weight", "returned 0 for tenant 't1'; it must return a finite number"),
        (f"{__name__}.no_such_callable", "cannot be imported"),
    ):
        with (
            override_settings(KUMIKO_JOBS=kumiko(TENANT_WEIGHT=path)),
            pytest.raises(ImproperlyConfigured, match=message),
        ):
            jobs.probe.enqueue(tenant="t1", tag="never")
    assert JobRun.objects.count() == 0
    assert transport.get_queue("default").count == 0


def test_the_forking_worker_dequeues_fairly_and_charges_its_runs(tenants, redis_conn):
    """``manage.py rqworker --worker-class kumiko_jobs.worker.ForkingWorker --burst``: the
    same fair order as the default worker, and its parent charges each run's worker time."""
    from tests.conftest import start_rqworker

    for i in range(10):
        jobs.probe.enqueue(tenant="t1", tag=f"f{i}")
    for i in range(3):
        jobs.probe.enqueue(tenant="t2", tag=f"g{i}")
    proc = start_rqworker(
        "default", "--burst", "--worker-class", "kumiko_jobs.worker.ForkingWorker"
    )
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    places = [i for i, (schema, _) in enumerate(starts()) if schema == "t2"]
    assert len(places) == 3 and places[-1] < 7, places  # FIFO would start them 10th to 12th
    means = redis_conn.hgetall(f"{fair.prefix_of('default')}0:mean")
    assert {b"t1", b"t2", b"~lane"} <= set(means)  # every run was charged
