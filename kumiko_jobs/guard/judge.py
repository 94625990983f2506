"""Decide whether a tenant run may execute a SQL statement.

Pure on purpose: no Django, no database, so the rules can be unit-tested and reasoned about in
isolation. The caller (``guard.wrapper.GuardWrapper``) builds a :class:`Policy` for the current
call site and asks :func:`classify` about every statement.

The analysis is split in two. :func:`parse.statement_shape` reads PostgreSQL's own parse tree
of the text the server will receive and is memoised by (text, parameters), because the ORM sends
the same placeholder-bearing text over and over; :func:`classify` then applies the policy to that
shape, which costs a few attribute lookups. docs/guard.md explains every rule. This module owns
that second half (the policy, the verdict and the rules), so the rules read in one place.

Decisions (see ARCHITECTURE.md, "DB guard model"):

* Unqualified relation names resolve as PostgreSQL resolves them: ``pg_catalog`` before the
  search path, so ``pg_settings`` is the catalog, not a tenant table. Catalog relations that
  describe objects (``pg_class``, ``pg_attribute``, ...) and ``information_schema`` may be read;
  catalog relations holding other tenants' or sessions' values (``pg_stats``,
  ``pg_stat_activity``, ``pg_sequences``, ...) and writes to any catalog are denied whatever the
  grants (rules ``catalog`` and ``cross_schema``).
* Catalog columns and functions that hand out other tenants' values (``pg_class.reltuples``,
  ``pg_proc.prosrc``, ``pg_get_viewdef``, size functions: ``guard.catalog_reads``) are denied
  whatever the grants (rule ``catalog``), and so is ``public.<table>`` of an app in both
  SHARED_APPS and TENANT_APPS, read or written: the operators' own copy (rule ``operators``;
  the tenant's own copy is the unqualified name). kumiko's own tables (the job history of
  every tenant) are refused to a tenant run in any schema, read, written, locked or copied,
  under ``unsafe_raw`` too (rule ``protected``).
* A write into another tenant's schema has no grant that allows it: the way to change another
  tenant's data is a job running in that tenant. The same holds for a statement that writes (or
  locks rows with ``FOR UPDATE``/``FOR SHARE``) and at the same time reads another schema.
* While ``readable_schema`` is set the runner has pointed ``search_path`` at the other tenant, so
  unqualified names mean that tenant: every write, row lock and unverifiable statement is denied
  (rule ``read_only``) and every read reports ``cross_tenant_reads`` as used.
* Functions pass by allowlist (``guard.allowlists``), extended by ``extra_functions`` and the
  ``extra_schemas`` (``PG_EXTRA_SEARCH_PATHS``); any other call needs ``unsafe_raw``.
* ``unsafe_raw`` covers only the "cannot verify" class. A statement that is otherwise parseable
  (e.g. a SELECT that calls ``set_config``) is still checked for shared writes and foreign schemas,
  so one grant never silently implies another. DDL, COPY, DO and friends are not inspected
  further under ``unsafe_raw``. Multiple statements are: each one is judged on its own, but the
  effect of one on the next (e.g. a ``SET search_path`` that changes what later unqualified names
  mean) cannot be followed; that residual risk is what ``unsafe_raw`` accepts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from types import MappingProxyType

from ..core.grants import Grant
from .parse import statement_shape
from .shape import INFORMATION_SCHEMA, Call, Shape

__all__ = ["Grant", "Policy", "Verdict", "classify"]


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
    # Excluded from hashing: a mapping is not hashable, and a policy is never used as a key.
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


@dataclass(frozen=True, slots=True)
class Verdict:
    """The judge's answer for one statement: allowed or not, the rule that decided, the grant
    that would allow it, and the grants it relied on (reported to the escape-hatch audit)."""

    allowed: bool
    kind: str
    grant_needed: Grant | None
    grant_used: Grant | None
    reason: str
    rule: str = ""
    # Every grant the statement relied on; grant_used is the first of them.
    grants_used: tuple[Grant, ...] = ()


# --- policy ------------------------------------------------------------------------------------

_PERSONAL_DATA_VERBS = frozenset({"insert", "update", "merge"})


@lru_cache(maxsize=64)
def _allowed(kind: str) -> Verdict:
    return Verdict(True, kind, None, None, "allowed")


def _denied(kind: str, grant: Grant | None, rule: str, reason: str) -> Verdict:
    return Verdict(False, kind, grant, None, reason, rule)


def classify(sql: str, policy: Policy, *, parameters: bool = True) -> Verdict:
    """Decide whether a tenant run may execute ``sql`` under ``policy``.

    ``parameters``: whether the statement is executed with parameters (``params is not None``);
    psycopg substitutes placeholders (and turns ``%%`` into ``%``) only then, so the text judged
    is the text the server receives.
    """
    shape = statement_shape(sql, parameters)
    if shape.plain and policy.readable_schema is None and not policy.deny_personal_data_writes:
        # The hot path: ORM reads, and writes to the tenant's own tables.
        written = shape.local_write_tables
        if (
            written is not None
            and policy.shared_tables.isdisjoint(written)
            and policy.kumiko_tables.isdisjoint(shape.relations)
        ):
            return _allowed(shape.kind)
    return _judge(shape, policy)


def _judge(shape: Shape, policy: Policy) -> Verdict:
    kind = shape.kind
    grants = policy.active_grants
    reading = policy.readable_schema
    own = _kumiko_tables(shape, policy)
    if own:
        # Before the unverifiable class: unsafe_raw does not open them either (COPY, LOCK).
        return _denied(
            kind,
            None,
            "protected",
            f"{', '.join(own)}: kumiko's own table(s), the job history of every tenant "
            f"(arguments, results, errors, tracebacks); a tenant run's SQL never names them, "
            f"whatever its grants",
        )
    if shape.search_path is not None and _search_path_ok(shape.search_path, policy):
        return _allowed(kind)
    if reading == "public" and policy.schema != "public":
        return _reading_public(kind)
    if shape.unverifiable:
        if reading is not None:
            return _read_only(kind, reading, shape.unverifiable)
        if Grant.UNSAFE_RAW not in grants:
            return _denied(
                kind,
                Grant.UNSAFE_RAW,
                "unverifiable",
                f"{shape.unverifiable}; needs the unsafe_raw grant",
            )
        return _judge_unsafe(shape, policy)
    hard = _no_grant_allows(shape, policy)
    if hard is not None:
        return hard

    # Grant denials wait until every write was checked, so that a hard denial (which no grant
    # can fix) wins over asking for a grant that would not suffice anyway.
    missing: tuple[Grant, str, str] | None = None  # (grant, rule, reason) of the first gap
    used: list[Grant] = []
    for write in shape.writes:
        if reading is not None:
            return _read_only(kind, reading, f"{write.verb.upper()} on '{write.table}'")
        if write.schema is None or write.schema == policy.schema:
            shared = write.schema is None and write.table in policy.shared_tables
        elif write.schema == "public" or write.schema in policy.extra_schemas:
            shared = True
        else:
            return _denied(
                kind,
                None,
                "cross_schema",
                f"{write.verb.upper()} on '{write.schema}.{write.table}': a tenant run never "
                f"writes outside its own schema",
            )
        if policy.deny_personal_data_writes and write.verb in _PERSONAL_DATA_VERBS:
            personal = policy.personal_data_columns.get(write.table)
            if personal and (write.columns is None or not personal.isdisjoint(write.columns)):
                return _denied(
                    kind,
                    None,
                    "public_intake_required",
                    f"{write.verb.upper()} writes personal data to '{write.table}' but the run's "
                    f"origin is anonymous without public intake",
                )
        if not shared:
            continue
        if write.table in policy.protected_tables:
            return _denied(
                kind,
                None,
                "protected",
                f"{write.verb.upper()} on '{write.table}': the job history and the tenant "
                f"registry are never written by a tenant run, whatever its grants",
            )
        if Grant.GLOBAL_WRITES in grants:
            used.append(Grant.GLOBAL_WRITES)
        elif missing is None:
            name = write.table if write.schema is None else f"{write.schema}.{write.table}"
            missing = (
                Grant.GLOBAL_WRITES,
                "shared_write",
                f"{write.verb.upper()} on shared table '{name}' needs the global_writes grant",
            )
    if shape.locks and reading is not None:
        return _read_only(kind, reading, "row locks (FOR UPDATE/SHARE)")
    for schema in sorted(shape.schemas):
        if (
            schema == policy.schema
            or schema == "public"
            or schema == INFORMATION_SCHEMA
            or schema in policy.extra_schemas
        ):
            continue
        if shape.writes or shape.locks:
            return _denied(
                kind,
                None,
                "cross_schema",
                f"a statement that writes or locks rows cannot also read schema '{schema}'; "
                f"read it first inside cross_tenant_reads",
            )
        if schema != reading:
            # Holding cross_tenant_reads for one tenant must not open any other schema.
            return _denied(
                kind,
                Grant.CROSS_TENANT_READS,
                "cross_schema",
                f"reference to schema '{schema}' needs the cross_tenant_reads grant for it",
            )
        used.append(Grant.CROSS_TENANT_READS)
    if missing is not None:
        return _denied(kind, *missing)
    if reading is not None:
        used.append(Grant.CROSS_TENANT_READS)  # unqualified names now mean the other tenant
    calls = [call for call in shape.calls if not _extra_function(call, policy)]
    if calls:
        if Grant.UNSAFE_RAW not in grants:
            names = ", ".join(f"{call}()" for call in calls)
            return _denied(
                "call_function",
                Grant.UNSAFE_RAW,
                "unverifiable",
                f"calling {names} needs the unsafe_raw grant (functions outside the guard's "
                f"allowlist; a function the project trusts can be added to "
                f"KUMIKO_JOBS['GUARD_EXTRA_FUNCTIONS'])",
            )
        used.append(Grant.UNSAFE_RAW)
    return _allowed_with(kind, tuple(used))


def _no_grant_allows(shape: Shape, policy: Policy) -> Verdict | None:
    """What no grant of a tenant run allows, whatever else the statement does: kumiko's lock
    keys, catalog values, the operators' copies in public."""
    kind = shape.kind
    if shape.forbidden:
        return _denied(kind, None, "protected", shape.forbidden + "; no grant allows it")
    if shape.forbidden_catalogs:
        names = ", ".join(shape.forbidden_catalogs)
        return _denied(
            kind,
            None,
            "catalog",
            f"reading {names} of the catalogs: they hold values of every tenant or "
            f"session (statistics, row counts, sizes, the text of functions and views, "
            f"activity, sequences, locks, credentials), which no grant of a tenant run covers; "
            f"name only the columns that describe objects, or read them from a system job",
        )
    operators = _operator_tables(shape, policy)
    if operators:
        names = ", ".join(f"public.{name}" for name in operators)
        return _denied(
            kind,
            None,
            "operators",
            f"{names}: the operators' own table(s) in public (the app is in SHARED_APPS and "
            f"TENANT_APPS, so this tenant has its own copy: write the name unqualified); no "
            f"grant of a tenant run reads or writes the public copy",
        )
    return None


def _reading_public(kind: str) -> Verdict:
    """cross_tenant_reads of the public tenant: its unqualified names would be the operators'
    copies (sessions, users); its shared tables need no grant to be read."""
    return _denied(
        kind,
        None,
        "operators",
        "cross_tenant_reads of the public schema: it is no tenant; its unqualified names are "
        "the operators' own tables (sessions, users), and its shared tables need no grant "
        "to be read",
    )


def _operator_tables(shape: Shape, policy: Policy) -> list[str]:
    """The operators' tables the statement names in public (reads and writes)."""
    if not policy.operator_tables or policy.schema == "public":
        return []  # a system run's own schema is public: the operators' code
    named = policy.operator_tables.intersection(shape.public_relations)
    named |= {w.table for w in shape.writes if w.schema == "public"} & policy.operator_tables
    return sorted(named)


def _kumiko_tables(shape: Shape, policy: Policy) -> list[str]:
    """kumiko's own tables the statement names, in any schema (a tenant run only)."""
    if not policy.kumiko_tables or policy.schema == "public":
        return []  # a system run's own schema is public: the operators' code
    named = policy.kumiko_tables.intersection(shape.relations)
    if shape.literal_words:  # SQL text in a literal, run by a function or DO (unsafe_raw)
        named |= policy.kumiko_tables.intersection(shape.literal_words)
    return sorted(named)


def _judge_unsafe(shape: Shape, policy: Policy) -> Verdict:
    used = [Grant.UNSAFE_RAW]
    for number, part in enumerate(shape.parts, 1):
        verdict = _judge(part, policy)
        if not verdict.allowed:
            return _denied(
                shape.kind,
                verdict.grant_needed,
                verdict.rule,
                f"statement {number}: {verdict.reason}",
            )
        used.extend(verdict.grants_used)
    return _allowed_with(shape.kind, tuple(used))


@lru_cache(maxsize=256)
def _allowed_with(kind: str, used: tuple[Grant, ...]) -> Verdict:
    if not used:
        return _allowed(kind)
    unique = tuple(dict.fromkeys(used))
    reason = "allowed with " + ", ".join(unique)
    return Verdict(True, kind, None, unique[0], reason, grants_used=unique)


def _read_only(kind: str, reading: str, what: str) -> Verdict:
    return _denied(
        kind,
        None,
        "read_only",
        f"{what} is not allowed while reading schema '{reading}' (cross_tenant_reads is read-only)",
    )


def _extra_function(call: Call, policy: Policy) -> bool:
    """Whether the project's settings allow ``call`` (GUARD_EXTRA_FUNCTIONS, extra schemas)."""
    if call.schema is None:
        return call.name in policy.extra_functions
    if call.schema in policy.extra_schemas:
        return True
    if f"{call.schema}.{call.name}" in policy.extra_functions:
        return True
    return call.schema == "public" and call.name in policy.extra_functions


def _search_path_ok(path: tuple[str, ...], policy: Policy) -> bool:
    """The ``SET search_path`` django-tenants sends for the run's schema (or the read one).

    django-tenants sends ``own[, public][, *PG_EXTRA_SEARCH_PATHS]``; the public schema's own
    path is ``public[, *extra]``.
    """
    extra = policy.extra_schemas
    for schema in (policy.schema, policy.readable_schema):
        if schema is None:
            continue
        for candidate in ((schema,), (schema, "public")):
            if path == candidate or (extra and path == (*candidate, *extra)):
                return True
    return False
