"""Enter the run's tenant schema for the job body, and always come back clean.

The worker process serves every tenant; whatever a job does to the connection (switches
schema and forgets to switch back, breaks the transaction) must not reach the next run.
"""

from __future__ import annotations

import time

from django.db import connections
from django_tenants.utils import tenant_context

from ..context import RunState
from ..pipeline import Next


def tenancy(state: RunState, call_next: Next) -> None:
    if state.tenant is None:  # a system run stays in public
        try:
            call_next(state)
        finally:
            reset_connections()
        return
    try:
        with tenant_context(state.tenant):
            call_next(state)
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
