"""Gates: refuse or postpone a run before its tenant is entered.

A gate that says no sets the outcome itself and does not call the rest of the pipeline. Tenant
lookups happen here, in the public schema, and fail closed: a run whose tenant cannot be found
never falls back to public.
"""

from __future__ import annotations

from ...core import conf
from ...core.exceptions import InvalidJob, Unrecoverable
from ...core.outcome import DeferralKind
from ...definition.subject import build_subject
from ...history import run_sql
from ..pipeline import Next
from ..state import RunState


def gates(state: RunState, call_next: Next) -> None:
    """Refuse a message whose schema does not fit its job, whose arguments do not bind, or whose
    tenant is missing; drop or postpone a run of an inactive tenant; otherwise hand the run its
    tenant and go on.
    """
    env, definition = state.envelope, state.definition
    # A per-tenant job's message without a schema is its fan-out; every other job is either
    # system (never a schema) or tenant (always one).
    if not definition.per_tenant and definition.system != (env.schema is None):
        kind = "a system job" if definition.system else "a tenant job"
        return _refuse(state, f"message for {kind} names schema {env.schema!r}")
    try:
        state.tenancy.subject = build_subject(definition, env.kwargs)
        definition.bind_arguments(env.kwargs)
    except InvalidJob as exc:
        return _refuse(state, str(exc))
    if env.schema is not None:
        # Loaded by the records step with the run's start; looked up here when it did not run.
        lookup = state.tenancy.lookup
        tenant = lookup.tenant if lookup is not None else run_sql.find_tenant(env.schema)
        if tenant is None:
            return _refuse(state, f"tenant not found: no tenant has schema {env.schema!r}")
        active_field = conf.get().TENANT_ACTIVE_FIELD
        if active_field and not getattr(tenant, active_field, True):
            settings = conf.get()
            if settings.INACTIVE_TENANT == "defer":
                seconds = float(settings.INACTIVE_TENANT_DEFER_SECONDS)
                state.ending.defer(seconds, DeferralKind.GATE)
            else:
                state.ending.drop(f"tenant {env.schema!r} is inactive")
            return None
        state.tenant = tenant
    call_next(state)
    return None


def _refuse(state: RunState, reason: str) -> None:
    state.ending.fail(Unrecoverable(reason))
