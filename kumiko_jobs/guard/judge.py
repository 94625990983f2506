"""Decide whether a tenant run may execute a SQL statement.

Pure on purpose: no Django, no database, so the rules can be unit-tested and reasoned about in
isolation. The caller (``guard.wrapper.GuardWrapper``) builds a :class:`Policy` for the current
call site and asks :func:`classify` about every statement.

The analysis is split in two. :func:`parse.statement_shape` reads PostgreSQL's own parse tree
of the text the server will receive and is memoised by (text, parameters), because the ORM sends
the same placeholder-bearing text over and over; :func:`classify` then applies the policy to that
shape, which costs a few attribute lookups. docs/guard.md explains every rule. This module owns
that second half (the rules; their vocabulary, the policy, the verdict and the ``Rule`` names,
is ``guard.verdict``'s), so the rules read in one place. :func:`classify_switch` asks the same
rules about a connection django-tenants has switched to another schema, from the schema itself
rather than from SQL text written only to be parsed back.

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

from functools import lru_cache

from ..core.grants import Grant
from .owned_tables import never_named, operators_public_copies
from .parse import search_path_shape, statement_shape
from .shape import INFORMATION_SCHEMA, Shape, Write
from .verdict import Policy, Rule, Verdict, allowed, allowed_with, denied

__all__ = ["Grant", "Policy", "Rule", "Verdict", "classify", "classify_switch"]


_PERSONAL_DATA_VERBS = frozenset({"insert", "update", "merge"})


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
            and policy.operator_records.isdisjoint(shape.relations)
        ):
            return allowed(shape.kind)
    return _judge(shape, policy)


def classify_switch(
    sql: str, schema: str, policy: Policy, *, parameters: bool, public_schema: str
) -> Verdict:
    """Whether ``sql`` may run on a connection django-tenants points at ``schema``, another one
    than the run's (or the read one); allowed, the grants the switch itself relied on.

    The switch is judged as the ``SET search_path`` django-tenants sends for it, which the
    guard does not see for server-side cursors (``QuerySet.iterator()``: a raw psycopg cursor),
    asked of the judge directly (``parse.search_path_shape``), not as generated SQL text. As the
    schema is known, only plain reads may follow when it is another tenant's: unqualified names
    mean that tenant, and no grant allows writing outside the run's schema.
    """
    switched = _judge(search_path_shape((schema,)), policy)
    if not switched.allowed or schema == public_schema:
        return switched
    reading = classify(sql, _reading_policy(policy, schema), parameters=parameters)
    if not reading.allowed:
        return denied(
            reading.kind,
            None,
            Rule.CROSS_SCHEMA,
            f"the connection is switched to schema '{schema}' (django-tenants): a tenant "
            f"run may only read there, never write or lock rows outside its own schema",
        )
    return switched


@lru_cache(maxsize=64)
def _reading_policy(policy: Policy, schema: str) -> Policy:
    """``policy`` as it reads ``schema`` inside ``cross_tenant_reads`` (and nothing else)."""
    return Policy(
        schema=policy.schema,
        shared_tables=policy.shared_tables,
        active_grants=frozenset({Grant.CROSS_TENANT_READS}),
        readable_schema=schema,
        operator_tables=policy.operator_tables,
        kumiko_tables=policy.kumiko_tables,
        operator_records=policy.operator_records,
        public_schema=policy.public_schema,
        extra_functions=policy.extra_functions,
        extra_schemas=policy.extra_schemas,
    )


def _judge(shape: Shape, policy: Policy) -> Verdict:
    """The rules, in the order that makes the answer the most useful one: what is settled for
    the statement as a whole, then each write, the schemas it names and the calls it makes."""
    settled = _whole_statement(shape, policy) or _no_grant_allows(shape, policy)
    if settled is not None:
        return settled
    used: list[Grant] = []
    # Grant denials wait until every write was checked, so that a hard denial (which no grant
    # can fix) wins over asking for a grant that would not suffice anyway.
    hard, missing = _judge_writes(shape, policy, used)
    if hard is None:
        hard = _judge_schemas(shape, policy, used)
    if hard is not None:
        return hard
    if missing is not None:
        return missing
    if policy.readable_schema is not None:
        used.append(Grant.CROSS_TENANT_READS)  # unqualified names now mean the other tenant
    calls = [call for call in shape.calls if not policy.trusts(call)]
    if calls:
        if Grant.UNSAFE_RAW not in policy.active_grants:
            names = ", ".join(f"{call}()" for call in calls)
            return denied(
                "call_function",
                Grant.UNSAFE_RAW,
                Rule.UNVERIFIABLE,
                f"calling {names} needs the unsafe_raw grant (functions outside the guard's "
                f"allowlist; a function the project trusts can be added to "
                f"KUMIKO_JOBS['GUARD_EXTRA_FUNCTIONS'])",
            )
        used.append(Grant.UNSAFE_RAW)
    return allowed_with(shape.kind, tuple(used))


def _whole_statement(shape: Shape, policy: Policy) -> Verdict | None:
    """What settles the statement before its parts are looked at: kumiko's own tables, the
    search path django-tenants sets, reading the public schema, and what cannot be verified."""
    kind = shape.kind
    reading = policy.readable_schema
    never = never_named(shape, policy)
    if never is not None:
        # Before the unverifiable class: unsafe_raw does not open them either (COPY, LOCK).
        return never
    if shape.search_path is not None and policy.own_search_path(shape.search_path):
        return allowed(kind)
    public = policy.public_schema
    if reading == public and policy.schema != public:
        return _reading_public(kind)
    if not shape.unverifiable:
        return None
    if reading is not None:
        return _read_only(kind, reading, shape.unverifiable)
    if Grant.UNSAFE_RAW not in policy.active_grants:
        return denied(
            kind,
            Grant.UNSAFE_RAW,
            Rule.UNVERIFIABLE,
            f"{shape.unverifiable}; needs the unsafe_raw grant",
        )
    return _judge_unsafe(shape, policy)


def _judge_writes(
    shape: Shape, policy: Policy, used: list[Grant]
) -> tuple[Verdict | None, Verdict | None]:
    """Each write and row lock: (a denial no grant can fix, the first grant missing); the
    grants the writes rely on are added to ``used``."""
    kind = shape.kind
    reading = policy.readable_schema
    missing: Verdict | None = None
    for write in shape.writes:
        if reading is not None:
            return _read_only(kind, reading, f"{write.verb.upper()} on '{write.table}'"), None
        shared = _shared(write, policy)
        if shared is None:
            return denied(
                kind,
                None,
                Rule.CROSS_SCHEMA,
                f"{write.verb.upper()} on '{write.schema}.{write.table}': a tenant run never "
                f"writes outside its own schema",
            ), None
        personal = _personal_data(kind, write, policy)
        if personal is not None:
            return personal, None
        if not shared:
            continue
        if write.table in policy.protected_tables:
            return denied(
                kind,
                None,
                Rule.PROTECTED,
                f"{write.verb.upper()} on '{write.table}': the job history and the tenant "
                f"registry are never written by a tenant run, whatever its grants",
            ), None
        if Grant.GLOBAL_WRITES in policy.active_grants:
            used.append(Grant.GLOBAL_WRITES)
        elif missing is None:
            name = write.table if write.schema is None else f"{write.schema}.{write.table}"
            missing = denied(
                kind,
                Grant.GLOBAL_WRITES,
                Rule.SHARED_WRITE,
                f"{write.verb.upper()} on shared table '{name}' needs the global_writes grant",
            )
    if shape.locks and reading is not None:
        return _read_only(kind, reading, "row locks (FOR UPDATE/SHARE)"), None
    return None, missing


def _shared(write: Write, policy: Policy) -> bool | None:
    """Whether ``write`` goes to a shared table; None: to another tenant's schema."""
    if write.schema is None or write.schema == policy.schema:
        return write.schema is None and write.table in policy.shared_tables
    if write.schema == policy.public_schema or write.schema in policy.extra_schemas:
        return True
    return None


def _personal_data(kind: str, write: Write, policy: Policy) -> Verdict | None:
    """A write of personal data by a run of anonymous origin without public intake."""
    if not policy.deny_personal_data_writes or write.verb not in _PERSONAL_DATA_VERBS:
        return None
    personal = policy.personal_data_columns.get(write.table)
    if personal and (write.columns is None or not personal.isdisjoint(write.columns)):
        return denied(
            kind,
            None,
            Rule.PUBLIC_INTAKE_REQUIRED,
            f"{write.verb.upper()} writes personal data to '{write.table}' but the run's "
            f"origin is anonymous without public intake",
        )
    return None


def _judge_schemas(shape: Shape, policy: Policy, used: list[Grant]) -> Verdict | None:
    """The schemas the statement names: the run's own and the shared ones pass; another
    tenant's only read, inside ``cross_tenant_reads`` for that tenant."""
    for schema in sorted(shape.schemas):
        if (
            schema == policy.schema
            or schema == policy.public_schema
            or schema == INFORMATION_SCHEMA
            or schema in policy.extra_schemas
        ):
            continue
        if shape.writes or shape.locks:
            return denied(
                shape.kind,
                None,
                Rule.CROSS_SCHEMA,
                f"a statement that writes or locks rows cannot also read schema '{schema}'; "
                f"read it first inside cross_tenant_reads",
            )
        if schema != policy.readable_schema:
            # Holding cross_tenant_reads for one tenant must not open any other schema.
            return denied(
                shape.kind,
                Grant.CROSS_TENANT_READS,
                Rule.CROSS_SCHEMA,
                f"reference to schema '{schema}' needs the cross_tenant_reads grant for it",
            )
        used.append(Grant.CROSS_TENANT_READS)
    return None


def _no_grant_allows(shape: Shape, policy: Policy) -> Verdict | None:
    """What no grant of a tenant run allows, whatever else the statement does: kumiko's lock
    keys, catalog values, the operators' copies in public."""
    kind = shape.kind
    if shape.forbidden:
        return denied(kind, None, Rule.PROTECTED, shape.forbidden + "; no grant allows it")
    if shape.forbidden_catalogs:
        names = ", ".join(shape.forbidden_catalogs)
        return denied(
            kind,
            None,
            Rule.CATALOG,
            f"reading {names} of the catalogs: they hold values of every tenant or "
            f"session (statistics, row counts, sizes, the text of functions and views, "
            f"activity, sequences, locks, credentials), which no grant of a tenant run covers; "
            f"name only the columns that describe objects, or read them from a system job",
        )
    return operators_public_copies(shape, policy)


def _reading_public(kind: str) -> Verdict:
    """cross_tenant_reads of the public tenant: its unqualified names would be the operators'
    copies (sessions, users); its shared tables need no grant to be read."""
    return denied(
        kind,
        None,
        Rule.OPERATORS,
        "cross_tenant_reads of the public schema: it is no tenant; its unqualified names are "
        "the operators' own tables (sessions, users), and its shared tables need no grant "
        "to be read",
    )


def _judge_unsafe(shape: Shape, policy: Policy) -> Verdict:
    used = [Grant.UNSAFE_RAW]
    for number, part in enumerate(shape.parts, 1):
        verdict = _judge(part, policy)
        if not verdict.allowed:
            assert verdict.rule is not None  # a denial always names its rule
            return denied(
                shape.kind,
                verdict.grant_needed,
                verdict.rule,
                f"statement {number}: {verdict.reason}",
            )
        used.extend(verdict.grants_used)
    return allowed_with(shape.kind, tuple(used))


def _read_only(kind: str, reading: str, what: str) -> Verdict:
    return denied(
        kind,
        None,
        Rule.READ_ONLY,
        f"{what} is not allowed while reading schema '{reading}' (cross_tenant_reads is read-only)",
    )
