"""Enter the run's tenant schema for the job body, and always come back clean.

The worker process serves every tenant; whatever a job does to the connection (switches
schema and forgets to switch back, breaks the transaction) must not reach the next run.
"""

from __future__ import annotations

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
    """Back to the public schema on every alias; drop connections a job left unusable."""
    for conn in connections.all(initialized_only=True):
        if hasattr(conn, "set_schema_to_public"):
            conn.set_schema_to_public()
        if conn.connection is not None and conn.in_atomic_block is False:
            conn.close_if_unusable_or_obsolete()
