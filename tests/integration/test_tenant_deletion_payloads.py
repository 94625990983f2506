"""Deleting a tenant removes or scrubs its payloads everywhere they are kept (issue 22).

The run history was purged or anonymised (test_retention.py), but the excerpts of its refused
queue messages (``RejectedMessage``) kept its arguments in both ``TENANT_DELETION`` modes: an
expired message, say, is stored with its signed JSON, arguments and all. Now each refusal
notes the tenant its message names, the tenant's deletion deletes those rows ("purge") or
blanks their excerpts ("anonymise"), rows recorded before the column existed are found by the
schema in their excerpt, and a message that arrives after its tenant was deleted keeps no
excerpt.

Real PostgreSQL and Redis, a real worker refusing a real expired message, the tenant model's
own ``delete()``; what is left is read through a second connection. Seen failing with
history/retention.py and history/rejections.py reverted: the secret was still in the excerpts
after the deletion, in both modes, and in the refusal recorded after it.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.db import connections
from django.test import override_settings

from kumiko_jobs import transport
from kumiko_jobs.core import conf
from kumiko_jobs.core.envelope import encode
from kumiko_jobs.enqueueing.messages import envelope_of, message_for
from kumiko_jobs.models import JobRun, RejectedMessage
from tests.conftest import work
from tests.integration.test_messages import push_copy
from tests.testapp import jobs

pytestmark = pytest.mark.usefixtures("live_db")

SECRET = "card-4242-leaving"
OTHERS = "card-1111-staying"
BASE = {"DB_GUARD": "enforce", "DEFAULT_RETRIES": 0, "PUSH_FAILURE_PAUSE": 0}


def stored_rejections() -> list[tuple[str, str]]:
    """(schema_name, excerpt) of every refused message, read through a second connection."""
    other = connections.create_connection("default")
    try:
        with other.cursor() as cursor:
            cursor.execute(
                "SELECT schema_name, excerpt FROM public.kumiko_jobs_rejectedmessage ORDER BY id"
            )
            return [(row[0], row[1]) for row in cursor.fetchall()]
    finally:
        other.close()


def refuse_an_expired_message(schema: str, secret: str) -> None:
    """A run of ``schema`` whose only message expired in the queue; a real worker refuses it
    and records it, arguments and all."""
    handle = jobs.probe.enqueue(tenant=schema, tag="old", payload={"card": secret})
    push_expired(envelope_of(JobRun.objects.get(pk=handle.run_id), attempt=1))
    work()


def push_expired(env: Any) -> None:
    """Replace the queue's messages with ``env`` signed and due MESSAGE_MAX_AGE + 1 min ago."""
    transport.get_queue("default").empty()
    old = time.time() - conf.get().MESSAGE_MAX_AGE - 60
    push_copy(encode(env, now=old), message_for(jobs.probe, env, 0.0).job_id)


def leaving_tenant(schema: str) -> Any:
    from example_project.customers.models import Client

    # bulk_create: a tenant row without creating (or, on delete, dropping) a schema.
    Client.objects.bulk_create([Client(schema_name=schema, name="Leaving")])
    return Client.objects.get(schema_name=schema)


@pytest.fixture
def refused(tenants: dict[str, Any]) -> Any:
    """A leaving tenant's expired message refused by a worker, one of t1's, and a row recorded
    before refusals noted their tenant (its excerpt names the leaving tenant)."""
    tenant = leaving_tenant("leaving9")
    refuse_an_expired_message("leaving9", SECRET)
    refuse_an_expired_message("t1", OTHERS)
    RejectedMessage.objects.create(
        rq_job_id="kj-legacy",
        queue="default",
        reason="recorded before schema_name",
        excerpt=f'{{"job":"testapp.probe","kwargs":{{"card":"{SECRET}"}},"schema":"leaving9"}}:sig',
    )
    stored = stored_rejections()
    # Calibration: the secret is there to be removed, and each refusal names its tenant.
    assert sum(SECRET in excerpt for _, excerpt in stored) == 2
    assert sorted(s for s, _ in stored) == ["", "leaving9", "t1"]
    return tenant


def test_purging_a_tenant_deletes_its_refused_messages(refused):
    refused.delete()
    stored = stored_rejections()
    assert not any(SECRET in excerpt for _, excerpt in stored)
    assert [s for s, _ in stored] == ["t1"]  # the other tenant's stays, untouched
    assert OTHERS in stored[0][1]


def test_anonymising_a_tenant_blanks_its_refused_messages(refused):
    with override_settings(KUMIKO_JOBS={**BASE, "TENANT_DELETION": "anonymise"}):
        refused.delete()
    stored = stored_rejections()
    assert not any(SECRET in excerpt for _, excerpt in stored)
    # The rows stay for the operators (time, queue, reason), their excerpts blank.
    assert sorted(s for s, _ in stored) == ["leaving9", "leaving9", "t1"]
    assert [e for s, e in stored if s == "leaving9"] == ["", ""]
    assert any(OTHERS in e for s, e in stored if s == "t1")


@pytest.mark.parametrize("mode", ["purge", "anonymise"])
def test_a_message_refused_after_its_tenant_was_deleted_keeps_no_payload(tenants, mode):
    """A copy still queued when the tenant went (here: expired, refused after the deletion)."""
    tenant = leaving_tenant("leaving8")
    handle = jobs.probe.enqueue(tenant="leaving8", tag="late", payload={"card": SECRET})
    env = envelope_of(JobRun.objects.get(pk=handle.run_id), attempt=1)
    with override_settings(KUMIKO_JOBS={**BASE, "TENANT_DELETION": mode}):
        tenant.delete()
    push_expired(env)
    work()
    stored = stored_rejections()
    assert [s for s, _ in stored] == ["leaving8"]  # refused and recorded, as before
    assert SECRET not in stored[0][1] and "deleted" in stored[0][1]
