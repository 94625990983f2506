"""WORKER_CONCURRENCY: several runs at once in one worker process (kumiko_jobs/worker/slots.py).

Real ``manage.py rqworker`` processes (as in test_reliability.py, with its fast liveness
settings) started with ``KUMIKO_JOBS_WORKER_CONCURRENCY``; real PostgreSQL and Redis. Every
wait has a deadline far below the jobs' timeouts; no test asserts how long anything took.

Calibrated: with ``KUMIKO_JOBS_WORKER_CONCURRENCY=1`` the first test never sees its four runs
running at once (it fails waiting); with the slots' timeout taken out (``SiblingSlot``'s
``death_penalty_class`` set back to ``FinalTimeout``) the sibling's timeout test fails
(SIGALRM cannot be armed outside the main thread, and the run is not recorded timed out);
without the alarm thread's cancel (``SlotTimeout._fire``) the sibling's statement test fails
(the watchdog exits the process, and the other slots' runs with it); with the ContentType
cache left Django's (``SlotGroup.start`` not calling ``key_by_schema``) the content type test
fails (the second tenant's run reads the first's id without a query).
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rq import Worker as RQWorker
from rq.registry import StartedJobRegistry

from bench import soak
from kumiko_jobs import transport
from kumiko_jobs.core import conf
from kumiko_jobs.models import JobAttempt, JobRun, RunStatus
from kumiko_jobs.worker import schema_caches
from tests.conftest import work, worker_env
from tests.integration.test_reliability import (
    DEADLINE,
    Workers,
    attempts_of,
    effects,
    fast_settings,
    status,
)
from tests.testapp import jobs

pytestmark = pytest.mark.usefixtures("live_db")
JOB_PREFIX = "slots"


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Workers]:
    pool = Workers(tmp_path)
    yield pool
    pool.stop_all()


def _slotted(count: int) -> dict[str, str]:
    env = worker_env()
    env[conf.CONCURRENCY_ENV] = str(count)
    return env


def _sleepers(count: int, seconds: float, tag: str) -> list[Any]:
    schemas = ["t1", "t2", "t3"]
    return [
        soak.job("soak.sleeper").enqueue(
            tenant=schemas[n % len(schemas)], tag=f"{tag}{n}", seconds=seconds
        )
        for n in range(count)
    ]


def _all_running(handles: list[Any]) -> bool:
    return all(status(h.run_id) == RunStatus.RUNNING for h in handles)


def test_four_slots_run_four_runs_at_once_and_rq_sees_each(tenants, workers, redis_conn):
    handles = _sleepers(4, 60, "slot")
    victim = workers.start(env=_slotted(4))
    workers.wait_for("four runs at once", lambda: _all_running(handles))

    # RQ's own bookkeeping: every run in flight is in the started registry, and each is the
    # current job of one registered worker (the process's four slots).
    started = set(StartedJobRegistry("default", connection=redis_conn).get_job_ids())
    rq_ids = {JobRun.objects.get(pk=h.run_id).rq_job_id for h in handles}
    assert rq_ids <= started
    current = {w.get_current_job_id() for w in RQWorker.all(connection=redis_conn)}
    assert rq_ids <= current
    names = {w.name for w in RQWorker.all(connection=redis_conn)}
    assert len(names) == 4 and sum(".s" in n for n in names) == 3

    # Killed with four runs in flight: none is lost, none stays running.
    victim.send_signal(signal.SIGKILL)
    assert victim.wait() == -signal.SIGKILL
    workers.start(env=_slotted(4))  # the survivor sweeps and runs the retries
    workers.wait_for(
        "every retry to succeed",
        lambda: all(status(h.run_id) == RunStatus.SUCCEEDED for h in handles),
    )
    for n, h in enumerate(handles):
        assert attempts_of(h.run_id) == [(1, "failed", "Abandoned"), (2, "succeeded", "")]
        schema = ["t1", "t2", "t3"][n % 3]
        assert f"slot{n} a2 {schema}" in effects(schema, "sleeper")


def test_warm_shutdown_waits_for_every_slot(tenants, workers):
    handles = _sleepers(3, 3, "warm")
    proc = workers.start(env=_slotted(3))
    workers.wait_for("three runs at once", lambda: _all_running(handles))
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(DEADLINE) == 0
    for h in handles:
        run = JobRun.objects.get(pk=h.run_id)
        assert (run.status, run.attempts) == (RunStatus.SUCCEEDED, 1)


def test_cold_shutdown_leaves_every_slots_run_to_the_sweep(tenants, workers):
    import time

    handles = _sleepers(2, 60, "cold")
    proc = workers.start(env=_slotted(2))
    workers.wait_for("two runs at once", lambda: _all_running(handles))
    proc.send_signal(signal.SIGTERM)
    time.sleep(1.5)  # RQ ignores a second signal within one second of the first
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(DEADLINE) == 1
    assert _all_running(handles)  # nothing recorded: a crash
    workers.start(env=_slotted(2))
    workers.wait_for(
        "the retries", lambda: all(status(h.run_id) == RunStatus.SUCCEEDED for h in handles)
    )
    for h in handles:
        assert attempts_of(h.run_id) == [(1, "failed", "Abandoned"), (2, "succeeded", "")]


def _marks(path: Path) -> list[tuple[int, str, float]]:
    lines = [line.split(" ") for line in path.read_text().splitlines()]
    return [(int(a), " ".join(rest[:-1]), float(rest[-1])) for a, *rest in lines]


def test_a_timeout_in_a_sibling_slot_is_final(tenants, tmp_path, monkeypatch):
    """Two overrunning runs at once in a 2-slot in-process worker: one of them in the sibling
    slot (they overlap), whose timeout is the slot's timer. Each catches the timeout and goes
    on; each is recorded timed out all the same, and its SQL after the timeout is refused."""
    monkeypatch.setenv(conf.CONCURRENCY_ENV, "2")
    paths = [tmp_path / "a.marks", tmp_path / "b.marks"]
    handles = [
        jobs.overruns.enqueue(tenant=t, tag=f"over-{t}", marks=str(p), seconds=3)
        for t, p in zip(("t1", "t2"), paths, strict=True)
    ]
    work()
    a, b = (_marks(p) for p in paths)
    first = [m for m in a if m[0] == 1], [m for m in b if m[0] == 1]
    # They ran at once: each first attempt started before the other's ended.
    assert first[0][0][2] < first[1][-1][2] and first[1][0][2] < first[0][-1][2]
    for handle, marks in zip(handles, first, strict=True):
        events = [event for _, event, _ in marks]
        assert "caught JobTimeoutException" in events
        assert "sql-refused" in events and "sql-ran" not in events
        attempt = JobAttempt.objects.get(run_id=handle.run_id, number=1)
        assert attempt.outcome == "retrying" and "exceeded its timeout" in attempt.error_message
        run = JobRun.objects.get(pk=handle.run_id)
        assert (run.status, run.attempts) == (RunStatus.SUCCEEDED, 2)


def test_one_slot_is_todays_worker(tenants, redis_conn):
    """The default (1): no sibling is made, the process registers one RQ worker."""
    assert conf.worker_concurrency() == 1
    jobs.probe.enqueue(tenant="t1", tag="one")
    work()
    assert transport.get_queue("default").count == 0
    assert RQWorker.all(connection=redis_conn) == []  # the burst worker left, alone


def test_mixed_tenants_in_four_slots_each_run_sees_only_its_own(tenants, monkeypatch):
    """Thirty runs over three tenants, four at once: each run writes in its own tenant and reads
    only its own tenant's rows, whichever slot (thread, connections, tenant login) ran it and
    whatever ran beside it. Calibrated: with the siblings handed the main thread's Django
    connections (one connection shared by the slots), runs fail or see the wrong schema."""
    from tests.conftest import probes

    monkeypatch.setenv(conf.CONCURRENCY_ENV, "4")
    schemas = ["t1", "t2", "t3"]
    handles = [
        jobs.list_tags.enqueue(tenant=schemas[n % 3], tag=f"{schemas[n % 3]}-{n}")
        for n in range(30)
    ]
    work()
    assert {JobRun.objects.get(pk=h.run_id).status for h in handles} == {RunStatus.SUCCEEDED}
    for schema in schemas:
        rows = probes(schema)
        assert len(rows) == 10
        for row in rows:
            assert row.schema_seen == schema
            seen = [tag for tag in row.note.split(",") if tag]
            assert all(tag.startswith(f"{schema}-") for tag in seen), (schema, seen)


# ------------------------------------------------------------------- a sibling's SQL statement


def _sleeping_backends() -> int:
    """Backends still running ``sleeps_in_postgres``'s statement (another session's view)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND query LIKE %s "
            "AND pid <> pg_backend_pid()",
            ["%kumiko-timeout-probe%"],
        )
        return int(cursor.fetchone()[0])


def _slot_of(handle: Any, redis_conn: Any) -> str:
    """The name of the slot (RQ worker) executing the run of ``handle``."""
    rq_id = JobRun.objects.get(pk=handle.run_id).rq_job_id
    names = [w.name for w in RQWorker.all(connection=redis_conn) if w.get_current_job_id() == rq_id]
    assert len(names) == 1, names
    return names[0]


def test_a_statement_in_a_sibling_slot_is_cancelled_at_its_timeout(
    tenants, workers, redis_conn, tmp_path
):
    """A 4-slot ``rqworker``: other tenants' runs in three slots, the main one among them, and
    in the fourth, a sibling, a run that blocks in one SQL statement (``pg_sleep(30)``, timeout
    1 s). PostgreSQL cancels the statement at the timeout, so that run fails timed out, the
    others succeed on their first attempt, and the process lives on past the watchdog's
    deadline (``TIMEOUT_KILL_AFTER``), where it otherwise exits with every slot's run."""
    kill_after = 3
    env = _slotted(4)
    env[soak.SETTINGS_ENV] = json.dumps(fast_settings(TIMEOUT_KILL_AFTER=kill_after))
    env.setdefault("KUMIKO_LOG", "WARNING")
    proc = workers.launch(("rqworker", "default"), env, name="worker")
    # Four runs hold the four slots; the one in a sibling is let go, and the blocked run
    # takes the one free slot (the main slot's timeout is SIGALRM's, a sibling's the alarm
    # thread's).
    releases = [tmp_path / f"release{n}" for n in range(4)]
    holders = [
        jobs.holds_a_slot.enqueue(tenant=schema, tag=f"held{n}", release=str(path))
        for n, (schema, path) in enumerate(zip(("t2", "t3", "t2", "t3"), releases, strict=True))
    ]
    workers.wait_for("four runs at once", lambda: _all_running(holders))
    slots = [_slot_of(h, redis_conn) for h in holders]
    let_go = next(n for n, name in enumerate(slots) if ".s" in name)
    releases[let_go].touch()
    workers.wait_for("a sibling to be free", lambda: _all_running(holders) is False)
    neighbours = [h for n, h in enumerate(holders) if n != let_go]
    assert _all_running(neighbours)

    blocked = jobs.sleeps_in_postgres.enqueue(tenant="t1", tag="blocked")
    workers.wait_for("the blocked run to end", lambda: status(blocked.run_id) == RunStatus.FAILED)
    attempt = JobAttempt.objects.get(run_id=blocked.run_id)
    assert attempt.error_type == "JobTimeoutException"
    assert "exceeded maximum timeout value (1 seconds)" in attempt.error_message
    assert _sleeping_backends() == 0  # no backend sleeps on for it

    # Past the watchdog's deadline for the blocked run, the process still serves its slots.
    time.sleep(1 + kill_after + 2)
    assert proc.poll() is None, workers.logs()
    assert _all_running(neighbours)
    for path in releases:
        path.touch()
    workers.wait_for(
        "the other runs to succeed",
        lambda: all(status(h.run_id) == RunStatus.SUCCEEDED for h in holders),
    )
    for h in holders:
        assert attempts_of(h.run_id) == [(1, "succeeded", "")]
    assert proc.poll() is None


# ------------------------------------------------------------ Django's ContentType cache


@pytest.fixture
def probe_types(tenants: Any) -> Iterator[tuple[int, int]]:
    """Probe's content type with another id in t2 than in t1 (t2's old row renamed, a new one
    added), as schemas migrated at different times have; (t1's id, t2's id). The manager's
    cache is Django's again afterwards."""
    from django.contrib.contenttypes.models import ContentType
    from django.db import connection

    manager: Any = ContentType.objects
    original = manager._cache
    where = "app_label = 'testapp' AND model = %s"
    with connection.cursor() as cursor:
        cursor.execute(
            f'UPDATE "t2".django_content_type SET model = %s WHERE {where}', ["old", "probe"]
        )
        cursor.execute(
            "INSERT INTO \"t2\".django_content_type (app_label, model) VALUES ('testapp', 'probe')"
        )
        ids = []
        for schema in ("t1", "t2"):
            cursor.execute(
                f'SELECT id FROM "{schema}".django_content_type WHERE {where}', ["probe"]
            )
            ids.append(cursor.fetchone()[0])
    try:
        assert ids[0] != ids[1]
        yield ids[0], ids[1]
    finally:
        connection.set_schema_to_public()
        manager._cache = original
        manager.clear_cache()
        with connection.cursor() as cursor:
            cursor.execute(f'DELETE FROM "t2".django_content_type WHERE {where}', ["probe"])
            cursor.execute(
                f'UPDATE "t2".django_content_type SET model = %s WHERE {where}', ["probe", "old"]
            )


def _probe_type() -> Any:
    from django.contrib.contenttypes.models import ContentType

    from tests.testapp.models import Probe

    return ContentType.objects.get_for_model(Probe)


def holds_content_type(ctx: Any, *, seconds: float) -> int:
    """Looks Probe's content type up again and again for ``seconds`` (its slot's cache)."""
    end, seen = time.monotonic() + seconds, 0
    while time.monotonic() < end:
        seen = _probe_type().id
        time.sleep(0.01)
    return seen


def reads_content_type(ctx: Any, *, delay: float, other_id: int) -> dict[str, Any]:
    """After ``delay``, Probe's content type by model, and the row ``other_id`` names here."""
    from django.contrib.contenttypes.models import ContentType

    time.sleep(delay)
    return {
        "by_model": _probe_type().id,
        "by_id": ContentType.objects.get_for_id(other_id).model,
    }


def test_a_slot_never_reads_another_tenants_content_types(declare, probe_types, monkeypatch):
    """Two slots at once: t1's run keeps Probe's content type in its cache while t2's run
    looks it up, by model and by id. t2's run gets t2's rows: the cache is per slot and schema
    (``worker.schema_caches``), not Django's one dict per process."""
    t1_id, t2_id = probe_types
    monkeypatch.setenv(conf.CONCURRENCY_ENV, "2")
    holding = declare(holds_content_type).enqueue(tenant="t1", seconds=3.0)
    reading = declare(reads_content_type).enqueue(tenant="t2", delay=1.0, other_id=t1_id)
    work()
    held, read = (JobRun.objects.get(pk=h.run_id) for h in (holding, reading))
    assert (held.status, held.result) == (RunStatus.SUCCEEDED, t1_id)
    assert read.status == RunStatus.SUCCEEDED, read.error_message
    # t1's id in t2 is t2's renamed row, not t1's Probe.
    assert read.result == {"by_model": t2_id, "by_id": "old"}


def test_the_keyed_content_type_cache_still_caches_and_clears(probe_types):
    """The allowed path: in one thread and schema a second lookup is the cache's (no query);
    a schema switch still empties it (django-tenants), and each schema reads its own."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext
    from django_tenants.utils import schema_context

    t1_id, t2_id = probe_types
    schema_caches.key_by_schema()
    for schema, expected in (("t1", t1_id), ("t2", t2_id), ("t1", t1_id)):
        with schema_context(schema):
            assert _probe_type().id == expected
            with CaptureQueriesContext(connection) as queries:
                assert _probe_type().id == expected
            assert len(queries) == 0
