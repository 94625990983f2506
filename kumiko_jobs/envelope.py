"""The queue message: a versioned JSON document, signed with the project's SECRET_KEY.

RQ stores the signed string as the only argument of the runner. Nothing in it is trusted
before the signature is checked: a forged or damaged message raises ``EnvelopeError`` and never
reaches a tenant. Key rotation works through Django's ``SECRET_KEY_FALLBACKS``.
"""

from __future__ import annotations

import json
import re
import secrets
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from django.core import signing

from . import conf
from .exceptions import EnvelopeError

VERSION = 1
_SALT = "kumiko_jobs.envelope.v1"
_RUN_ID_RE = re.compile(r"^[0-9a-f]{32}$")
_SCHEMA_RE = re.compile(r"^[a-z_][a-z0-9_-]{0,62}$")
_FIELD_TYPES: dict[str, type | tuple[type, ...]] = {
    "v": int,
    "job": str,
    "schema": (str, type(None)),
    "kwargs": dict,
    "run_id": str,
    "attempt": int,
    "defers": int,
    "gate_defers": int,
    "correlation_id": str,
    "triggered_by": (str, type(None)),
    "trigger": (str, type(None)),
    "trace": dict,
    "origin": (dict, type(None)),
    "parent_run_id": (str, type(None)),
}
# The write origin the guard reads (origin.request_origin()); any other shape is forged.
_ORIGIN_TYPES: dict[str, type] = {"anonymous": bool, "path": str, "public_intake": bool}


@dataclass(frozen=True, slots=True)
class Envelope:
    job: str
    schema: str | None
    kwargs: dict[str, Any]
    run_id: str
    attempt: int = 1
    defers: int = 0
    gate_defers: int = 0
    correlation_id: str = ""
    triggered_by: str | None = None
    trigger: str | None = None
    trace: dict[str, str] = field(default_factory=dict)
    origin: dict[str, Any] | None = None
    parent_run_id: str | None = None

    def next_attempt(self) -> Envelope:
        return replace(self, attempt=self.attempt + 1)

    def deferred(self, *, by_gate: bool) -> Envelope:
        if by_gate:
            return replace(self, gate_defers=self.gate_defers + 1)
        return replace(self, defers=self.defers + 1)

    @property
    def trace_id(self) -> str:
        """The W3C trace id of the carried context (``00-<trace id>-<span id>-<flags>``), or ""."""
        return self.trace.get("traceparent", "")[3:35]

    @property
    def rq_job_id(self) -> str:
        """One RQ job per attempt and deferral; a repeated push of the same message is a no-op."""
        return f"kj-{self.run_id}-a{self.attempt}-d{self.defers}-g{self.gate_defers}"


_last_ms = 0
_sequence = 0
_id_lock = threading.Lock()


def new_run_id() -> str:
    """A time-ordered UUID (version 7 layout), as 32 hex digits.

    RQ's RateLimit admits waiting jobs oldest second first and breaks ties by job id; ids that
    sort by creation (a per-process sequence within a millisecond) keep waiting runs FIFO. They
    also keep the history table's primary-key index append-mostly.
    """
    global _last_ms, _sequence
    with _id_lock:
        ms = time.time_ns() // 1_000_000
        if ms <= _last_ms:
            ms, _sequence = _last_ms, _sequence + 1
            if _sequence > 0xFFF:
                ms, _sequence = ms + 1, 0
        else:
            _sequence = 0
        _last_ms = ms
        value = (ms & (2**48 - 1)) << 80 | 0x7 << 76 | _sequence << 64
        value |= 0b10 << 62 | secrets.randbits(62)
    return f"{value:032x}"


def _signer() -> signing.Signer:
    return signing.Signer(salt=_SALT, algorithm="sha256")


def encode(envelope: Envelope) -> str:
    document = {"v": VERSION, **asdict(envelope)}
    payload = json.dumps(document, separators=(",", ":"), sort_keys=True, allow_nan=False)
    return _signer().sign(payload)


def _has_nul(value: object) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_nul(v) for v in value)
    return False


# The history columns these fields land in (models.JobRun).
_MAX_LENGTHS = {"job": 200, "correlation_id": 64, "triggered_by": 64, "trigger": 200}


def decode(message: object) -> Envelope:
    """Check signature, size, version and shape; raise ``EnvelopeError`` on any doubt."""
    if not isinstance(message, str):
        raise EnvelopeError(f"message is a {type(message).__name__}, not a signed envelope string")
    limit = conf.get().MAX_ENVELOPE_BYTES
    if len(message) > limit:  # cheap first: a character is at least one byte
        raise EnvelopeError(f"message is {len(message)}+ bytes, over the {limit}-byte limit")
    try:
        size = len(message.encode("utf-8"))
    except UnicodeEncodeError:  # a lone surrogate, which JSON can carry
        raise EnvelopeError("message is not valid Unicode text") from None
    if size > limit:
        raise EnvelopeError(f"message is {size} bytes, over the {limit}-byte limit")
    try:
        payload = _signer().unsign(message)
    except signing.BadSignature:
        raise EnvelopeError("bad signature: the message was not signed by this project") from None
    try:
        document = json.loads(payload)
    except (ValueError, RecursionError):
        raise EnvelopeError("signed payload is not JSON (or nested too deeply)") from None
    if not isinstance(document, dict):
        raise EnvelopeError("envelope is not a JSON object")
    if document.get("v") != VERSION:
        raise EnvelopeError(
            f"unknown envelope version {document.get('v')!r} (this worker reads {VERSION})"
        )
    if set(document) != set(_FIELD_TYPES):
        raise EnvelopeError(f"envelope fields {sorted(document)} do not match version {VERSION}")
    for key, expected in _FIELD_TYPES.items():
        value = document[key]
        if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
            raise EnvelopeError(f"envelope field {key!r} has the wrong type")
    if not _RUN_ID_RE.fullmatch(document["run_id"]):
        raise EnvelopeError("envelope run_id is not a UUID hex")
    schema = document["schema"]
    if schema is not None and not _SCHEMA_RE.fullmatch(schema):
        raise EnvelopeError("envelope schema is not a valid schema name")
    if schema == conf.public_schema_name():
        raise EnvelopeError("envelope names the public schema; tenant runs never run there")
    if min(document["attempt"] - 1, document["defers"], document["gate_defers"]) < 0:
        raise EnvelopeError("envelope counters are negative")
    origin = document["origin"]
    if origin is not None and (
        set(origin) != set(_ORIGIN_TYPES)
        or not all(type(origin[k]) is t for k, t in _ORIGIN_TYPES.items())
    ):
        raise EnvelopeError("envelope write origin has the wrong shape")
    for key, longest in _MAX_LENGTHS.items():
        if len(document[key] or "") > longest:
            raise EnvelopeError(f"envelope field {key!r} is longer than {longest} characters")
    if "\\u0000" in payload and _has_nul(document):
        # PostgreSQL text and jsonb cannot hold NUL; such a run could not be recorded.
        raise EnvelopeError("envelope contains a NUL character")
    del document["v"]
    return Envelope(**document)
