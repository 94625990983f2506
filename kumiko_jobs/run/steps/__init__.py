"""The runner's steps, in the one list that defines their order (outermost first)."""

from __future__ import annotations

from ..pipeline import Step
from .atomic import atomic
from .db_guard import db_guard
from .deferral import deferral
from .fanout import fanout
from .gates import gates
from .records import records
from .tenancy import tenancy
from .tracing import tracing

DEFAULT_STEPS: tuple[Step, ...] = (
    tracing,
    records,
    deferral,
    gates,
    fanout,
    tenancy,
    atomic,
    db_guard,
)
