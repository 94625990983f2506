"""The COPY rows of enqueue_many (enqueueing/bulk_rows.py): the same rows row_for makes, in
chunks, and nothing at all written when any item, the last chunk's included, is refused."""

from __future__ import annotations

import ast
from typing import Any

import pytest
from django.db import transaction

from kumiko_jobs import transport
from kumiko_jobs.core.envelope import decode
from kumiko_jobs.core.exceptions import InvalidJob
from kumiko_jobs.definition.subject import build_subject
from kumiko_jobs.enqueueing import bulk_rows
from kumiko_jobs.enqueueing.messages import row_for
from kumiko_jobs.models import JobRun
from tests.conftest import probes, work
from tests.testapp import jobs

pytestmark = pytest.mark.usefixtures("live_db")


def _pushed_envelopes() -> dict[str, Any]:
    queue = transport.get_queue("default")
    out = {}
    for job_id in transport.waiting_job_ids("default"):
        job = queue.fetch_job(job_id)
        assert job is not None
        env = decode(job.args[0])
        out[env.run_id] = env
    return out


@pytest.mark.parametrize(
    ("job", "tenant", "items"),
    [
        (jobs.probe, "t1", [{"tag": f"r{i}", "payload": {"i": i}} for i in range(5)]),
        (jobs.probe.using(priority=7), "t2", [{"tag": "high"}, {"tag": "higher"}]),
        (jobs.flaky, "t1", [{"tag": "f0", "fail_times": 0}, {"tag": "f1", "fail_times": 2}]),
        (jobs.system_tick, None, [{"tag": "sys0"}, {"tag": "sys1"}]),
    ],
    ids=["tenant", "using-priority", "retries", "system"],
)
def test_copied_rows_are_row_fors_field_by_field(tenants, job, tenant, items):
    with transaction.atomic():
        handles = job.enqueue_many(items, tenant=tenant)
    envelopes = _pushed_envelopes()
    rows = {r.run_id.hex: r for r in JobRun.objects.all()}
    assert [h.run_id for h in handles] == list(envelopes) and rows.keys() == envelopes.keys()
    fields = [f for f in JobRun._meta.concrete_fields if f.attname != "queued_at"]
    for handle, kwargs in zip(handles, items, strict=True):
        env = envelopes[handle.run_id]
        expected = row_for(job, env, build_subject(job, kwargs), 0.0)
        got = rows[handle.run_id]
        for field in fields:
            assert getattr(got, field.attname) == getattr(expected, field.attname), field.name
    queued = [rows[h.run_id].queued_at for h in handles]
    assert queued == sorted(queued) and len(set(queued)) == len(queued)  # the items' order


def test_chunks_write_every_row_in_order(tenants, monkeypatch):
    monkeypatch.setattr(bulk_rows, "COPY_CHUNK", 3)
    with transaction.atomic():
        handles = jobs.probe.enqueue_many([{"tag": f"c{i}"} for i in range(7)], tenant="t1")
    assert JobRun.objects.count() == 7
    assert [i.split("-")[1] for i in transport.waiting_job_ids("default")] == [
        h.run_id for h in handles
    ]
    work()
    assert sorted(p.tag for p in probes("t1")) == sorted(f"c{i}" for i in range(7))


def test_a_bad_item_in_the_last_chunk_writes_nothing_and_loses_nothing(tenants, monkeypatch):
    monkeypatch.setattr(bulk_rows, "COPY_CHUNK", 3)
    items: list[dict[str, Any]] = [{"tag": f"b{i}"} for i in range(8)] + [{"tag": 1.5j}]
    with transaction.atomic():
        kept = jobs.probe.enqueue(tenant="t1", tag="before")  # the caller's other work
        with pytest.raises(InvalidJob, match=r"item 8: "):
            jobs.probe.enqueue_many(items, tenant="t1")
    assert list(JobRun.objects.values_list("run_id", flat=True)) == [JobRun.objects.get().run_id]
    assert JobRun.objects.get().run_id.hex == kept.run_id
    assert transport.queue_length("default") == 1
    work()
    assert [p.tag for p in probes("t1")] == ["before"]


@pytest.mark.parametrize(
    ("job", "items"),
    [
        (jobs.probe.using(priority=3), [{"tag": f"m{i}"} for i in range(3)]),
        (jobs.tenant_rate_probe, [{"tag": "r0"}, {"tag": "r1"}]),
        (jobs.per_account, [{"account": f"acct{i}", "tag": f"p{i}"} for i in range(3)]),
    ],
    ids=["priority", "tenant-rate", "rate-limit-by"],
)
def test_each_message_is_message_fors(tenants, job, items):
    """The fields a bulk call's messages share are taken from its first message
    (messages.sibling_message): each is still what message_for makes for its item, the
    windows an item's own argument chooses (rate_limit_by) included."""
    from kumiko_jobs.enqueueing.messages import message_for

    with transaction.atomic():
        handles = job.enqueue_many(items, tenant="t2")
    queue = transport.get_queue("default")
    metas = []
    for handle in handles:
        rq_job = queue.fetch_job(f"kj-{handle.run_id}-a1-d0-g0")
        assert rq_job is not None
        env = decode(rq_job.args[0])
        expected = message_for(job, env, 0.0)
        assert rq_job.meta == expected.meta and rq_job.timeout == expected.timeout
        metas.append(rq_job.meta)
    rates = {str(m["kumiko_fair"][4:]) for m in metas}
    assert len(rates) == (len(items) if job is jobs.per_account else 1)


def test_a_bad_item_mid_copy_outside_a_transaction_writes_nothing(tenants, monkeypatch):
    """The rows stream into COPY as they are made (bulk._copied): a refusal after whole
    chunks were copied, with no transaction of the caller's around it, takes them all back,
    and the connection serves the next enqueue."""
    monkeypatch.setattr(bulk_rows, "COPY_CHUNK", 2)
    items: list[dict[str, Any]] = [{"tag": f"m{i}"} for i in range(5)] + [{"tag": object()}]
    with pytest.raises(InvalidJob, match=r"item 5: "):
        jobs.probe.enqueue_many(items, tenant="t1")
    assert JobRun.objects.count() == 0 and transport.queue_length("default") == 0
    jobs.probe.enqueue_many([{"tag": "after"}], tenant="t1")
    work()
    assert [p.tag for p in probes("t1")] == ["after"]


_weights_asked: list[str] = []


def weight_from_the_database(schema: str) -> float:
    """TENANT_WEIGHT for the test below: asks PostgreSQL, as a project's callable may."""
    from example_project.customers.models import Client

    _weights_asked.append(schema)
    return 2.0 if Client.objects.filter(schema_name=schema).exists() else 1.0


@pytest.mark.parametrize(
    ("job", "items", "asked"),
    [
        (jobs.probe, [{"tag": f"w{i}"} for i in range(4)], 1),
        (jobs.per_account, [{"account": f"a{i}", "tag": f"w{i}"} for i in range(4)], 4),
    ],
    ids=["shared-fields-streamed", "per-item-fields-made-first"],
)
def test_a_weight_callable_that_queries_runs_outside_the_copy(tenants, job, items, asked):
    """A project's TENANT_WEIGHT may query the database: it is called for the first item only
    when the call's runs share their fields, and for every item, all before the COPY, when an
    item's arguments choose them (a query during a COPY would fail)."""
    from django.conf import settings
    from django.test import override_settings

    _weights_asked.clear()
    path = f"{__name__}.weight_from_the_database"
    weighted = override_settings(KUMIKO_JOBS={**settings.KUMIKO_JOBS, "TENANT_WEIGHT": path})
    with weighted, transaction.atomic():
        handles = job.enqueue_many(items, tenant="t1")
    assert len(handles) == len(items) == JobRun.objects.count()
    assert _weights_asked == ["t1"] * asked


# What COPY's text format gives a meaning to (tab and newline end a field or a row, a backslash
# escapes, ``\N`` is NULL, ``\.`` ends the data), and text that looks like another row's fields.
_CRAFTED = [
    "a\tb",
    "row\nnext",
    "cr\rlf\r\n",
    "back\\slash",
    "\\.",
    "\\.\n",
    "\n\\.\n",
    "\\N",
    "end\\",
    "\\t not a tab",
    'x"\t"t2"\t"testapp.list_tags',
    "\x01\x1f\x7f",
    "\u2028ü€😀",
    "t2\ttestapp.list_tags\t\\N\n",
]


def test_crafted_text_in_arguments_lands_as_given_in_its_own_row(tenants, monkeypatch):
    """An attacker's pass at the COPY stream (bulk_rows.py): arguments holding what COPY's text
    format gives a meaning to, in the tenant-visible subject (``flaky``'s ``tag``) and in the
    payload (``probe``'s), keys included, across chunk boundaries. Every row is ``row_for``'s
    field by field (its tenant, job and queue the call's), its payload the signed message's
    arguments, and the worker runs each with exactly them in t1's schema; nothing reaches t2."""
    monkeypatch.setattr(bulk_rows, "COPY_CHUNK", 3)
    subject_items = [{"tag": text, "fail_times": 0} for text in _CRAFTED]
    payload_items = [
        {"tag": f"p{i}", "payload": {text: [text, {"k\t\\.": text}], "n": i}}
        for i, text in enumerate(_CRAFTED)
    ]
    with transaction.atomic():
        handles = jobs.flaky.enqueue_many(subject_items, tenant="t1")
        handles += jobs.probe.enqueue_many(payload_items, tenant="t1")
    envelopes = _pushed_envelopes()
    rows = {r.run_id.hex: r for r in JobRun.objects.all()}
    assert len(rows) == len(handles) == 2 * len(_CRAFTED)
    fields = [f for f in JobRun._meta.concrete_fields if f.attname != "queued_at"]
    for handle, (job, kwargs) in zip(
        handles,
        [(jobs.flaky, k) for k in subject_items] + [(jobs.probe, k) for k in payload_items],
        strict=True,
    ):
        env = envelopes[handle.run_id]
        assert env.kwargs == kwargs and env.schema == "t1" and env.job == job.name
        got = rows[handle.run_id]
        expected = row_for(job, env, build_subject(job, kwargs), 0.0)
        for field in fields:
            assert getattr(got, field.attname) == getattr(expected, field.attname), field.name
        assert (got.schema_name, got.job_name, got.payload) == ("t1", job.name, kwargs)
    assert [rows[h.run_id].subject for h in handles[: len(_CRAFTED)]] == [
        f"tag={text}" for text in _CRAFTED
    ]
    work()
    assert {r.status for r in JobRun.objects.all()} == {"succeeded"}
    seen = [(p.tag, p.schema_seen, p.note) for p in probes("t1")]
    assert {(text, "t1") for text in _CRAFTED} <= {(tag, schema) for tag, schema, _ in seen}
    # The job records repr() of the dict it was given (the envelope's keys come sorted).
    ran = {tag: ast.literal_eval(note) for tag, schema, note in seen if tag.startswith("p")}
    assert ran == {item["tag"]: item["payload"] for item in payload_items}
    assert probes("t2") == []


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        ({"tag": "nul\x00"}, "NUL"),
        ({"tag": "x", "payload": {"k": "\ud800"}}, "lone surrogate"),
        ({"tag": "x", "payload": {"k\x00": 1}}, "NUL"),
        ({"tag": "x", "payload": {"big": "x" * (512 * 1024)}}, "MAX_ENVELOPE_BYTES"),
        ({"tag": "x", "payload": {"n": 10**5000}}, "digits"),
    ],
    ids=["nul-subject", "surrogate", "nul-key", "huge", "huge-int"],
)
def test_text_copy_cannot_carry_refuses_the_whole_call_by_index(tenants, monkeypatch, bad, why):
    """What PostgreSQL's text and jsonb cannot hold, or what outgrows a message, in an item after
    whole chunks were streamed: ``InvalidJob`` naming that item, before COPY sees it, and the
    call writes and pushes nothing (no DataError from the middle of the stream)."""
    monkeypatch.setattr(bulk_rows, "COPY_CHUNK", 2)
    items: list[dict[str, Any]] = [{"tag": f"ok{i}"} for i in range(5)] + [bad]
    with pytest.raises(InvalidJob, match=rf"item 5: .*{why}"):
        jobs.probe.enqueue_many(items, tenant="t1")
    assert JobRun.objects.count() == 0 and transport.queue_length("default") == 0
