"""What a SQL statement does, as the guard sees it: the vocabulary between parsing and judging.

A :class:`Shape` says which relations a statement reads and writes (with their schemas), which
functions outside the allowlist it calls, whether it locks rows or changes the search path or
the transaction; ``guard.parse`` builds it from PostgreSQL's own parse tree and ``guard.judge``
applies a policy to it. Kept apart from both so that the judge depends on this small, pure
vocabulary and never on pglast, and the walk over the tree never on the policy.

Pure: no Django, no database.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CATALOG", "INFORMATION_SCHEMA", "Call", "Shape", "Unverifiable", "Write"]

CATALOG = "pg_catalog"
INFORMATION_SCHEMA = "information_schema"


@dataclass(frozen=True, slots=True)
class Write:
    """A relation a statement changes (or a sequence ``nextval``/``setval`` advances).

    The judge decides from ``schema`` whether the write stays in the tenant, hits a shared
    table or crosses into another schema, and from ``columns`` whether it stores personal data.
    """

    verb: str
    schema: str | None  # None: unqualified, resolved through search_path
    table: str
    columns: frozenset[str] | None  # None: unknown, so assume every column


@dataclass(frozen=True, slots=True)
class Call:
    """A function call the built-in allowlist does not cover."""

    schema: str | None
    name: str

    def __str__(self) -> str:
        return self.name if self.schema is None else f"{self.schema}.{self.name}"


@dataclass(frozen=True, slots=True)
class Shape:
    """What a statement does, independent of any policy."""

    kind: str
    unverifiable: str = ""  # non-empty: why the statement as a whole cannot be checked
    writes: tuple[Write, ...] = ()
    schemas: frozenset[str] = frozenset()  # schemas of referenced objects (not pg_catalog)
    calls: tuple[Call, ...] = ()  # calls outside the built-in allowlist
    locks: bool = False
    search_path: tuple[str, ...] | None = None
    parts: tuple[Shape, ...] = ()
    # Tables written through unqualified names; None if some write target is schema-qualified.
    # Lets classify() settle the common tenant-table write with one set operation.
    local_write_tables: frozenset[str] | None = frozenset()
    # Catalog relations read that are not on the readable list, and readable ones' columns
    # holding tenants' values (reltuples, prosrc, ...): denied whatever the grants.
    forbidden_catalogs: tuple[str, ...] = ()
    # Relations read as <schema>.<name>: the judge refuses the operators' own tables in the
    # public schema (PUBLIC_SCHEMA_NAME, which the policy names).
    qualified_relations: frozenset[tuple[str, str]] = frozenset()
    # Every relation the statement names (read, written, locked, copied; in any schema, and
    # inside utility statements the guard does not judge otherwise), by its name: the judge
    # refuses kumiko's own tables to tenant runs whatever the grants.
    relations: frozenset[str] = frozenset()
    # Only for a statement that needs unsafe_raw (unverifiable, or calling a function outside
    # the allowlist, which may run SQL text): the words of its string literals, lower-cased, so
    # that a name written in one (``query_to_xml('... kumiko_jobs_jobrun')``, a ``DO`` body)
    # is refused like a name in the tree. A name built at run time is not seen.
    literal_words: frozenset[str] = frozenset()
    # Why a detail makes the statement unsafe whatever the grants (kumiko's lock keys).
    forbidden: str = ""
    # BEGIN, COMMIT, ROLLBACK (not TO SAVEPOINT), two-phase commit, or a part that is: the
    # transaction itself changes. An atomic job's guard refuses these (steps/atomic.py).
    ends_transaction: bool = False
    # A transaction statement that may roll back a SET made in the open transaction (ROLLBACK,
    # ROLLBACK TO SAVEPOINT, COMMIT of a failed transaction), or a part that is: django-tenants'
    # SET search_path among them, which Django never sees undone (guard.wrapper resyncs it).
    undoes_sets: bool = False

    @property
    def plain(self) -> bool:
        """No schema, call, catalog read or part to judge: the fast path checks only the writes."""
        return not (
            self.unverifiable
            or self.schemas
            or self.calls
            or self.parts
            or self.forbidden_catalogs
            or self.forbidden
        )


class Unverifiable(Exception):
    """A detail of the statement cannot be judged; the whole statement needs unsafe_raw."""
