"""The tables no tenant run's SQL reaches, whatever its grants: kumiko's own (the job history of
every tenant), the operators' records shared by every tenant (sessions and the admin's log when
their app is in SHARED_APPS only), and the operators' copies in public of an app in both app
lists. Each answer is a denial, or None when the statement names none of them; a system run
(schema public) is the operators' code and never refused here. Pure, like ``judge``, whose
rules ask these first (docs/guard.md, "Shared tables").
"""

from __future__ import annotations

from .shape import Shape
from .verdict import Policy, Rule, Verdict, denied


def never_named(shape: Shape, policy: Policy) -> Verdict | None:
    """kumiko's tables and the operators' records, by any name, in any schema."""
    own = _named(policy.kumiko_tables, shape, policy)
    if own:
        return denied(
            shape.kind,
            None,
            Rule.PROTECTED,
            f"{', '.join(own)}: kumiko's own table(s), the job history of every tenant "
            f"(arguments, results, errors, tracebacks); a tenant run's SQL never names them, "
            f"whatever its grants",
        )
    records = _named(policy.operator_records, shape, policy)
    if records:
        return denied(
            shape.kind,
            None,
            Rule.OPERATORS,
            f"{', '.join(records)}: the operators' records of every user (sessions, the "
            f"admin's log), shared by every tenant because the app is in SHARED_APPS only; a "
            f"tenant run's SQL never names them, whatever its grants (read a user's own data "
            f"from the user table, or do it in a system job)",
        )
    return None


def operators_public_copies(shape: Shape, policy: Policy) -> Verdict | None:
    """``public.<table>`` of an app in SHARED_APPS and TENANT_APPS, read or written: the
    operators' copy (the tenant's own is the unqualified name)."""
    public = policy.public_schema
    if not policy.operator_tables or policy.schema == public:
        return None
    named = {name for schema, name in shape.qualified_relations if schema == public}
    named |= {w.table for w in shape.writes if w.schema == public}
    named &= policy.operator_tables
    if not named:
        return None
    return denied(
        shape.kind,
        None,
        Rule.OPERATORS,
        f"{', '.join(f'{public}.{name}' for name in sorted(named))}: the operators' own table(s) "
        f"in {public} (the app is in SHARED_APPS and TENANT_APPS, so this tenant has its own "
        f"copy: write the name unqualified); no grant of a tenant run reads or writes the "
        f"public copy",
    )


def _named(tables: frozenset[str], shape: Shape, policy: Policy) -> list[str]:
    """Which of ``tables`` the statement names, in any schema, for a tenant run."""
    if not tables or policy.schema == policy.public_schema:
        return []
    named = tables.intersection(shape.relations)
    if shape.literal_words:  # SQL text in a literal, run by a function or DO (unsafe_raw)
        named |= tables.intersection(shape.literal_words)
    return sorted(named)
