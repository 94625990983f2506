"""Unit tests for the signed, versioned envelope: settings only, no database, no Redis."""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import asdict
from typing import Any

import pytest
from django.core import signing
from django.test import override_settings

from kumiko_jobs import EnvelopeError
from kumiko_jobs.envelope import VERSION, Envelope, decode, encode

SALT = "kumiko_jobs.envelope.v1"
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
        decode(sign(document(), salt="kumiko_jobs.envelope.v2"))


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
        fresh = encode(envelope())
    with override_settings(
        SECRET_KEY="new-key-" + "n" * 50, SECRET_KEY_FALLBACKS=["old-key-" + "o" * 50]
    ):
        assert decode(queued) == envelope()
        assert decode(fresh) == envelope()
        # New messages are signed with the current key, not the fallback.
        assert encode(envelope()) == fresh
    with override_settings(SECRET_KEY="new-key-" + "n" * 50, SECRET_KEY_FALLBACKS=[]):
        assert decode(fresh) == envelope()
        with pytest.raises(EnvelopeError, match="bad signature"):
            decode(queued)


# --- version and shape ------------------------------------------------------------------------


@pytest.mark.parametrize("version", [0, 2, 99, "1", 1.0, None, True, [1]])
def test_unknown_versions_are_refused(version):
    # 1.0 and True compare equal to 1: they are refused by the type check instead.
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

    from kumiko_jobs.envelope import Envelope, decode, encode

    env = replace(Envelope(job="a.b", schema="t1", kwargs={}, run_id="a" * 32), **{field: value})
    with pytest.raises(EnvelopeError, match=field):
        decode(encode(env))


def test_nul_characters_are_refused_but_a_literal_backslash_u_is_not():
    from kumiko_jobs.envelope import Envelope, decode, encode

    nul = Envelope(job="a.b", schema="t1", kwargs={"x": "a\x00b"}, run_id="a" * 32)
    with pytest.raises(EnvelopeError, match="NUL"):
        decode(encode(nul))
    text = Envelope(job="a.b", schema="t1", kwargs={"x": "\\u0000 is fine"}, run_id="a" * 32)
    assert decode(encode(text)).kwargs == {"x": "\\u0000 is fine"}
