"""The guard: what a tenant run's SQL may do, judged before PostgreSQL sees it (docs/guard.md).

The face of the package: ``kumiko_jobs.guard.classify``, ``Policy``, ``Verdict``, ``Rule``,
``Grant`` and ``statement_shape`` (with the ``Shape`` vocabulary) are the names docs, benchmarks
and tests use. Inside: ``parse`` (text -> Shape, through ``walker`` over PostgreSQL's parse
tree), ``verdict`` (Policy, Verdict, Rule) and ``judge`` (Shape + Policy -> Verdict) are pure;
``wrapper`` and ``install`` put the judge on the body's connections; ``denials`` builds every
refusal; ``connections`` and ``role_*`` are the second wall (one PostgreSQL role per tenant);
``watch`` is the guard's part of a run.
"""

from __future__ import annotations

from .judge import Grant, Policy, Rule, Verdict, classify
from .parse import statement_shape
from .shape import Call, Shape, Write

__all__ = [
    "Call",
    "Grant",
    "Policy",
    "Rule",
    "Shape",
    "Verdict",
    "Write",
    "classify",
    "statement_shape",
]
