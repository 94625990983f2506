"""The queue message: a versioned JSON document, signed with the project's SECRET_KEY.

RQ stores the signed string as the only argument of the runner. Nothing in it is trusted
before the signature is checked: a forged or damaged message raises ``EnvelopeError`` and never
reaches a tenant. Key rotation works through Django's ``SECRET_KEY_FALLBACKS``.

Version 2 signs when the message was signed (``signed_at``) and when it is due (``due_at``, the
signing time plus the push delay), and a cron tick's scheduled time (``tick``). A message
*expires* ``MESSAGE_MAX_AGE`` seconds after its due time: counted from the due time, not the
signing time, so ``enqueue_in(30 days)`` and a backlog after an outage are not lost, while a copy
of an old message cannot be replayed for ever. A run still waiting for an expired message is not
lost either: the worker refuses the message, and the relay signs its run's message anew.

Version 1 messages (no times, no tick) still decode, with version 1's rules (they never expire),
so messages queued before a deploy still run; see docs/reliability.md for the transition.

This module also owns the identities derived from an envelope, so that no caller rebuilds them:
the RQ job id of a message (``rq_job_id_of``) and its inverse (``run_id_of``), a fan-out
child's run id, a cron tick's run id, the cron template's zero run id, and the constructors of
the envelopes one run makes from another (``child``, ``followup``, ``next_attempt``,
``deferred``) or that no enqueue makes (``cron_template``, ``cron_tick``, ``boot``). Turning an
envelope into a history row or a queue message, and back, is ``enqueueing.messages``'s.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from dataclasses import dataclass, field, fields, replace
from datetime import UTC, datetime
from typing import Any

from django.core import signing

from . import conf, project_settings
from .exceptions import EnvelopeError
from .run_ids import new_run_id as new_run_id  # (re-exported: callers import it from here)
from .signer import signer_for

VERSION = 2
PREVIOUS_VERSION = 1
# One salt per version: a document is read with the rules of the version whose key signed it.
_SALTS = {2: "kumiko_jobs.envelope.v2", 1: "kumiko_jobs.envelope.v1"}
_RUN_ID_RE = re.compile(r"^[0-9a-f]{32}$")
_SCHEMA_RE = re.compile(r"^[a-z_][a-z0-9_-]{0,62}$")
_V1_FIELD_TYPES: dict[str, type | tuple[type, ...]] = {
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
_FIELD_TYPES: dict[str, type | tuple[type, ...]] = {
    **_V1_FIELD_TYPES,
    "tick": (str, type(None)),
    "signed_at": (int, float),
    "due_at": (int, float),
}
_FIELDS_OF = {2: _FIELD_TYPES, 1: _V1_FIELD_TYPES}
# Fields of version 2 written only when set (not None): a message without one is the same text
# as before they existed, which a worker of the previous release still reads.
_OPTIONAL_FIELDS: dict[str, type] = {"flow_schema": str}
_TICK_RE = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\+00:00$")
# The write origin the guard reads (origin.request_origin()); any other shape is forged.
_ORIGIN_TYPES: dict[str, type] = {"anonymous": bool, "path": str, "public_intake": bool}
# An RQ job id of kumiko's: kj-<run id>-a<attempt>-d<defers>-g<gate defers> (rq_job_id_of).
_RQ_JOB_ID_RE = re.compile(r"^kj-([0-9a-f]{32})-a\d+-d\d+-g\d+$")
# The run id of the cron template, which no worker runs (see enqueueing.schedules).
TEMPLATE_RUN_ID = "0" * 32
_TICK_NAMESPACE = uuid.UUID("6f1c2b9e-3a57-4d0e-9a61-1c9f0b7f4e21")


def rq_job_id_of(run_id: str, attempt: int, defers: int, gate_defers: int) -> str:
    """The RQ job id of a run's message: one per attempt and deferral, so a repeated push of
    the same message is a no-op, and the relay can name the message a waiting run waits for
    without building it."""
    return f"kj-{run_id}-a{attempt}-d{defers}-g{gate_defers}"


def run_id_of(rq_job_id: str) -> str | None:
    """The run id (hex) an RQ job id of kumiko names; None for any other id (a cron alarm's
    ``kj-cron-...``, a foreign job's)."""
    match = _RQ_JOB_ID_RE.fullmatch(rq_job_id)
    return match.group(1) if match else None


def child_run_id(parent_run_id: str, schema: str) -> str:
    """A fan-out child's run id, derived from its parent's and its tenant's schema: a retried
    or redelivered fan-out makes the same ids, so it inserts no duplicate rows."""
    return uuid.uuid5(uuid.UUID(parent_run_id), schema).hex


def tick_run_id(job_name: str, tick: datetime) -> str:
    """The run id of a tick: derived from the job and the tick's scheduled *second*.

    A 5-field crontab ticks at second 0, so its ids are the ones the per-minute scheme gave
    (``job@YYYY-MM-DDTHH:MM:00+00:00``): a deploy does not re-run a tick fired before it.
    """
    second = tick.astimezone(UTC).replace(microsecond=0).isoformat()
    return uuid.uuid5(_TICK_NAMESPACE, f"{job_name}@{second}").hex


@dataclass(frozen=True, slots=True)
class Envelope:
    """What a queue message says: which job, for which tenant, with which arguments, for which
    run and attempt, and why (correlation, actor, trigger, trace, write origin, parent)."""

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
    # A cron tick's scheduled time (UTC, ISO 8601): with the job (and the schema of a fan-out
    # child) the tick's identity, from which its run id is derived (tick_run_id).
    tick: str | None = None
    # A system run that a tenant's run started (directly, or through other system runs): that
    # tenant's schema, whose flow control the run counts against (``flow_tenant``); else None.
    flow_schema: str | None = None
    # Set by ``encode`` (what a caller passes is ignored) and read back by ``decode``; not part
    # of what a message *means*, so two signings of one message compare equal.
    signed_at: float = field(default=0.0, compare=False)
    due_at: float = field(default=0.0, compare=False)
    version: int = field(default=VERSION, compare=False)

    @classmethod
    def cron_template(cls, job: str) -> Envelope:
        """The message of a cron job's alarm: a template no worker runs (``is_template``); the
        scheduler turns each ring into a tick (``cron_tick``)."""
        return cls(job=job, schema=None, kwargs={}, run_id=TEMPLATE_RUN_ID, trigger="cron")

    @classmethod
    def cron_tick(cls, job: str, tick: datetime) -> Envelope:
        """The run of a cron job's tick: its id derived from (job, tick), so a second firing of
        the same tick names the same run."""
        return cls(
            job=job,
            schema=None,
            kwargs={},
            run_id=tick_run_id(job, tick),
            trigger="cron",
            tick=tick.isoformat(),
        )

    @classmethod
    def boot(cls, job: str) -> Envelope:
        """A boot gate's run: run inline by a starting worker, for no tenant, never queued."""
        return cls(job=job, schema=None, kwargs={}, run_id=new_run_id(), trigger="boot")

    def child(self, schema: str) -> Envelope:
        """The fan-out child of this run for one tenant: the same job, arguments and cause, a
        run id derived from this one's (``child_run_id``), and this run's tick, so that (job,
        tick, tenant) is the signed identity of a cron tick's child."""
        return Envelope(
            job=self.job,
            schema=schema,
            kwargs=self.kwargs,
            run_id=child_run_id(self.run_id, schema),
            correlation_id=self.correlation_id,
            triggered_by=self.triggered_by,
            trigger=self.trigger or "fanout",
            trace=self.trace,
            origin=self.origin,
            parent_run_id=self.run_id,
            tick=self.tick,
        )

    def followup(
        self, job: str, schema: str | None, kwargs: dict[str, Any], trace: dict[str, str]
    ) -> Envelope:
        """A run this run enqueues (``ctx.enqueue``): a new run with this run's correlation,
        actor and write origin, and this run as its parent. ``trace``: the follow-up's producer
        context (or this run's)."""
        return Envelope(
            job=job,
            schema=schema,
            kwargs=kwargs,
            run_id=new_run_id(),
            correlation_id=self.correlation_id,
            triggered_by=self.triggered_by,
            trigger=f"followup:{self.job}",
            trace=trace,
            origin=self.origin,
            parent_run_id=self.run_id,
            # A system follow-up counts against the tenant this run counts against.
            flow_schema=self.flow_tenant if schema is None else None,
        )

    def next_attempt(self) -> Envelope:
        """The message of the retry after this attempt."""
        return replace(self, attempt=self.attempt + 1)

    def deferred(self, *, by_gate: bool) -> Envelope:
        """The message of this run deferred once more: by a gate (an inactive tenant), which
        has no cap, or by the job (``ctx.defer``), which counts against ``max_defers``."""
        if by_gate:
            return replace(self, gate_defers=self.gate_defers + 1)
        return replace(self, defers=self.defers + 1)

    @property
    def is_template(self) -> bool:
        """A cron alarm's template (``cron_template``), not a run."""
        return self.trigger == "cron" and self.run_id == TEMPLATE_RUN_ID

    @property
    def flow_tenant(self) -> str | None:
        """The tenant whose flow control this run counts against in the fair dequeue (its
        bucket, weight, pause, ``TENANT_CONCURRENCY``, ``TENANT_RATE_LIMIT``): its own, or,
        for a system run a tenant's run started, that tenant (``flow_schema``); None for
        other system runs."""
        return self.schema if self.schema is not None else self.flow_schema

    @property
    def trace_id(self) -> str:
        """The W3C trace id of the carried context (``00-<trace id>-<span id>-<flags>``), or ""."""
        return self.trace.get("traceparent", "")[3:35]

    @property
    def rq_job_id(self) -> str:
        """One RQ job per attempt and deferral; a repeated push of the same message is a no-op."""
        return rq_job_id_of(self.run_id, self.attempt, self.defers, self.gate_defers)


def _signer(version: int = VERSION) -> signing.Signer:
    return signer_for(_SALTS[version])  # made once per secret (signer.py)


# A signing time whose JSON is as long as any before 2100 (10 digits, 3 decimals). Times are
# floats, and ``json.dumps`` drops trailing zeros, so the same envelope signed a moment later can
# be a few bytes longer: size limits are measured with this, never with the clock.
WIDEST_SIGNING_TIME = 4102444799.999


_FIELD_NAMES = tuple(f.name for f in fields(Envelope) if f.name != "version")


def encode(envelope: Envelope, *, delay: float = 0.0, now: float | None = None) -> str:
    """Sign ``envelope`` as of ``now`` (default: the clock), due ``delay`` seconds later."""
    signed_at = round(time.time() if now is None else now, 3)
    # A shallow dict, not ``asdict``'s deep copy: the values are JSON already (the kwargs were
    # checked at enqueue), so the text is the same, without copying every nested value.
    document = {name: getattr(envelope, name) for name in _FIELD_NAMES}
    for name in _OPTIONAL_FIELDS:
        if document[name] is None:
            del document[name]
    document.update(
        {
            "v": VERSION,
            "signed_at": signed_at,
            "due_at": round(signed_at + max(delay, 0.0), 3),
        }
    )
    payload = json.dumps(document, separators=(",", ":"), sort_keys=True, allow_nan=False)
    return _signer().sign(payload)


def expires_at(envelope: Envelope) -> float | None:
    """When a decoded message stops being accepted (epoch seconds); None: never (version 1)."""
    if envelope.version < 2:
        return None
    return envelope.due_at + conf.get().MESSAGE_MAX_AGE


def _unsign(message: str) -> tuple[str, int]:
    """The payload and the version whose salt signed it."""
    try:
        return _signer(VERSION).unsign(message), VERSION
    except signing.BadSignature:
        pass
    try:
        # Only a refused (or a version 1) message pays for this second check.
        return _signer(PREVIOUS_VERSION).unsign(message), PREVIOUS_VERSION
    except signing.BadSignature:
        raise EnvelopeError("bad signature: the message was not signed by this project") from None


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


def decode(message: object, *, now: float | None = None) -> Envelope:
    """Check signature, size, version, shape and age; raise ``EnvelopeError`` on any doubt."""
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
    payload, version = _unsign(message)
    try:
        document = json.loads(payload)
    except (ValueError, RecursionError):
        raise EnvelopeError("signed payload is not JSON (or nested too deeply)") from None
    if not isinstance(document, dict):
        raise EnvelopeError("envelope is not a JSON object")
    claimed = document.get("v")
    if type(claimed) is not int or claimed not in _SALTS:
        raise EnvelopeError(
            f"unknown envelope version {claimed!r} (this worker reads {VERSION} and "
            f"{PREVIOUS_VERSION})"
        )
    if claimed != version:
        raise EnvelopeError(f"envelope says version {claimed} but was signed as version {version}")
    field_types = _FIELDS_OF[version]
    if version >= 2:
        field_types = field_types | {k: t for k, t in _OPTIONAL_FIELDS.items() if k in document}
    if set(document) != set(field_types):
        raise EnvelopeError(f"envelope fields {sorted(document)} do not match version {version}")
    for key, expected in field_types.items():
        value = document[key]
        if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
            raise EnvelopeError(f"envelope field {key!r} has the wrong type")
    if not _RUN_ID_RE.fullmatch(document["run_id"]):
        raise EnvelopeError("envelope run_id is not a UUID hex")
    _check_schemas(document["schema"], document.get("flow_schema"))
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
    if version >= 2:
        _check_times(document, now)
    return Envelope(**document, version=version)


def _check_schemas(schema: str | None, flow: str | None) -> None:
    if schema is not None and not _SCHEMA_RE.fullmatch(schema):
        raise EnvelopeError("envelope schema is not a valid schema name")
    public = project_settings.public_schema_name()
    if schema == public:
        raise EnvelopeError("envelope names the public schema; tenant runs never run there")
    if flow is not None and (
        schema is not None or not _SCHEMA_RE.fullmatch(flow) or flow == public
    ):
        raise EnvelopeError("envelope flow_schema is not the tenant of a system run")


def _check_times(document: dict[str, Any], now: float | None) -> None:
    signed_at, due_at, tick = document["signed_at"], document["due_at"], document["tick"]
    if isinstance(signed_at, bool) or isinstance(due_at, bool):
        raise EnvelopeError("envelope times have the wrong type")
    if not (0 <= signed_at <= due_at < 2**40):
        raise EnvelopeError("envelope is due before it was signed (or its times are not times)")
    if tick is not None and not _TICK_RE.fullmatch(tick):
        raise EnvelopeError("envelope tick is not a UTC time like 2026-01-31T03:00:00+00:00")
    max_age = conf.get().MESSAGE_MAX_AGE
    now = time.time() if now is None else now
    if now > due_at + max_age:
        raise EnvelopeError(
            f"expired: run {document['run_id']} was due at {_iso(due_at)} and messages expire "
            f"MESSAGE_MAX_AGE={max_age} s after their due time; a run that still waits is "
            "signed anew by the relay"
        )


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="seconds")
