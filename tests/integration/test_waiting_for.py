"""A deferred run's row says which deferral it waits for (``JobRun.waiting_for``, migration 0012).

The relay rebuilds a lost deferral's message from the row. Before the column it guessed the kind
from the tenant's state at relay time, which is wrong whenever the tenant changed in between:
these tests change it in between, so each one fails with the guess. The rolling-deploy tests play
the previous release's part with the SQL it sends (rows without the column), because its code is
not installed here.

Real PostgreSQL (django-tenants schemas), Redis and in-process RQ workers throughout.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.db import connection
from django.test import override_settings
from django.utils import timezone

from kumiko_jobs import transport
from kumiko_jobs.models import DeferralKind, JobRun, RunStatus
from kumiko_jobs.worker.relay import relay_pending
from tests.conftest import probes, work
from tests.testapp import jobs

pytestmark = pytest.mark.usefixtures("live_db")

GATED = {
    "TENANT_ACTIVE_FIELD": "is_active",
    "INACTIVE_TENANT": "defer",
    "INACTIVE_TENANT_DEFER_SECONDS": 1,
}


@pytest.fixture
def gated(tenants: dict[str, Any]) -> Iterator[None]:
    """The inactive-tenant gate defers; t3 is active again when the test ends."""
    from example_project.customers.models import Client

    try:
        with override_settings(KUMIKO_JOBS={**settings.KUMIKO_JOBS, **GATED}):
            yield
    finally:
        Client.objects.filter(schema_name="t3").update(is_active=True)


def set_active(schema: str, active: bool) -> None:
    from example_project.customers.models import Client

    Client.objects.filter(schema_name=schema).update(is_active=active)


def lose_redis_and_relay(redis_conn: Any, run_id: str) -> list[str]:
    """Redis loses the deferral's message; the relay rebuilds it from the row (due now)."""
    redis_conn.flushdb()
    JobRun.objects.filter(pk=run_id).update(scheduled_for=timezone.now())
    assert relay_pending(grace=0).pushed == 1
    return list(transport.get_queue("default").job_ids)


def row(run_id: str) -> JobRun:
    return JobRun.objects.get(pk=run_id)


def test_a_gate_deferral_is_recorded_and_resumes_as_the_gates_after_the_tenant_is_back(
    gated, redis_conn
):
    set_active("t3", False)
    handle = jobs.probe.enqueue(tenant="t3", tag="gated")
    work()
    run = row(handle.run_id)
    assert (run.status, run.waiting_for) == (RunStatus.DEFERRED, DeferralKind.GATE)

    # Reactivated before the relay rebuilds the message: the tenant's state now says "job",
    # the row says "gate", and the gate's resumption is what the run waits for.
    set_active("t3", True)
    assert lose_redis_and_relay(redis_conn, handle.run_id) == [f"kj-{handle.run_id}-a1-d0-g1"]
    work()
    run = row(handle.run_id)
    assert (run.status, run.defer_count, run.gate_defer_count) == (RunStatus.SUCCEEDED, 0, 1)
    assert run.waiting_for == ""  # cleared by the outcome that followed
    assert [p.tag for p in probes("t3")] == ["gated"]


def test_a_jobs_own_deferral_resumes_as_the_jobs_though_its_tenant_is_now_inactive(
    gated, redis_conn
):
    handle = jobs.defers_once.enqueue(tenant="t3", tag="own")
    work()
    run = row(handle.run_id)
    assert (run.status, run.waiting_for) == (RunStatus.DEFERRED, DeferralKind.JOB)

    # Deactivated since: the tenant's state now says "gate", the row says "job".
    set_active("t3", False)
    assert lose_redis_and_relay(redis_conn, handle.run_id) == [f"kj-{handle.run_id}-a1-d1-g0"]
    set_active("t3", True)
    work()
    run = row(handle.run_id)
    assert (run.status, run.defer_count, run.gate_defer_count) == (RunStatus.SUCCEEDED, 1, 0)
    assert [p.tag for p in probes("t3")] == ["own", "own-resumed"]


def test_the_outcome_after_a_deferral_clears_waiting_for(tenants):
    deferred = jobs.defers_once.enqueue(tenant="t1", tag="twice")
    work()
    assert row(deferred.run_id).waiting_for == DeferralKind.JOB
    # The same row, deferred then succeeded: the finish wrote "" over "job".
    work(scheduler_rounds=1)
    run = row(deferred.run_id)
    assert (run.status, run.waiting_for) == (RunStatus.SUCCEEDED, "")


# --- a rolling deploy: the previous release's processes next to this one's -------------------


def test_a_deferral_recorded_by_the_previous_release_keeps_the_old_guess(gated, redis_conn):
    """An old worker's finish does not write the column: the row says "" and the relay guesses
    from the tenant's state, as every release before 0012 did (right while nothing changed)."""
    set_active("t3", False)
    handle = jobs.probe.enqueue(tenant="t3", tag="old-worker")
    work()
    JobRun.objects.filter(pk=handle.run_id).update(waiting_for="")  # what the old finish leaves
    assert lose_redis_and_relay(redis_conn, handle.run_id) == [f"kj-{handle.run_id}-a1-d0-g1"]
    set_active("t3", True)
    work()
    assert row(handle.run_id).status == RunStatus.SUCCEEDED


def test_a_deferral_recorded_by_the_previous_release_with_a_stale_kind_still_runs(
    gated, redis_conn
):
    """The one thing a rolling deploy can get wrong, and what it costs: a new worker gate-defers
    the run, an old one runs the resumption and defers it by the job without touching the
    column. The row says "gate", the relay sends a gate resumption, and the worker accepts it
    (a start accepts one more deferral of either kind): the run completes, with that one
    deferral counted as the gate's (not against ``max_defers``)."""
    handle = jobs.defers_once.enqueue(tenant="t3", tag="mixed")
    work()  # the job's own deferral: defer_count stays 0 until its resumption starts
    JobRun.objects.filter(pk=handle.run_id).update(waiting_for=DeferralKind.GATE)
    assert lose_redis_and_relay(redis_conn, handle.run_id) == [f"kj-{handle.run_id}-a1-d0-g1"]
    work()
    run = row(handle.run_id)
    assert (run.status, run.defer_count, run.gate_defer_count) == (RunStatus.SUCCEEDED, 0, 1)
    assert [p.tag for p in probes("t3")] == ["mixed", "mixed-resumed"]


def test_a_run_the_previous_release_inserted_without_the_column_runs(tenants):
    """An old web process still enqueues during the deploy, with an INSERT that does not name
    ``waiting_for``: the column's database default keeps it valid, and a new worker runs it
    (the relay delivers it here, as it would had the old process's push been lost)."""
    template = jobs.probe.enqueue(tenant="t2", tag="template")
    work()
    columns = [
        f.column
        for f in JobRun._meta.concrete_fields
        if f.column not in ("run_id", "waiting_for", "status")
    ]
    listed = ", ".join(connection.ops.quote_name(c) for c in columns)
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO public.kumiko_jobs_jobrun (run_id, status, {listed}) "
            f"SELECT gen_random_uuid(), 'queued', {listed} FROM public.kumiko_jobs_jobrun "
            "WHERE run_id = %s RETURNING run_id",
            [template.run_id],
        )
        (old_run_id,) = cursor.fetchone()
    old = JobRun.objects.get(pk=old_run_id)
    assert old.waiting_for == ""
    JobRun.objects.filter(pk=old_run_id).update(
        attempts=0, started_at=None, finished_at=None, scheduled_for=None, result=None
    )
    assert relay_pending(grace=0).pushed == 1
    work()
    assert row(str(old_run_id)).status == RunStatus.SUCCEEDED
    assert [p.tag for p in probes("t2")] == ["template", "template"]


def test_the_operators_run_page_says_what_a_deferred_run_waits_for(gated):
    from tests.integration.test_admin import RUNS, client_for, make_user

    set_active("t3", False)
    gate = jobs.probe.enqueue(tenant="t3", tag="page-gate")
    set_active("t3", True)
    own = jobs.defers_once.enqueue(tenant="t1", tag="page-own")
    set_active("t3", False)
    work()
    operator = client_for("localhost", "public", make_user("public", "operator", superuser=True))
    gate_page = operator.get(f"{RUNS}{gate.run_id}/change/").content.decode()
    own_page = operator.get(f"{RUNS}{own.run_id}/change/").content.decode()
    assert "waiting for its tenant to be active again" in gate_page
    assert "waiting for the delay its job asked for (ctx.defer)" in own_page
    assert "its tenant to be active again" not in own_page
