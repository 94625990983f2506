"""Per-tenant fan-out: one child run per active tenant, with deterministic ids.

A child's run id is derived from the parent's run id and the tenant's schema, so a fan-out that
is retried (or delivered twice) inserts no duplicate rows (``ignore_conflicts``) and pushes no
duplicate work (a message for a run that already started is dropped by the records step).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

from django.utils.module_loading import import_string
from django_tenants.utils import get_tenant_model

from . import conf
from .context import RunState
from .envelope import Envelope
from .exceptions import Unrecoverable


def active_tenants() -> Iterator[Any]:
    """``KUMIKO_JOBS["TENANT_QUERYSET"]`` (a callable's dotted path), else every active tenant."""
    path = conf.get().TENANT_QUERYSET
    if path:
        queryset = import_string(path)()
    else:
        queryset = get_tenant_model().objects.exclude(schema_name=conf.public_schema_name())
        active_field = conf.get().TENANT_ACTIVE_FIELD
        if active_field:
            queryset = queryset.filter(**{active_field: True})
    return iter(queryset.order_by("pk").only("pk", "schema_name"))


def child_run_id(parent_run_id: str, schema: str) -> str:
    return uuid.uuid5(uuid.UUID(parent_run_id), schema).hex


def fan_out(state: RunState) -> int:
    """Record one follow-up per tenant; the runner writes and pushes them on success."""
    from .enqueueing import _row, message_for

    parent, definition = state.envelope, state.definition
    limit = conf.get().MAX_FANOUT_TENANTS
    count = 0
    for tenant in active_tenants():
        if count == limit:
            # Every child is held in memory and written in the attempt's final transaction:
            # fail before that grows without bound, and say so instead of covering some tenants.
            raise Unrecoverable(
                f"the fan-out of {parent.job} covers more than MAX_FANOUT_TENANTS={limit} "
                "tenants; no child run was created. Raise the setting, or narrow the tenants "
                "with TENANT_QUERYSET."
            )
        child = Envelope(
            job=parent.job,
            schema=tenant.schema_name,
            kwargs=parent.kwargs,
            run_id=child_run_id(parent.run_id, tenant.schema_name),
            correlation_id=parent.correlation_id,
            triggered_by=parent.triggered_by,
            trigger=parent.trigger or "fanout",
            trace=parent.trace,
            origin=parent.origin,
            parent_run_id=parent.run_id,
            # (job, tick, tenant): the signed identity of a cron tick's child.
            tick=parent.tick,
        )
        state.followups.append(
            (message_for(definition, child, 0.0), _row(definition, child, state.subject, 0.0))
        )
        count += 1
    return count
