"""A per-tenant job's run without a tenant is its fan-out: the children are created here.

Between the gates and the tenancy step: in public, on the project's connection, and outside
the job body's guard, because the fan-out writes kumiko's history (the child runs), which no
job body may write. The job's own function is not called for the parent.
"""

from __future__ import annotations

from ...enqueueing.fanout import fan_out
from ..pipeline import Next
from ..state import RunState


def fanout(state: RunState, call_next: Next) -> None:
    """For a per-tenant job's run without a tenant, create one child run per tenant and succeed
    without calling the job; any other run goes on down the pipeline.
    """
    if state.definition.per_tenant and state.envelope.schema is None:
        state.ending.succeed(fan_out(state.envelope, state.definition, state.tenancy.subject))
        return
    call_next(state)
