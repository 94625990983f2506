"""Per-tenant fan-out: one child run per active tenant, with deterministic ids, in chunks.

A child's run id is derived from the parent's run id and the tenant's schema, so a fan-out that
is retried (or delivered twice) inserts no duplicate rows and pushes no duplicate work.

At 10,000 tenants nothing here grows with the tenant count but the time: the tenants are read
``FANOUT_CHUNK_SIZE`` at a time (keyset pagination on the primary key, never the whole list),
and each chunk is one transaction with one ``INSERT ... ON CONFLICT DO NOTHING RETURNING`` of
its child rows, committed before its messages are pushed in one pipeline (``push_many``). The
rows are the outbox (relay.py): a crash between a chunk's commit and its push leaves queued
rows the relay pushes; a redelivered parent re-inserts its chunks, and only the rows it really
inserted (``RETURNING``) get a message, so a child pushed before the crash is not pushed again.
No transaction spans the whole fan-out, so none holds locks or a snapshot for its duration.

The fan-out runs in its own pipeline step (``steps.fanout``), in public and outside the job
body's guard: it writes kumiko's history, which no job body may write.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

from django.db import transaction
from django.db.models import QuerySet
from django.db.models.constants import OnConflict
from django.utils.module_loading import import_string
from django_tenants.utils import get_tenant_model

from .. import transport
from ..core import conf, project_settings
from ..core.envelope import Envelope
from ..core.exceptions import Unrecoverable
from ..definition.job import JobDefinition
from ..models import JobRun
from .messages import pushable, row_for


def active_tenants() -> QuerySet[Any]:
    """``KUMIKO_JOBS["TENANT_QUERYSET"]`` (a callable's dotted path), else every active tenant."""
    path = conf.get().TENANT_QUERYSET
    if path:
        queryset: QuerySet[Any] = import_string(path)()
    else:
        queryset = get_tenant_model().objects.exclude(
            schema_name=project_settings.public_schema_name()
        )
        active_field = conf.get().TENANT_ACTIVE_FIELD
        if active_field:
            queryset = queryset.filter(**{active_field: True})
    return queryset


def tenant_chunks(queryset: QuerySet[Any], size: int) -> Iterator[list[str]]:
    """The schemas of ``queryset`` in primary-key order, ``size`` at a time.

    Keyset pagination (``pk > last``), not OFFSET and not one cursor: each page is an index
    range scan that costs the same on the last page as on the first, and no server-side cursor
    (a transaction held open for the whole fan-out) is needed.
    """
    last: Any = None
    while True:
        page = queryset.order_by("pk")
        if last is not None:
            page = page.filter(pk__gt=last)
        rows = list(page.values_list("pk", "schema_name")[:size])
        if not rows:
            return
        yield [schema for _, schema in rows]
        if len(rows) < size:
            return
        last = rows[-1][0]


def insert_new(rows: list[JobRun]) -> set[uuid.UUID]:
    """Insert ``rows`` in one statement, skipping those that exist; the ids really inserted.

    ``bulk_create(ignore_conflicts=True)`` cannot say which rows were new; PostgreSQL's
    ``ON CONFLICT DO NOTHING RETURNING`` returns exactly those, so this uses the queryset's
    insert directly (what ``bulk_create`` does underneath, with the returning column asked for).
    """
    if not rows:
        return set()
    fields = [f for f in JobRun._meta.concrete_fields if not f.generated]
    pk = JobRun._meta.pk
    assert pk is not None
    returned = JobRun.objects._insert(  # type: ignore[attr-defined]
        rows, fields=fields, returning_fields=[pk], on_conflict=OnConflict.IGNORE
    )
    return {row[0] for row in returned or ()}


def fan_out(parent: Envelope, definition: JobDefinition, subject: str) -> int:
    """Create and push one child run per tenant, chunk by chunk; the number of tenants.

    ``parent``: the fan-out run's envelope; ``subject``: its subject, which every child shares.
    """
    settings = conf.get()
    limit, size = settings.MAX_FANOUT_TENANTS, settings.FANOUT_CHUNK_SIZE
    tenants = active_tenants()
    # Counted (at most limit + 1 rows) before any child exists: a fan-out over the limit
    # creates none, rather than silently covering the first ``limit`` tenants.
    if tenants.order_by()[: limit + 1].count() > limit:
        raise Unrecoverable(
            f"the fan-out of {parent.job} covers more than MAX_FANOUT_TENANTS={limit} "
            "tenants; no child run was created. Raise the setting, or narrow the tenants "
            "with TENANT_QUERYSET."
        )
    count = 0
    unpushable: set[str | None] = set()
    for schemas in tenant_chunks(tenants, size):
        children = [parent.child(schema) for schema in schemas]
        rows = [row_for(definition, child, subject, 0.0) for child in children]
        # One short transaction per chunk: its rows commit before its messages exist.
        with transaction.atomic():
            inserted = insert_new(rows)
        # A child whose tenant's TENANT_WEIGHT or TENANT_RATE_LIMIT fails waits (its row is
        # written; the relay pushes it once the setting works): the others go on.
        messages = (
            pushable(definition, child, 0.0, failed=unpushable)
            for child in children
            if uuid.UUID(child.run_id) in inserted
        )
        transport.push_many(m for m in messages if m is not None)
        count += len(schemas)
    return count
