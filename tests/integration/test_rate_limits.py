"""Rate limits by time window through real RQ workers, Redis and PostgreSQL (transport/fair.py).

Counts, not durations: the starts of every window are counted from ``JobAttempt.started_at``
(written by the worker right after the dequeue admitted the start on Redis's clock). A window
is taken as 0.95 s rather than 1 s: the recorded time trails the admission by the worker's few
milliseconds, which may differ between two runs; a limit not enforced puts all 20 starts in
the first window, far beyond any such slack.
"""

from __future__ import annotations

from typing import Any

import pytest

from kumiko_jobs import transport
from kumiko_jobs.admin.display import RunDisplay
from kumiko_jobs.models import JobAttempt, JobRun, RunStatus
from kumiko_jobs.transport import fair
from kumiko_jobs.worker import Worker
from tests.conftest import work
from tests.testapp import jobs

pytestmark = pytest.mark.usefixtures("live_db")


def start_times(job: str) -> list[float]:
    rows = JobAttempt.objects.filter(run__job_name=job).order_by("started_at")
    return [a.started_at.timestamp() for a in rows]


def most_in_any_window(times: list[float], window: float) -> int:
    return max(sum(1 for t in times[i:] if t - start < window) for i, start in enumerate(times))


def test_no_window_has_more_starts_than_the_limit(tenants: Any) -> None:
    """rate_limit="5/s" across tenants: 20 queued runs in two tenants, one burst worker; no
    0.95 s window holds more than 5 starts; every run succeeds on its first attempt (waiting
    for the window is no failed attempt). Proven able to fail: with the script's rate check
    removed (``rate_block`` returning nil) the 20 start within one window and this fails."""
    for i in range(20):
        jobs.rate_probe.enqueue(tenant="t1" if i % 2 else "t2", tag=f"r{i}")
    work()
    times = start_times(jobs.rate_probe.name)
    assert len(times) == 20
    assert most_in_any_window(times, 0.95) <= 5, times
    assert set(JobRun.objects.values_list("status", flat=True)) == {RunStatus.SUCCEEDED}
    assert JobAttempt.objects.count() == 20  # one attempt each: waiting was not an attempt


def test_a_tenant_over_its_limit_does_not_hold_back_another(tenants: Any) -> None:
    """tenant_rate_limit="2/h": t1's six runs queued ahead of t2's two, FIFO order, so
    without a per-tenant window t2 would wait behind t1 (or behind a shared window). Two of
    t1's and both of t2's start; t1's other four wait, queued, with no attempt, and the script
    says when the window reopens (the worker sleeps until then, no polling per message).
    Proven able to fail: keyed per job only (``jt:<job>`` without the bucket) only 2 start
    and the worker idles out, so the counts below fail."""
    for i in range(6):
        jobs.tenant_rate_probe.enqueue(tenant="t1", tag=f"a{i}")
    for i in range(2):
        jobs.tenant_rate_probe.enqueue(tenant="t2", tag=f"b{i}")
    queue = transport.get_queue("default")
    Worker([queue], connection=queue.connection).work(max_jobs=4, max_idle_time=5)
    started = JobRun.objects.exclude(started_at=None)
    assert sorted(started.values_list("schema_name", flat=True)) == ["t1", "t1", "t2", "t2"]
    assert sorted(r.payload["tag"] for r in started.filter(schema_name="t1")) == ["a0", "a1"]
    waiting = JobRun.objects.filter(started_at=None)
    assert waiting.count() == 4
    assert set(waiting.values_list("status", flat=True)) == {RunStatus.QUEUED}
    assert not JobAttempt.objects.filter(run__in=waiting).exists()
    popped = fair.dequeue(
        queue.connection,
        "default",
        queue.key,
        queue.intermediate_queue_key,
        "rq:job:",
        "tenant",
    )
    assert transport.decoded(popped[0]) == "" and transport.decoded(popped[1]) == "rate"
    assert 3500 < float(transport.decoded(popped[2])) <= 3600
    # nothing taken: the four still wait where they were
    assert len(transport.waiting_job_ids("default")) == 4
    # the admin says why they wait; t2's finished runs say nothing of it
    assert "waiting for a rate limit" in RunDisplay().status_label(waiting.first())
    assert "rate limit" not in RunDisplay().status_label(started.filter(schema_name="t2")[0])


def test_long_rate_limit_by_values_get_their_own_short_windows(tenants: Any) -> None:
    """``rate_limit="2/h", rate_limit_by="account"`` with two long values (3,001 characters,
    different only in the last one): each value gets its own window (two starts each; the
    third run of the first waits, queued, with no attempt), and no window's key is as long as
    the value: one fixed-size key per value (``transport.value_window``). Proven able to
    fail: with the value's JSON in the key as it was, the keys are 3,000+ bytes long."""
    first, second = "a" * 3000 + "1", "a" * 3000 + "2"
    for i in range(3):
        jobs.per_account.enqueue(tenant="t1" if i % 2 else "t2", account=first, tag=f"a{i}")
    for i in range(2):
        jobs.per_account.enqueue(tenant="t1", account=second, tag=f"b{i}")
    queue = transport.get_queue("default")
    Worker([queue], connection=queue.connection).work(max_jobs=4, max_idle_time=3)
    started = JobRun.objects.exclude(started_at=None)
    assert sorted(r.payload["tag"] for r in started) == ["a0", "a1", "b0", "b1"]
    waiting = JobRun.objects.get(payload__tag="a2")
    assert waiting.status == RunStatus.QUEUED and not waiting.attempt_set.exists()
    keys = [k.decode() for k in queue.connection.scan_iter(match="kumiko:rate:j:*")]
    assert len(keys) == 2, keys  # one window per value
    assert all(len(k) < 200 for k in keys), [len(k) for k in keys]
