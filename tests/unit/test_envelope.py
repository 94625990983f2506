"""Unit tests for the signed, versioned envelope: settings only, no database, no Redis."""

from __future__ import annotations

import json
import re
import time
import uuid
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

import pytest
from django.core import signing
from django.test import override_settings

from kumiko_jobs import EnvelopeError
from kumiko_jobs.core.envelope import (
    TEMPLATE_RUN_ID,
    VERSION,
    Envelope,
    child_run_id,
    decode,
    encode,
    expires_at,
    rq_job_id_of,
    run_id_of,
    tick_run_id,
)

SALT = "kumiko_jobs.envelope.v2"
V1_SALT = "kumiko_jobs.envelope.v1"
MAX_AGE = 7 * 24 * 3600  # the MESSAGE_MAX_AGE default
NOW = 1_800_000_000.0  # a fixed clock: 2027-01-15
RUN_ID = "0123456789abcdef0123456789abcdef"
RQ_JOB_ID_RE = re.compile(r"[A-Za-z0-9_-]+")


def envelope(**changes: Any) -> Envelope:
    values: dict[str, Any] = {
        "job": "testapp.probe",
        "schema": "t1",
        "kwargs": {"tag": "x", "payload": {"n": [1, 2.5, None, True, "ü"]}},
        "run_id": RUN_ID,
        "attempt": 2,
        "defers": 1,
        "gate_defers": 3,
        "correlation_id": "corr-1",
        "triggered_by": "42",
        "trigger": "cron",
        "trace": {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"},
        "origin": {"anonymous": True, "path": "/form/", "public_intake": False},
        "parent_run_id": "fedcba9876543210fedcba9876543210",
    }
    values.update(changes)
    return Envelope(**values)


def document(**changes: Any) -> dict[str, Any]:
    """The JSON document ``encode`` signs, with changes (``None`` values are kept)."""
    doc = {"v": VERSION, **asdict(envelope())}
    del doc["version"]
    del doc["flow_schema"]  # written only when set (a system run a tenant's run started)
    now = round(time.time(), 3)
    doc.update(signed_at=now, due_at=now)
    doc.update(changes)
    return doc


def v1_document(**changes: Any) -> dict[str, Any]:
    """A document as version 1 built it (no times, no tick), before this deploy."""
    doc = document(v=1)
    for key in ("tick", "signed_at", "due_at"):
        del doc[key]
    doc.update(changes)
    return doc


def sign(doc: object, *, salt: str = SALT, key: str | None = None) -> str:
    """Forge a message with the project's own key: the signature is right, the shape is not."""
    payload = doc if isinstance(doc, str) else json.dumps(doc)
    return signing.Signer(key=key, salt=salt, algorithm="sha256").sign(payload)


def split(message: str) -> tuple[str, str]:
    payload, _, signature = message.rpartition(":")
    return payload, signature


# --- the allowed path -------------------------------------------------------------------------


def test_round_trip_keeps_every_field():
    original = envelope()
    message = encode(original)
    assert isinstance(message, str)
    assert decode(message) == original


def test_round_trip_of_a_system_run_and_defaults():
    original = Envelope(job="testapp.system_tick", schema=None, kwargs={}, run_id=RUN_ID)
    back = decode(encode(original))
    assert back == original
    assert (back.attempt, back.defers, back.gate_defers, back.origin) == (1, 0, 0, None)


def test_the_signed_payload_is_plain_json_with_the_version():
    payload, _ = split(encode(envelope()))
    doc = json.loads(payload)
    assert doc["v"] == VERSION
    assert set(doc) == set(document())


def test_a_forged_but_correctly_shaped_message_signed_with_the_key_decodes():
    # The control for the tests below: what they change, and only that, is what fails.
    assert decode(sign(document())) == envelope()


# --- signature --------------------------------------------------------------------------------


def test_flipping_one_character_of_the_payload_is_refused():
    message = encode(envelope(schema="t1"))
    payload, signature = split(message)
    tampered = payload.replace('"schema":"t1"', '"schema":"t2"')
    assert tampered != payload
    with pytest.raises(EnvelopeError, match="bad signature"):
        decode(f"{tampered}:{signature}")


def test_flipping_one_character_of_the_signature_is_refused():
    message = encode(envelope())
    payload, signature = split(message)
    flipped = signature[:-1] + ("A" if signature[-1] != "A" else "B")
    with pytest.raises(EnvelopeError, match="bad signature"):
        decode(f"{payload}:{flipped}")


def test_payloads_swapped_between_two_signed_messages_are_refused():
    first = split(encode(envelope(schema="t1")))
    second = split(encode(envelope(schema="t2")))
    assert decode(f"{first[0]}:{first[1]}").schema == "t1"
    for payload, signature in ((first[0], second[1]), (second[0], first[1])):
        with pytest.raises(EnvelopeError, match="bad signature"):
            decode(f"{payload}:{signature}")


@pytest.mark.parametrize(
    "message",
    [
        json.dumps(document()),  # unsigned JSON
        json.dumps(document()) + ":",  # empty signature
        "",
        ":",
        "no-separator-at-all",
    ],
)
def test_unsigned_messages_are_refused(message):
    with pytest.raises(EnvelopeError, match="bad signature"):
        decode(message)


def test_a_different_salt_is_refused():
    with pytest.raises(EnvelopeError, match="bad signature"):
        decode(sign(document(), salt="kumiko_jobs.envelope.v3"))


def test_a_different_key_is_refused():
    with pytest.raises(EnvelopeError, match="bad signature"):
        decode(sign(document(), key="someone-elses-secret-key"))


def test_another_signing_algorithm_is_refused():
    forged = signing.Signer(salt=SALT, algorithm="sha1").sign(json.dumps(document()))
    with pytest.raises(EnvelopeError, match="bad signature"):
        decode(forged)


def test_secret_key_rotation_keeps_queued_messages_valid_until_the_fallback_goes():
    with override_settings(SECRET_KEY="old-key-" + "o" * 50, SECRET_KEY_FALLBACKS=[]):
        queued = encode(envelope())
    with override_settings(SECRET_KEY="new-key-" + "n" * 50, SECRET_KEY_FALLBACKS=[]):
        with pytest.raises(EnvelopeError, match="bad signature"):
            decode(queued)
        signed_at = time.time()  # one signing time for both: it is part of the signed text
        fresh = encode(envelope(), now=signed_at)
    with override_settings(
        SECRET_KEY="new-key-" + "n" * 50, SECRET_KEY_FALLBACKS=["old-key-" + "o" * 50]
    ):
        assert decode(queued) == envelope()
        assert decode(fresh) == envelope()
        # New messages are signed with the current key, not the fallback.
        assert encode(envelope(), now=signed_at) == fresh
    with override_settings(SECRET_KEY="new-key-" + "n" * 50, SECRET_KEY_FALLBACKS=[]):
        assert decode(fresh) == envelope()
        with pytest.raises(EnvelopeError, match="bad signature"):
            decode(queued)


# --- version and shape ------------------------------------------------------------------------


@pytest.mark.parametrize("version", [0, 3, 99, "2", 2.0, None, True, [2]])
def test_unknown_versions_are_refused(version):
    # 2.0 compares equal to 2 and True to 1: they are refused by the type check instead.
    with pytest.raises(EnvelopeError, match=r"unknown envelope version|field 'v' has the wrong"):
        decode(sign(document(v=version)))


def test_missing_version_is_refused():
    doc = document()
    del doc["v"]
    with pytest.raises(EnvelopeError, match="unknown envelope version"):
        decode(sign(doc))


@pytest.mark.parametrize("missing", sorted(set(document()) - {"v"}))
def test_each_missing_field_is_refused(missing):
    doc = document()
    del doc[missing]
    with pytest.raises(EnvelopeError, match="do not match version"):
        decode(sign(doc))


@pytest.mark.parametrize("extra", ["func", "instance", "Job", "schema_name", "__class__"])
def test_extra_fields_are_refused(extra):
    with pytest.raises(EnvelopeError, match="do not match version"):
        decode(sign(document(**{extra: "os.system"})))


@pytest.mark.parametrize(
    "payload",
    ["[1, 2, 3]", '"a string"', "42", "null", "true", "not json at all", "{", ""],
)
def test_signed_payloads_that_are_not_a_json_object_are_refused(payload):
    with pytest.raises(EnvelopeError, match=r"not JSON|not a JSON object"):
        decode(sign(payload))


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("attempt", True),  # bool is an int in Python; not here
        ("defers", False),
        ("gate_defers", True),
        ("attempt", 1.0),
        ("attempt", "1"),
        ("attempt", None),
        ("defers", [0]),
        ("job", 5),
        ("job", None),
        ("job", ["testapp.probe"]),
        ("schema", 1),
        ("schema", ["t1"]),
        ("schema", {"name": "t1"}),
        ("kwargs", []),
        ("kwargs", "tag=x"),
        ("kwargs", None),
        ("run_id", None),
        ("run_id", int(RUN_ID, 16)),
        ("correlation_id", None),
        ("correlation_id", 7),
        ("triggered_by", 42),
        ("trigger", True),
        ("trace", None),
        ("trace", []),
        ("origin", "anonymous"),
        ("origin", []),
        ("origin", True),
        ("parent_run_id", 1),
    ],
)
def test_wrong_types_are_refused(field, value):
    with pytest.raises(EnvelopeError, match=f"field '{field}' has the wrong type"):
        decode(sign(document(**{field: value})))


@pytest.mark.parametrize(
    "run_id",
    [
        "",
        "0123456789ABCDEF0123456789ABCDEF",  # upper case
        str(uuid.UUID(RUN_ID)),  # dashed form
        RUN_ID[:-1],
        RUN_ID + "0",
        RUN_ID[:-1] + "g",
        RUN_ID + "\n",  # a trailing newline must not slip through a "$" anchor
        "\n" + RUN_ID,
        RUN_ID[:16] + ":" + RUN_ID[17:],
        "../../" + RUN_ID[6:],
    ],
)
def test_bad_run_ids_are_refused(run_id):
    with pytest.raises(EnvelopeError, match="run_id"):
        decode(sign(document(run_id=run_id)))


def test_public_schema_is_refused():
    with pytest.raises(EnvelopeError, match="public schema"):
        decode(sign(document(schema="public")))


@override_settings(PUBLIC_SCHEMA_NAME="shared")
def test_the_configured_public_schema_is_refused():
    with pytest.raises(EnvelopeError, match="public schema"):
        decode(sign(document(schema="shared")))
    assert decode(sign(document(schema="public"))).schema == "public"


@pytest.mark.parametrize(
    "schema",
    [
        "",
        "T1",
        "1tenant",
        "-t1",
        't1"; DROP SCHEMA public; --',
        "t1,public",
        "t1 public",
        'a"b',
        "t1.public",
        "t1\n",  # trailing newline
        "t1\x00",
        "x" * 64,  # PostgreSQL names are at most 63 bytes
        "tenant_ü",
    ],
)
def test_bad_schema_names_are_refused(schema):
    with pytest.raises(EnvelopeError, match="schema"):
        decode(sign(document(schema=schema)))


@pytest.mark.parametrize("schema", ["t1", "_x", "a" * 63, "tenant-7", "t_2"])
def test_good_schema_names_are_accepted(schema):
    assert decode(sign(document(schema=schema))).schema == schema


@pytest.mark.parametrize(
    ("field", "value"),
    [("attempt", 0), ("attempt", -1), ("defers", -1), ("gate_defers", -5)],
)
def test_counters_below_their_minimum_are_refused(field, value):
    with pytest.raises(EnvelopeError, match="counters are negative"):
        decode(sign(document(**{field: value})))


@pytest.mark.parametrize(
    "origin",
    [
        {},
        {"anonymous": "false", "path": "/", "public_intake": False},  # a truthy string
        {"anonymous": 0, "path": "/", "public_intake": False},
        {"anonymous": True, "path": "/", "public_intake": "yes"},
        {"anonymous": True, "path": "/", "public_intake": 1},
        {"anonymous": True, "path": 5, "public_intake": False},
        {"anonymous": True, "path": "/"},
        {"anonymous": True, "path": "/", "public_intake": False, "grants": ["global_writes"]},
        {"anonymous": None, "path": None, "public_intake": None},
    ],
)
def test_write_origins_of_the_wrong_shape_are_refused(origin):
    with pytest.raises(EnvelopeError, match="origin"):
        decode(sign(document(origin=origin)))


@pytest.mark.parametrize(
    "origin",
    [
        None,
        {"anonymous": True, "path": "/contact/", "public_intake": True},
        {"anonymous": True, "path": "", "public_intake": False},
    ],
)
def test_write_origins_of_the_right_shape_are_accepted(origin):
    assert decode(sign(document(origin=origin))).origin == origin


def test_deeply_nested_signed_payload_is_refused_not_a_crash():
    payload = json.dumps(document(kwargs={"tag": "x"})).replace(
        '"tag": "x"', '"tag": ' + "[" * 100_000 + "1" + "]" * 100_000
    )
    assert len(payload) < 512 * 1024
    with pytest.raises(EnvelopeError, match="not JSON"):
        decode(sign(payload))


# --- what the message is ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "message",
    [
        None,
        b"",
        encode(envelope()).encode(),  # the right message as bytes: still refused
        {"job": "testapp.probe"},
        [encode(envelope())],
        42,
        1.5,
        True,
    ],
    ids=["None", "empty-bytes", "bytes", "dict", "list", "int", "float", "bool"],
)
def test_messages_that_are_not_a_string_are_refused(message):
    with pytest.raises(EnvelopeError, match=f"message is a {type(message).__name__},"):
        decode(message)


@pytest.mark.parametrize("message", ["\ud800", "\ud800:abc", encode(envelope()) + "\udfff"])
def test_strings_that_are_not_valid_unicode_are_refused(message):
    # JSON can carry a lone surrogate ("\\ud800"); RQ's JSON serializer hands it over as is.
    with pytest.raises(EnvelopeError):
        decode(message)


def test_nul_characters_are_refused():
    payload, signature = split(encode(envelope()))
    with pytest.raises(EnvelopeError, match="bad signature"):
        decode(f"{payload}\x00:{signature}")


@override_settings(KUMIKO_JOBS={"MAX_ENVELOPE_BYTES": 2000})
def test_size_limit():
    small = encode(envelope(kwargs={"tag": "x"}))
    assert decode(small).kwargs == {"tag": "x"}
    big = encode(envelope(kwargs={"tag": "x" * 2000}))
    with pytest.raises(EnvelopeError, match="over the 2000-byte limit"):
        decode(big)
    # Checked before the signature: a huge forged message costs no HMAC.
    with pytest.raises(EnvelopeError, match="over the 2000-byte limit"):
        decode("x" * 2001)


@override_settings(KUMIKO_JOBS={"MAX_ENVELOPE_BYTES": 2000})
def test_size_limit_counts_bytes_not_characters():
    # 700 characters of a 3-byte UTF-8 character: 2100 bytes of message.
    forged = sign(json.dumps(document(kwargs={"tag": "€" * 700}), ensure_ascii=False))
    assert len(forged) < 2000
    assert len(forged.encode()) > 2000
    with pytest.raises(EnvelopeError, match="2000-byte limit"):
        decode(forged)


def test_size_limit_default_is_half_a_megabyte():
    assert decode(encode(envelope(kwargs={"tag": "x" * 400_000}))).kwargs["tag"] == "x" * 400_000
    with pytest.raises(EnvelopeError, match="524288-byte limit"):
        decode(encode(envelope(kwargs={"tag": "x" * 600_000})))


# --- derived values ---------------------------------------------------------------------------


def test_rq_job_id_uses_only_characters_rq_allows():
    for env in (
        envelope(),
        envelope(attempt=1, defers=0, gate_defers=0),
        envelope(attempt=12, defers=345, gate_defers=6789),
        decode(sign(document(run_id="f" * 32))),
    ):
        assert RQ_JOB_ID_RE.fullmatch(env.rq_job_id), env.rq_job_id


def test_rq_job_id_differs_per_attempt_and_deferral():
    env = envelope(attempt=1, defers=0, gate_defers=0)
    ids = {
        env.rq_job_id,
        env.next_attempt().rq_job_id,
        env.deferred(by_gate=False).rq_job_id,
        env.deferred(by_gate=True).rq_job_id,
    }
    assert len(ids) == 4
    assert env.rq_job_id == envelope(attempt=1, defers=0, gate_defers=0).rq_job_id


def test_run_id_of_inverts_rq_job_id_of_and_refuses_other_ids():
    env = envelope(attempt=3, defers=2, gate_defers=1)
    assert env.rq_job_id == rq_job_id_of(RUN_ID, 3, 2, 1)
    assert run_id_of(env.rq_job_id) == RUN_ID
    for other in ("kj-cron-billing_nightly_run_of_the_month", "kj-" + RUN_ID, "rq-job", ""):
        assert run_id_of(other) is None, other


def test_child_is_the_parents_run_for_one_tenant():
    parent = envelope(schema=None, trigger="cron", tick="2026-01-31T03:00:00+00:00")
    child = parent.child("t1")
    assert child.schema == "t1" and child.parent_run_id == RUN_ID
    assert child.run_id == child_run_id(RUN_ID, "t1") == parent.child("t1").run_id
    assert child.run_id != parent.child("t2").run_id
    assert (child.kwargs, child.correlation_id, child.tick) == (
        parent.kwargs,
        parent.correlation_id,
        parent.tick,
    )
    assert child.attempt == 1 and envelope(trigger=None).child("t1").trigger == "fanout"


def test_followup_keeps_the_cause_and_names_its_parent():
    parent = envelope()
    followup = parent.followup("a.next", "t1", {"n": 1}, {"traceparent": "x"})
    assert followup.run_id != parent.run_id and followup.parent_run_id == parent.run_id
    assert followup.trigger == f"followup:{parent.job}"
    assert (followup.correlation_id, followup.triggered_by, followup.origin) == (
        parent.correlation_id,
        parent.triggered_by,
        parent.origin,
    )
    assert (followup.attempt, followup.defers, followup.trace) == (1, 0, {"traceparent": "x"})


def test_cron_template_and_tick():
    template = Envelope.cron_template("a.b")
    assert template.is_template and template.run_id == TEMPLATE_RUN_ID
    tick = datetime(2026, 1, 31, 3, 0, tzinfo=UTC)
    run = Envelope.cron_tick("a.b", tick)
    assert not run.is_template and run.run_id == tick_run_id("a.b", tick)
    assert run.tick == "2026-01-31T03:00:00+00:00" and run.trigger == "cron"
    assert decode(encode(run)) == run
    assert Envelope.boot("a.b").trigger == "boot"


def test_next_attempt_and_deferred_change_only_their_counter():
    env = envelope(attempt=1, defers=0, gate_defers=0)
    assert env.next_attempt() == envelope(attempt=2, defers=0, gate_defers=0)
    assert env.deferred(by_gate=False) == envelope(attempt=1, defers=1, gate_defers=0)
    assert env.deferred(by_gate=True) == envelope(attempt=1, defers=0, gate_defers=1)
    assert decode(encode(env.next_attempt().deferred(by_gate=True))).attempt == 2


@pytest.mark.parametrize(
    ("field", "value"),
    [("correlation_id", "c" * 65), ("triggered_by", "9" * 65), ("trigger", "t" * 201)],
)
def test_fields_longer_than_their_history_columns_are_refused(field, value):
    from dataclasses import replace

    from kumiko_jobs.core.envelope import Envelope, decode, encode

    env = replace(Envelope(job="a.b", schema="t1", kwargs={}, run_id="a" * 32), **{field: value})
    with pytest.raises(EnvelopeError, match=field):
        decode(encode(env))


def test_nul_characters_are_refused_but_a_literal_backslash_u_is_not():
    from kumiko_jobs.core.envelope import Envelope, decode, encode

    nul = Envelope(job="a.b", schema="t1", kwargs={"x": "a\x00b"}, run_id="a" * 32)
    with pytest.raises(EnvelopeError, match="NUL"):
        decode(encode(nul))
    text = Envelope(job="a.b", schema="t1", kwargs={"x": "\\u0000 is fine"}, run_id="a" * 32)
    assert decode(encode(text)).kwargs == {"x": "\\u0000 is fine"}


# --- signing time, due time and expiry (version 2) --------------------------------------------

DAY = 24 * 3600


def test_the_signature_carries_the_signing_and_the_due_time():
    message = encode(envelope(), delay=90.0, now=NOW)
    doc = json.loads(split(message)[0])
    assert (doc["signed_at"], doc["due_at"]) == (NOW, NOW + 90.0)
    decoded = decode(message, now=NOW)
    assert (decoded.signed_at, decoded.due_at, decoded.version) == (NOW, NOW + 90.0, VERSION)
    assert expires_at(decoded) == NOW + 90.0 + MAX_AGE


def test_a_message_is_accepted_up_to_max_age_after_its_due_time_and_refused_just_past_it():
    message = encode(envelope(), now=NOW)
    assert decode(message, now=NOW + MAX_AGE) == envelope()
    with pytest.raises(EnvelopeError, match=r"expired: run 0123.* MESSAGE_MAX_AGE=604800 s"):
        decode(message, now=NOW + MAX_AGE + 0.001)


def test_expiry_counts_from_the_due_time_not_the_signing_time():
    # enqueue_in(30 days): signed today, due in 30 days, long past MAX_AGE after its signing.
    message = encode(envelope(), delay=30 * DAY, now=NOW)
    assert decode(message, now=NOW + MAX_AGE + 1) == envelope()
    assert decode(message, now=NOW + 30 * DAY + MAX_AGE) == envelope()
    with pytest.raises(EnvelopeError, match="expired"):
        decode(message, now=NOW + 30 * DAY + MAX_AGE + 0.001)


def test_max_age_is_the_setting():
    message = encode(envelope(), now=NOW)
    with override_settings(KUMIKO_JOBS={"MESSAGE_MAX_AGE": 60}):
        assert decode(message, now=NOW + 60) == envelope()
        with pytest.raises(EnvelopeError, match="MESSAGE_MAX_AGE=60 s"):
            decode(message, now=NOW + 61)


def test_a_tampered_due_time_breaks_the_signature():
    message = encode(envelope(), now=NOW)
    payload, signature = split(message)
    later = payload.replace(f'"due_at":{NOW}', f'"due_at":{NOW + 365 * DAY}')
    assert later != payload
    with pytest.raises(EnvelopeError, match="bad signature"):
        decode(f"{later}:{signature}", now=NOW + MAX_AGE + 1)


def test_a_message_signed_again_with_its_own_payload_swapped_in_is_refused():
    # The times of a fresh message cannot be moved onto an old one's signature either.
    old = encode(envelope(), now=NOW)
    fresh = encode(envelope(), now=NOW + 10 * DAY)
    with pytest.raises(EnvelopeError, match="bad signature"):
        decode(f"{split(fresh)[0]}:{split(old)[1]}", now=NOW + 10 * DAY)


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"signed_at": 100.0, "due_at": 99.0}, "due before it was signed"),
        ({"signed_at": -1, "due_at": 5}, "due before it was signed"),
        ({"due_at": 2.0**41}, "not times"),
        ({"due_at": True}, "wrong type"),
        ({"signed_at": "1800000000"}, "wrong type"),
        ({"due_at": None}, "wrong type"),
        ({"tick": "2026-01-31 03:00"}, "tick is not a UTC time"),
        ({"tick": "2026-01-31T03:00:00+01:00"}, "tick is not a UTC time"),
        ({"tick": 1800000000}, "wrong type"),
    ],
)
def test_signed_times_and_ticks_of_the_wrong_shape_are_refused(changes, reason):
    with pytest.raises(EnvelopeError, match=reason):
        decode(sign(document(**changes)), now=100.0)


def test_a_signed_nan_due_time_is_refused():
    doc = json.dumps(document(due_at=0.0)).replace('"due_at": 0.0', '"due_at": NaN')
    assert "NaN" in doc
    with pytest.raises(EnvelopeError, match="not times"):
        decode(sign(doc))


def test_a_cron_tick_round_trips():
    tick = envelope(tick="2026-01-31T03:00:00+00:00")
    assert decode(encode(tick)).tick == "2026-01-31T03:00:00+00:00"


# --- the previous version, queued before the deploy -------------------------------------------


def test_a_message_built_the_version_1_way_still_decodes_with_version_1_rules():
    # Built exactly as the previous encode did: no times, no tick, the v1 salt.
    old = sign(v1_document(), salt=V1_SALT)
    decoded = decode(old, now=NOW + 10 * 365 * DAY)  # version 1 never expires
    assert decoded == envelope()
    assert decoded.version == 1 and decoded.tick is None
    assert expires_at(decoded) is None


def test_version_1_messages_keep_version_1_shape_rules():
    with pytest.raises(EnvelopeError, match="do not match version 1"):
        decode(sign(v1_document(due_at=NOW), salt=V1_SALT))
    with pytest.raises(EnvelopeError, match="do not match version 1"):
        decode(sign({k: v for k, v in v1_document().items() if k != "kwargs"}, salt=V1_SALT))


@pytest.mark.parametrize(
    ("doc", "salt"),
    [(v1_document(), SALT), (document(), V1_SALT), (v1_document(v=2), V1_SALT)],
    ids=["v1-document-v2-salt", "v2-document-v1-salt", "v1-shape-claiming-v2"],
)
def test_a_version_is_read_only_under_its_own_salt(doc, salt):
    with pytest.raises(EnvelopeError, match=r"says version .* but was signed as version"):
        decode(sign(doc, salt=salt))


def test_new_messages_are_version_2():
    assert json.loads(split(encode(envelope()))[0])["v"] == 2 == VERSION
