"""The judge's vocabulary: the policy it applies, the rules it names and the verdict it gives.

A :class:`Policy` is what a tenant run may do at one call site; a :class:`Verdict` is the
judge's answer for one statement, naming the :class:`Rule` that refused it. The rules are an
enum, not words compared where they are read: the hint a user reads for a refusal is chosen by
rule (``guard.denials``), and a renamed rule must fail loudly there, never silently fall
through to another hint. Kept apart from ``guard.judge`` so that the rules' code reads in one
place and the vocabulary, which the denials and the wrapper also speak, in another.

Pure: no Django, no database.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from functools import lru_cache
from types import MappingProxyType

from ..core.grants import Grant
from .shape import Call

__all__ = ["Policy", "Rule", "Verdict", "allowed", "allowed_with", "denied"]


class Rule(StrEnum):
    """The rule that refused a statement (docs/guard.md names each). A ``StrEnum``: the value is
    the word docs and hints write (``rule public_intake_required``)."""

    # kumiko's own tables and lock keys: no grant of a tenant run opens them.
    PROTECTED = "protected"
    # What the classifier cannot verify (DDL, COPY, SET, functions off the allowlist, ...):
    # the unsafe_raw grant.
    UNVERIFIABLE = "unverifiable"
    # Another tenant's schema: read with cross_tenant_reads; never written.
    CROSS_SCHEMA = "cross_schema"
    # A write to a shared table: the global_writes grant.
    SHARED_WRITE = "shared_write"
    # Catalog values of every tenant or session: no grant.
    CATALOG = "catalog"
    # The operators' own copies in public (apps in SHARED_APPS and TENANT_APPS): no grant.
    OPERATORS = "operators"
    # Inside cross_tenant_reads: only reads.
    READ_ONLY = "read_only"
    # Personal data written by a run of anonymous origin without public intake: no grant.
    PUBLIC_INTAKE_REQUIRED = "public_intake_required"


_NO_PERSONAL_DATA: Mapping[str, frozenset[str]] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Policy:
    """What a tenant run may do at one call site: its schema, the shared tables, the grants
    open now and the project's extras. Built by the guard's wrapper for the run's current
    hatches; immutable, so one policy can be reused for every statement of the same block."""

    schema: str
    shared_tables: frozenset[str]
    active_grants: frozenset[Grant] = frozenset()
    readable_schema: str | None = None
    # Excluded from hashing: a mapping is not hashable (a policy is hashed only to memoise the
    # read-only policy of a switched connection, ``judge.classify_switch``).
    personal_data_columns: Mapping[str, frozenset[str]] = field(
        default=_NO_PERSONAL_DATA, hash=False
    )
    deny_personal_data_writes: bool = False
    # Shared tables no grant may write: the job system's own history and the tenant registry.
    # (A system job inside ctx.system_db() is not judged at all.)
    protected_tables: frozenset[str] = frozenset()
    # Tables of apps in both SHARED_APPS and TENANT_APPS: the tenant's own copy is the
    # unqualified name; public.<table> is the operators' (sessions, users), never a tenant's.
    operator_tables: frozenset[str] = frozenset()
    # kumiko's own tables (every tenant's runs, arguments, results, errors): never named by a
    # tenant run's SQL, read or written, whatever its grants. kumiko's own reads inside a run
    # (RunHandle.refresh(), get_result()) go through history.run_reads, unjudged.
    kumiko_tables: frozenset[str] = frozenset()
    # Shared-only tables of the operators' records of every user (sessions, the admin's log:
    # guard.tables.operator_record_tables): never named by a tenant run's SQL either.
    operator_records: frozenset[str] = frozenset()
    # django-tenants' PUBLIC_SCHEMA_NAME: the shared schema, whatever it is called. SQL names
    # it by this name; a system run's ``schema`` is it.
    public_schema: str = "public"
    # KUMIKO_JOBS["GUARD_EXTRA_FUNCTIONS"]: "name" (unqualified, or qualified with public or an
    # extra schema) or "schema.name", lower case.
    extra_functions: frozenset[str] = frozenset()
    # PG_EXTRA_SEARCH_PATHS (django-tenants): shared schemas on every tenant's search path, in
    # order. Read like public, written like public (global_writes); their functions are allowed.
    extra_schemas: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # classify() relies on this, so an inconsistent policy fails loudly at construction.
        if self.readable_schema is not None and (
            Grant.CROSS_TENANT_READS not in self.active_grants
        ):
            raise ValueError("readable_schema requires the cross_tenant_reads grant")

    def trusts(self, call: Call) -> bool:
        """Whether the project's settings allow ``call`` (GUARD_EXTRA_FUNCTIONS, extra schemas)."""
        if call.schema is None:
            return call.name in self.extra_functions
        if call.schema in self.extra_schemas:
            return True
        if f"{call.schema}.{call.name}" in self.extra_functions:
            return True
        return call.schema == self.public_schema and call.name in self.extra_functions

    def own_search_path(self, path: tuple[str, ...]) -> bool:
        """Whether ``path`` is the ``SET search_path`` django-tenants sends for the run's schema
        (or the read one).

        django-tenants sends ``own[, public][, *PG_EXTRA_SEARCH_PATHS]``; the public schema's own
        path is ``public[, *extra]``.
        """
        extra = self.extra_schemas
        for schema in (self.schema, self.readable_schema):
            if schema is None:
                continue
            for candidate in ((schema,), (schema, self.public_schema)):
                if path == candidate or (extra and path == (*candidate, *extra)):
                    return True
        return False


@dataclass(frozen=True, slots=True)
class Verdict:
    """The judge's answer for one statement: allowed or not, the rule that decided, the grant
    that would allow it, and the grants it relied on (reported to the escape-hatch audit)."""

    allowed: bool
    kind: str
    grant_needed: Grant | None
    grant_used: Grant | None
    reason: str
    rule: Rule | None = None  # None: allowed
    # Every grant the statement relied on; grant_used is the first of them.
    grants_used: tuple[Grant, ...] = ()


@lru_cache(maxsize=64)
def allowed(kind: str) -> Verdict:
    """A statement of ``kind`` allowed without any grant."""
    return Verdict(True, kind, None, None, "allowed")


@lru_cache(maxsize=256)
def allowed_with(kind: str, used: tuple[Grant, ...]) -> Verdict:
    """A statement of ``kind`` allowed, relying on the grants ``used`` (in order, repeats kept
    once)."""
    if not used:
        return allowed(kind)
    unique = tuple(dict.fromkeys(used))
    reason = "allowed with " + ", ".join(unique)
    return Verdict(True, kind, None, unique[0], reason, grants_used=unique)


def denied(kind: str, grant: Grant | None, rule: Rule, reason: str) -> Verdict:
    """A statement of ``kind`` refused by ``rule``; ``grant``: the one that would allow it
    (None: no grant does)."""
    return Verdict(False, kind, grant, None, reason, rule)
