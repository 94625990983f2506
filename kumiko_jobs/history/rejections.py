"""Queue messages refused without a run: one ``RejectedMessage`` row each.

The runner (a message that does not decode, a cron template in a queue, an unknown job without
a run row), the records step (a message whose run row is gone) and the worker (a message that
is not a call of the runner, a job hash RQ cannot load) all refuse this way. The row is written
here, below all three, so none of them imports another to record a refusal. The caller passes
the queue: only the run and worker sides know which queue the message came from.

Each row notes the tenant the message names (``schema_name``; read from the envelope, or from
the unverified JSON of one that did not decode), so that a deleted tenant's refused messages go
with the rest of its history (history/retention.py). A message that names a tenant already
deleted keeps no excerpt: its arguments are that tenant's data, which its deletion removed.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

from django_tenants.utils import get_tenant_model

from ..core.envelope import Envelope
from ..core.text import storable
from ..models import RejectedMessage

# The runner's logger, as before this module existed: users' LOGGING may route it.
logger = logging.getLogger("kumiko_jobs.runner")

# What PostgreSQL accepts as a schema name here (the envelope's own rule is no looser).
_SCHEMA = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_$-]{0,62}")
# Bytes of a message read to find the tenant it names (an envelope is at most
# MAX_ENVELOPE_BYTES; a refused message may be anything).
_READ_AT_MOST = 1024 * 1024


def record_rejection(
    message: object, reason: str, rq_job_id: str, queue: str, *, schema: str | None = None
) -> None:
    """Log the refusal and store it with an excerpt of the message (forged text made storable)
    and the tenant it names (``schema``, else read from the message)."""
    logger.error("rejected queue message %s: %s", rq_job_id or "?", reason)
    try:
        excerpt = message if isinstance(message, str) else repr(message)
    except RecursionError:
        excerpt = f"<a {type(message).__name__} nested too deeply to show>"
    named = schema if schema is not None else claimed_schema(message)
    if named and not _tenant_exists(named):
        excerpt = f"<withheld: the message names {named!r}, a tenant that has been deleted>"
    RejectedMessage.objects.create(
        rq_job_id=_storable(rq_job_id, 128),
        reason=_storable(reason, 500),
        queue=_storable(queue, 100),
        excerpt=_storable(excerpt, 2000),
        schema_name=named,
    )


def claimed_schema(message: object) -> str:
    """The tenant schema a refused message names, or ``""``: an envelope's own, or the
    ``schema`` field of a signed string's JSON, read without trusting it (its signature may be
    what failed). Only for finding the row again when that tenant is deleted."""
    if isinstance(message, Envelope):
        return message.schema or ""
    if not isinstance(message, str) or len(message) > _READ_AT_MOST:
        return ""
    # A signed envelope is "<JSON>:<signature>" (Django's Signer); a bare document may come too.
    for text in (message.rpartition(":")[0], message):
        document = _json_object(text)
        if document is not None:
            schema = document.get("schema")
            if isinstance(schema, str) and _SCHEMA.fullmatch(schema):
                return schema
            return ""
    return ""


def _json_object(text: str) -> dict[str, Any] | None:
    try:
        document = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return document if isinstance(document, dict) else None


def _tenant_exists(schema: str) -> bool:
    """Whether a tenant has ``schema`` (one query on the tenant model's unique schema name)."""
    return bool(get_tenant_model().objects.filter(schema_name=schema).exists())


def _storable(text: str, limit: int) -> str:
    """Forged text as PostgreSQL can store it: NUL and lone surrogates escaped, not fatal."""
    return storable(text[:limit])[:limit]
