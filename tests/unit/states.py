"""The one factory of ``RunState`` objects for the unit tests (``make_state``).

Every unit test that needs a run's state builds it here, so that a change to ``RunState``'s
parts (the delivery, the tenancy) is made in one place instead of in every test module.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kumiko_jobs.core.envelope import Envelope, new_run_id
from kumiko_jobs.definition.options import build_definition
from kumiko_jobs.run.state import Delivery, Found, Missing, RunState


def body(ctx: Any, *, invoice_id: int = 0, note: Any = None) -> None:
    """The job body the unit tests' fakes stand in for (never called by them)."""


def make_state(
    schema: str | None = "t1",
    *,
    name: str = "unit.body",
    function: Callable[..., Any] = body,
    kwargs: dict[str, Any] | None = None,
    run_id: str | None = None,
    attempt: int = 1,
    defers: int = 0,
    gate_defers: int = 0,
    envelope_fields: dict[str, Any] | None = None,
    tenant: Any = None,
    lookup: Found | Missing | None = None,
    rq_job_id: str = "",
    queue: str = "",
    worker_name: str = "",
    **options: Any,
) -> RunState:
    """A run of a job named ``name`` declared with ``options`` (``@job``'s keywords), for a
    message to ``schema`` with ``kwargs`` (``{"invoice_id": 4}`` unless given).

    ``tenant``: the run's tenant as the gates step leaves it (None: not entered yet, or a
    system run); ``lookup``: the records step's tenant lookup; ``envelope_fields``: any other
    field of the message (``trigger``, ``correlation_id``, ``parent_run_id`` ...); ``rq_job_id``,
    ``queue`` and ``worker_name``: how it was delivered.
    """
    definition = build_definition(function, {"name": name} | options)
    envelope = Envelope(
        job=definition.name,
        schema=schema,
        kwargs={"invoice_id": 4} if kwargs is None else kwargs,
        run_id=run_id or new_run_id(),
        attempt=attempt,
        defers=defers,
        gate_defers=gate_defers,
        **(envelope_fields or {}),
    )
    state = RunState(Delivery(envelope, definition, rq_job_id, queue, worker_name))
    state.tenant = tenant
    state.tenancy.lookup = lookup
    return state
