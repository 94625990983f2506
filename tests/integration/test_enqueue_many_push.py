"""The bulk push (transport/job_hashes.py) writes exactly the job hashes RQ writes, in RQ's order.

push_batch builds each message's hash from one RQ-made template instead of an RQ Job per
message; these tests compare what it leaves in Redis with what RQ's own ``Queue.enqueue_many``
leaves for the same messages, field by field, so a change of RQ's format fails here."""

from __future__ import annotations

import zlib
from typing import Any

import pytest

from kumiko_jobs import transport
from kumiko_jobs.transport import job_hashes
from kumiko_jobs.transport.queues import Message
from tests.conftest import probes, work
from tests.testapp import jobs

pytestmark = pytest.mark.usefixtures("live_db")

# Written when the message is written: they differ between any two pushes.
_TIMESTAMPS = {b"created_at", b"enqueued_at"}


def _message(job_id: str, **fields: Any) -> Message:
    base: dict[str, Any] = {
        "body": f"body-of-{job_id}-" + "x" * 100,  # longer than the description's 75
        "queue": "default",
        "job_id": job_id,
        "timeout": 30,
        "bucket": "t1",
        "weight": 2.0,
        "priority": 5,
        "job": "tests.probe",
        "rates": (("j:tests.probe", 10, 60),),
    }
    base.update(fields)
    return Message(**base)


def _hash(redis: Any, job_id: str) -> dict[bytes, bytes]:
    raw: dict[bytes, bytes] = redis.hgetall(f"rq:job:{job_id}")
    return {k: v for k, v in raw.items() if k not in _TIMESTAMPS}


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"bucket": "", "rates": ()},
        {"timeout": 7200},
        {"at_front": True},
        {"body": "b" * (job_hashes.COMPRESS_ABOVE + 1)},
    ],
    ids=["fair-field", "no-meta", "long-timeout", "at-front", "big-compressed"],
)
def test_hashes_are_rqs_field_by_field(fields):
    queue = transport.get_queue("default")
    redis = queue.connection
    job_hashes._push_with_rq(queue, [_message("theirs", **fields)], 600, 3600)
    job_hashes.push_batch(queue, [_message("ours01", **fields)], 600, 3600)
    ours, theirs = _hash(redis, "ours01"), _hash(redis, "theirs")
    # The body differs by the id it names; everything else is byte for byte RQ's.
    assert ours.keys() == theirs.keys()
    for key in ours.keys() - {b"data", b"description"}:
        assert ours[key] == theirs[key], key
    assert ours[b"description"] == theirs[b"description"].replace(b"theirs", b"ours01")
    loaded = {name: queue.fetch_job(name) for name in ("ours01", "theirs")}
    assert loaded["ours01"] is not None and loaded["theirs"] is not None
    # A usual message's data is stored as its JSON (job_hashes._data), which RQ reads as is.
    data = zlib.decompress(ours[b"data"]) if "body" in fields else ours[b"data"]
    assert data == zlib.decompress(theirs[b"data"]).replace(b"theirs", b"ours01")
    assert len(ours[b"data"]) < len(data) if "body" in fields else ours[b"data"] == data
    assert list(loaded["ours01"].args) == [_message("ours01", **fields).body]
    assert loaded["ours01"].func_name == loaded["theirs"].func_name
    assert loaded["ours01"].meta == loaded["theirs"].meta
    assert set(redis.smembers("rq:queues")) == {queue.key.encode()}


def test_queue_order_is_rqs_with_messages_at_the_front():
    queue = transport.get_queue("default")
    redis = queue.connection
    flags = [False, True, False, False, True, False]
    job_hashes._push_with_rq(
        queue, [_message(f"r{i}", at_front=f) for i, f in enumerate(flags)], 600, 3600
    )
    rq_order = [i.decode()[1:] for i in redis.lrange(queue.key, 0, -1)]
    redis.delete(queue.key)
    job_hashes.push_batch(
        queue, [_message(f"o{i}", at_front=f) for i, f in enumerate(flags)], 600, 3600
    )
    our_order = [i.decode()[1:] for i in redis.lrange(queue.key, 0, -1)]
    assert our_order == rq_order == ["4", "1", "0", "2", "3", "5"]


def test_a_repeated_job_id_writes_nothing():
    queue = transport.get_queue("default")
    with pytest.raises(ValueError, match="more than once"):
        job_hashes.push_batch(queue, [_message("same"), _message("same")], 600, 3600)
    assert queue.connection.exists("rq:job:same") == 0
    assert queue.count == 0


def test_a_batch_over_one_pipeline_runs_in_order(tenants, monkeypatch):
    """Messages beyond one pipeline's worth are pushed in several, in order, all run."""
    from kumiko_jobs.transport import pushing

    monkeypatch.setattr(pushing, "_PIPELINE_MESSAGES", 3)
    handles = jobs.probe.enqueue_many([{"tag": f"p{i}"} for i in range(8)], tenant="t1")
    ids = transport.waiting_job_ids("default")
    assert [i.split("-")[1] for i in ids] == [h.run_id for h in handles]
    work()
    assert sorted(p.tag for p in probes("t1")) == sorted(f"p{i}" for i in range(8))


def test_slices_sent_back_to_back_land_in_order_even_after_a_script_flush():
    """push_slices sends its script calls back to back and reads the replies at the end; a
    script Redis lost (SCRIPT FLUSH, a restart) is loaded and its calls run again, in order."""
    queue = transport.get_queue("default")
    redis = queue.connection
    for round_, flush in enumerate((True, False)):
        if flush:
            redis.script_flush()
        names = [f"s{round_}x{i}" for i in range(7)]
        job_hashes.push_slices(queue, [_message(n) for n in names], 600, 3600, 2)
        assert [i.decode() for i in redis.lrange(queue.key, 0, -1)] == names
        assert all(queue.fetch_job(n) is not None for n in names)
        redis.delete(queue.key)
