"""The maintenance round's relay checks a slice of the waiting runs, from where the last round
stopped (worker/maintenance.py, ``relay_slice``; ``RELAY_ROWS_PER_ROUND``), and finishes the
pass at once when its slice finds messages Redis lost.

A full pass costs about 44 us a waiting run (4.4 s every round at 100,000, 2.2 s measured at
50,000 on this machine), so a round that checked every run grew with the backlog. Real
PostgreSQL rows and Redis messages (``enqueue_many``); the lost messages are lost for real (the
Redis database flushed), and a real worker runs what the relay pushed back: each run once.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings

from kumiko_jobs import transport
from kumiko_jobs.models import JobAttempt, JobRun, RunStatus
from kumiko_jobs.worker.maintenance import relay_slice
from tests.conftest import work
from tests.testapp import jobs

pytestmark = pytest.mark.usefixtures("live_db")

SLICE = {"RELAY_GRACE": 0, "RELAY_ROWS_PER_ROUND": 30}


def backlog(count: int) -> list[Any]:
    handles = jobs.probe.enqueue_many([{"tag": f"b{i}"} for i in range(count)], tenant="t1")
    return sorted(h.run_id for h in handles)


def test_each_round_checks_a_slice_and_the_next_goes_on(tenants: Any, redis_conn: Any) -> None:
    backlog(100)
    with override_settings(KUMIKO_JOBS={**settings.KUMIKO_JOBS, **SLICE}):
        rounds = [relay_slice(redis_conn) for _ in range(5)]
    assert [r.checked for r in rounds] == [30, 30, 30, 10, 30]  # then from the first again
    assert [r.pushed for r in rounds] == [0] * 5  # Redis holds every message
    first = min(JobRun.objects.values_list("pk", flat=True))
    assert rounds[3].stopped_after is None and rounds[4].stopped_after is not None
    assert transport.relay_cursor(redis_conn) == rounds[4].stopped_after > first


def test_a_slice_that_finds_lost_messages_finishes_the_pass(tenants: Any, redis_conn: Any) -> None:
    ids = backlog(100)
    with override_settings(KUMIKO_JOBS={**settings.KUMIKO_JOBS, **SLICE}):
        assert relay_slice(redis_conn).checked == 30
        after = transport.relay_cursor(redis_conn)
        redis_conn.flushdb()  # a failover to a replica that had none of them
        transport.set_relay_cursor(redis_conn, after, 60)  # the cursor survived (the worst case)
        later = relay_slice(redis_conn)
        assert (later.checked, later.pushed) == (70, 70)  # the rest of the pass, at once
        assert transport.relay_cursor(redis_conn) is None
        first = relay_slice(redis_conn)
        assert (first.checked, first.pushed) == (100, 30)  # from the first: the 30 before it
    work()
    runs = JobRun.objects.filter(pk__in=ids)
    assert set(runs.values_list("status", flat=True)) == {RunStatus.SUCCEEDED}
    assert JobAttempt.objects.filter(run__in=ids).count() == 100  # each ran once
