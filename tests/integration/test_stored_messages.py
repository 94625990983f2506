"""Messages written by an older layout of the package still run after the code moved.

Every queued message and every cron entry names ``kumiko_jobs.runner.execute`` as its function
and carries a signed envelope; both live in Redis across deploys. ``data/pre_house_message.json``
is one real message as RQ stored it (every field of its job hash, byte for byte) together with
its history row, captured on 2026-12-01 from the code before the package was split into layers
(issue 16). Re-capturing it from today's code would prove nothing: keep the file as it is.

``capture()`` below is how it was made (run once inside a test with the ``tenants`` fixture).
"""

from __future__ import annotations

import base64
import json
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from django.db import connections
from django.test import override_settings

from kumiko_jobs import transport
from kumiko_jobs.models import JobRun, RejectedMessage, RunStatus
from tests.conftest import work

pytestmark = pytest.mark.usefixtures("live_db")

FIXTURE = Path(__file__).parent / "data" / "pre_house_message.json"
# The captured message is signed once and for ever: it is years old by the time this runs in
# some CI, so the test accepts old messages (the expiry has its own tests in test_messages).
FOREVER = 100 * 365 * 24 * 3600


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


def _load() -> dict[str, Any]:
    document: dict[str, Any] = json.loads(FIXTURE.read_text())
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


def _probe_tags(schema: str) -> list[str]:
    """Read through a second connection: what the tenant's table really holds."""
    other = connections.create_connection("default")
    try:
        with other.cursor() as cursor:
            cursor.execute(f'SELECT tag FROM "{schema}".testapp_probe ORDER BY id')
            return [row[0] for row in cursor.fetchall()]
    finally:
        other.close()


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
    assert _probe_tags("t2") == ["queued-before-the-move"]
    assert _probe_tags("t1") == [] and _probe_tags("t3") == []


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
    assert _probe_tags("t2") == []
