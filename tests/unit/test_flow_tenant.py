"""A system run a tenant's run started counts against that tenant (``Envelope.flow_tenant``):
the envelope carries the tenant (``flow_schema``), signed, and the row keeps it; the message is
filed in the tenant's bucket, with its weight, its ``TENANT_CONCURRENCY`` cap and its
``TENANT_RATE_LIMIT`` window, and the job's own options stay the system's."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.core import signing

from kumiko_jobs.core.envelope import Envelope, decode, encode
from kumiko_jobs.core.exceptions import EnvelopeError
from kumiko_jobs.definition.options import build_definition
from kumiko_jobs.enqueueing.messages import caps_of, envelope_of, message_for, rates_of, row_for

RUN_ID = "0123456789abcdef0123456789abcdef"
SALT = "kumiko_jobs.envelope.v2"


def a_job(ctx: Any, *, tag: str = "") -> None:
    pass


def system(**options: Any) -> Any:
    return build_definition(
        a_job, {"name": "flow.system", "system": True, "tenant_may_start": True, **options}
    )


def tenant_run(schema: str = "t1") -> Envelope:
    return Envelope(job="flow.parent", schema=schema, kwargs={}, run_id=RUN_ID)


def weight_by_plan(schema: str) -> float:
    return {"t1": 3.0}.get(schema, 1.0)


def test_a_system_follow_up_of_a_tenant_run_counts_against_that_tenant() -> None:
    started = tenant_run().followup("flow.system", None, {}, {})
    assert (started.schema, started.flow_schema, started.flow_tenant) == (None, "t1", "t1")
    # ... and so does a system run that one starts, and its retries and deferrals
    chained = started.followup("flow.system", None, {}, {})
    assert chained.flow_tenant == "t1"
    assert chained.next_attempt().flow_tenant == chained.deferred(by_gate=False).flow_tenant
    # a tenant follow-up is its own tenant's; a plain system run's is no tenant's
    assert tenant_run().followup("flow.child", "t1", {}, {}).flow_schema is None
    plain = Envelope(job="flow.cron", schema=None, kwargs={}, run_id=RUN_ID)
    assert plain.flow_tenant is None
    assert plain.followup("flow.system", None, {}, {}).flow_tenant is None


def test_the_tenant_is_signed_and_only_a_system_run_carries_it() -> None:
    started = tenant_run().followup("flow.system", None, {}, {})
    assert decode(encode(started)) == started
    # without it the message is the text it was before the field existed
    plain = Envelope(job="flow.cron", schema=None, kwargs={}, run_id=RUN_ID)
    payload = json.loads(signing.Signer(salt=SALT, algorithm="sha256").unsign(encode(plain)))
    assert "flow_schema" not in payload and decode(encode(plain)).flow_schema is None
    for bad in (
        Envelope(job="flow.x", schema="t2", kwargs={}, run_id=RUN_ID, flow_schema="t1"),
        Envelope(job="flow.x", schema=None, kwargs={}, run_id=RUN_ID, flow_schema="public"),
        Envelope(job="flow.x", schema=None, kwargs={}, run_id=RUN_ID, flow_schema="T 1;"),
    ):
        with pytest.raises(EnvelopeError, match="flow_schema"):
            decode(encode(bad))


def test_its_message_is_filed_and_held_by_the_tenant(settings: Any) -> None:
    settings.KUMIKO_JOBS = {
        **settings.KUMIKO_JOBS,
        "TENANT_CONCURRENCY": 2,
        "TENANT_RATE_LIMIT": "30/h",
        "TENANT_WEIGHT": f"{__name__}.weight_by_plan",
    }
    started = tenant_run().followup("flow.system", None, {}, {})
    message = message_for(system(), started, 0)
    assert (message.bucket, message.weight) == ("t1", 3.0)
    assert message.caps == (("t:t1", 2, "t"),)
    assert message.rates == (("t:t1", 30, 3600),)
    # the job's own options stay the system's (a sequential system job: one at a time in all)
    own = system(concurrency="sequential", tenant_rate_limit="5/m")
    assert caps_of(own, None, flow="t1") == (("j:flow.system\t!system", 1, "j"), ("t:t1", 2, "t"))
    assert rates_of(own, started) == (("jt:flow.system\t!system", 5, 60), ("t:t1", 30, 3600))
    # a plain system run is held by no tenant, as before
    plain = message_for(
        system(), Envelope(job="flow.system", schema=None, kwargs={}, run_id=RUN_ID), 0
    )
    assert (plain.bucket, plain.caps, plain.rates) == ("!system", (), ())


def test_the_row_keeps_the_tenant_for_the_relay() -> None:
    started = tenant_run().followup("flow.system", None, {"tag": "x"}, {})
    row = row_for(system(), started, "", 0)
    assert (row.schema_name, row.flow_schema) == ("", "t1")
    assert envelope_of(row, attempt=1).flow_schema == "t1"
    tenant = row_for(system(), tenant_run(), "", 0)
    assert tenant.flow_schema == "" and envelope_of(tenant, attempt=1).flow_schema is None
