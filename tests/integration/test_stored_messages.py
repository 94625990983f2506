"""Messages written by an older layout of the package still run after the code moved.

Every queued message and every cron entry names ``kumiko_jobs.runner.execute`` as its function
and carries a signed envelope; both live in Redis across deploys. ``data/pre_house_message.json``
is one real message as RQ stored it (every field of its job hash, byte for byte) together with
its history row, and ``data/pre_house_cron_entry.json`` one cron job's entry in rq-scheduler's
set (``every_minute`` of the test app), both captured on 2026-12-01 from the code before the
package was split into layers (issue 16). Re-capturing them from today's code would prove
nothing: keep the files as they are.

``capture()`` and ``capture_cron_entry()`` below are how they were made (run once inside a test
with the ``tenants`` fixture).
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from django.test import override_settings

from kumiko_jobs import transport
from kumiko_jobs.models import JobRun, RejectedMessage, RunStatus
from tests.conftest import work
from tests.integration.test_messages import tenant_tags

pytestmark = pytest.mark.usefixtures("live_db")

FIXTURE = Path(__file__).parent / "data" / "pre_house_message.json"
# The captured message is signed once and for ever: it is years old by the time this runs in
# some CI, so the test accepts old messages (the expiry has its own tests in test_messages).
FOREVER = 100 * 365 * 24 * 3600
CRON_FIXTURE = Path(__file__).parent / "data" / "pre_house_cron_entry.json"
SCHEDULED = "rq:scheduler:scheduled_jobs"  # rq-scheduler's sorted set of due times


def capture(path: Path = FIXTURE) -> None:
    """Enqueue one probe run for t2 and write its RQ job hash and history row to ``path``."""
    from tests.testapp import jobs

    handle = jobs.probe.enqueue(tenant="t2", tag="queued-before-the-move")
    queue = transport.get_queue("default")
    job_id = queue.job_ids[0]
    redis = transport.connection_for("default")
    fields = redis.hgetall(f"rq:job:{job_id}")
    row = JobRun.objects.filter(pk=handle.run_id).values().get()
    document = {
        "job_id": job_id,
        "queue": "default",
        "job_hash": {k.decode(): base64.b64encode(v).decode() for k, v in sorted(fields.items())},
        "run": {k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in row.items()},
    }
    document["run"]["run_id"] = str(document["run"]["run_id"])
    path.write_text(json.dumps(document, indent=2, sort_keys=True, default=str) + "\n")


def capture_cron_entry(path: Path = CRON_FIXTURE) -> None:
    """Register the test app's cron jobs and write ``every_minute``'s entry to ``path``."""
    from kumiko_jobs.enqueueing.schedules import schedule_id, sync_schedules
    from tests.testapp import jobs

    sync_schedules()
    alarm = schedule_id(jobs.every_minute)
    fields = transport.connection_for("default").hgetall(f"rq:job:{alarm}")
    document = {
        "job_id": alarm,
        "job_hash": {k.decode(): base64.b64encode(v).decode() for k, v in sorted(fields.items())},
    }
    path.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")


def _load(path: Path = FIXTURE) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(path.read_text())
    return document


def _restore(document: dict[str, Any]) -> str:
    """Put the captured run row back and the captured message into the queue, as Redis held it."""
    run = dict(document["run"])
    run["run_id"] = uuid.UUID(run["run_id"])
    for field in JobRun._meta.concrete_fields:
        value = run.get(field.attname)
        if isinstance(value, str) and field.get_internal_type() == "DateTimeField":
            run[field.attname] = datetime.fromisoformat(value)
    JobRun.objects.create(**run)
    redis = transport.connection_for("default")
    job_id = document["job_id"]
    fields = {k: base64.b64decode(v) for k, v in document["job_hash"].items()}
    redis.hset(f"rq:job:{job_id}", mapping=fields)
    redis.rpush(f"rq:queue:{document['queue']}", job_id)
    redis.sadd("rq:queues", f"rq:queue:{document['queue']}")
    return str(run["run_id"])


def test_the_captured_message_names_the_runner_path_that_must_stay():
    """The fixture is what the other test claims: an RQ job of ``kumiko_jobs.runner.execute``."""
    document = _load()
    description = base64.b64decode(document["job_hash"]["description"]).decode()
    assert description.startswith("kumiko_jobs.runner.execute(")
    assert transport.RUNNER == "kumiko_jobs.runner.execute"


def test_a_message_queued_before_the_package_moved_still_runs_in_its_tenant(tenants):
    document = _load()
    with override_settings(
        KUMIKO_JOBS={
            "DB_GUARD": "enforce",
            "DEFAULT_RETRIES": 0,
            "PUSH_FAILURE_PAUSE": 0,
            "MESSAGE_MAX_AGE": FOREVER,
            "RETENTION_DAYS": FOREVER // 86400 + 1,
        }
    ):
        run_id = _restore(document)
        work()
    run = JobRun.objects.get(pk=run_id)
    assert RejectedMessage.objects.count() == 0, RejectedMessage.objects.values_list("reason")
    assert run.status == RunStatus.SUCCEEDED, (run.status, run.error_message)
    assert tenant_tags("t2") == ["queued-before-the-move"]
    assert tenant_tags("t1") == [] and tenant_tags("t3") == []


def test_the_same_message_is_refused_once_it_is_older_than_message_max_age(tenants):
    """Calibration: the run above ran because of its signature and path, not because nothing is
    checked; with the default MESSAGE_MAX_AGE the same old message is refused and runs nowhere."""
    document = _load()
    queued_at = datetime.fromisoformat(document["run"]["queued_at"])
    age = (datetime.now(queued_at.tzinfo) - queued_at).total_seconds()
    with override_settings(
        KUMIKO_JOBS={
            "DB_GUARD": "enforce",
            "DEFAULT_RETRIES": 0,
            "PUSH_FAILURE_PAUSE": 0,
            "MESSAGE_MAX_AGE": max(int(age) // 2, 1),
        }
    ):
        _restore(document)
        work()
    assert "MESSAGE_MAX_AGE" in RejectedMessage.objects.get().reason
    assert tenant_tags("t2") == []


def test_a_cron_entry_registered_before_the_package_moved_still_fans_out(tenants):
    """rq-scheduler keeps the entry (its function path and its signed template) across deploys:
    rung after the move, it fires one tick that runs in every tenant once."""
    document = _load(CRON_FIXTURE)
    redis = transport.connection_for("default")
    into_minute = time.time() % 60
    if into_minute > 50:  # the tick is named after its minute; keep one minute for the test
        time.sleep(60 - into_minute + 0.5)
    fields = {k: base64.b64decode(v) for k, v in document["job_hash"].items()}
    redis.hset(f"rq:job:{document['job_id']}", mapping=fields)
    redis.zadd(SCHEDULED, {document["job_id"]: int(time.time()) - 1})
    assert transport.move_due_scheduled_jobs("default") == 1
    work()  # the tick: fans out one child per tenant
    work()  # the children
    for schema in ("t1", "t2", "t3"):
        assert tenant_tags(schema) == ["cron"]
    assert RejectedMessage.objects.count() == 0
    # The entry rang for this tick only: the alarm is set again for a later one.
    due = redis.zscore(SCHEDULED, document["job_id"])
    assert due is not None and due > time.time()
