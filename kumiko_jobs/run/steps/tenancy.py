"""Enter the run's tenant schema for the job body, and always come back clean.

The worker process serves every tenant; whatever a job does to the connection (switches
schema and forgets to switch back, breaks the transaction, leaves one open, changes the
session) must not reach the next run: ``kumiko_jobs.session`` resets every session after every
run, and a run that left a transaction open fails (its transaction is rolled back).
"""

from __future__ import annotations

import time
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections
from django_tenants.utils import tenant_context

from ...core import session
from ...core.exceptions import Unrecoverable
from ...guard.roles import connections as tenant_connections
from ..pipeline import Next
from ..state import RunState


def tenancy(state: RunState, call_next: Next) -> None:
    """Run the rest of the pipeline in the run's tenant (under ``DB_ROLES`` as the tenant's login),
    then put every connection back clean; a transaction the job left open is rolled back and fails
    the run.
    """
    busy = session.busy_aliases()
    left_open: list[str] = []
    identity = None
    state.watch.in_body = True
    try:
        with tenant_connections.body_identity(state.watch) as identity:
            # With DB_ROLES the body's connections are the tenant role's (pooled, never inside
            # a caller's transaction); the project's, set aside, are cleaned after the swap.
            body_busy = frozenset() if identity is not None else busy
            try:
                if state.tenant is None:  # a system run stays in public
                    call_next(state)
                else:
                    with tenant_context(state.tenant):
                        _other_aliases_in(state.tenant)
                        call_next(state)
            except BaseException:
                _leave(state, body_busy)
                raise
            left_open = _leave(state, body_busy)
    finally:
        state.watch.in_body = False
        if identity is not None and identity.project_used:
            # ctx.system_db() used the project's connections inside a tenant identity: reset
            # them, since the raw driver there is the project's user.
            left_open += _leave(state, busy)
    if left_open:
        raise Unrecoverable(
            f"the job left a transaction open on database alias {', '.join(map(repr, left_open))} "
            "(a raw BEGIN, a transaction.atomic() block never exited, or autocommit switched "
            "off); it was rolled back, so nothing the job wrote in it was committed. Exit every "
            "atomic() block (`with transaction.atomic():`) and end raw transactions with COMMIT."
        )


def _other_aliases_in(tenant: Any) -> None:
    """Every django-tenants alias in the run's schema, not only the default one that
    ``tenant_context`` switches: ``QuerySet.using(alias)`` must not read or write public."""
    for conn in connections.all():
        if conn.alias != DEFAULT_DB_ALIAS and hasattr(conn, "set_tenant"):
            conn.set_tenant(tenant)


def _leave(state: RunState, busy: frozenset[str]) -> list[str]:
    """End of the body: no transaction, no session state, public schema (module doc)."""
    try:
        return session.clean_up(busy)
    finally:
        reset_connections()


def reset_connections() -> None:
    """Back to the public schema on every alias; close only connections a run left broken.

    A worker is one long-lived process, not a request: a healthy connection is kept for the
    next run, because opening one costs more than a short job (Django's per-request rule,
    ``CONN_MAX_AGE = 0``, would reconnect for every run). A positive ``CONN_MAX_AGE`` still
    ages connections out.
    """
    for conn in connections.all(initialized_only=True):
        if hasattr(conn, "set_schema_to_public"):
            conn.set_schema_to_public()
        if conn.connection is None or conn.in_atomic_block:
            continue
        broken = conn.get_autocommit() != conn.settings_dict["AUTOCOMMIT"] or (
            conn.errors_occurred and not conn.is_usable()
        )
        expired = (
            bool(conn.settings_dict.get("CONN_MAX_AGE"))
            and conn.close_at is not None
            and time.monotonic() >= conn.close_at
        )
        if broken or expired:
            conn.close()
        else:
            conn.errors_occurred = False
