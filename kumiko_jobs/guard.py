"""Classify SQL statements of a tenant run and decide whether the run may execute them.

Pure on purpose: no Django, no database, so the rules can be unit-tested and reasoned about in
isolation. The caller (``steps.db_guard``) builds a :class:`Policy` for the current call site and
asks :func:`classify` about every statement.

The analysis is split in two. :func:`statement_shape` looks only at the SQL text and is memoised,
because the ORM sends the same placeholder-bearing text over and over; :func:`classify` then
applies the policy to that shape, which costs a few attribute lookups.

Decisions (see ARCHITECTURE.md, "DB guard model"):

* ``pg_catalog`` and ``information_schema`` may be read freely: Django introspection uses them
  and they hold no tenant rows. Writes there, like writes to any schema other than the run's own
  schema or ``public``, are never allowed (``grant_needed`` is None). Other ``pg_*`` schemas
  (``pg_toast``, ``pg_temp``) are treated as foreign schemas.
* A write into another tenant's schema has no grant that allows it: the way to change another
  tenant's data is a job running in that tenant. The same holds for a statement that writes (or
  locks rows with ``FOR UPDATE``/``FOR SHARE``) and at the same time reads another schema.
* While ``readable_schema`` is set the runner has pointed ``search_path`` at the other tenant, so
  unqualified names mean that tenant: every write, row lock and unverifiable statement is denied
  (rule ``read_only``) and every read reports ``cross_tenant_reads`` as used.
* ``unsafe_raw`` covers only the "cannot verify" class. A statement that is otherwise parseable
  (e.g. a SELECT that calls ``set_config``) is still checked for shared writes and foreign schemas,
  so one grant never silently implies another. DDL, COPY, DO and friends are not inspected
  further under ``unsafe_raw``. Multiple statements are: each one is judged on its own, but the
  effect of one on the next (e.g. a ``SET search_path`` that changes what later unqualified names
  mean) cannot be followed; that residual risk is what ``unsafe_raw`` accepts.
* ``EXPLAIN`` is judged as the statement it explains, since ``EXPLAIN ANALYZE`` executes it.
* ``SHOW``, ``SET CONSTRAINTS`` and ``SET TRANSACTION`` are allowed: they read settings or only
  affect the current transaction. ``SET SESSION``/``SET LOCAL``, ``RESET``, ``DISCARD``, ``LOCK``,
  ``LISTEN``/``NOTIFY`` (channels are database-wide), ``VACUUM``/``ANALYZE`` and cursors declared
  by hand are unverifiable.
* ``SELECT ... INTO`` creates a table, so it is treated as DDL. An empty statement (only
  comments) is allowed: it does nothing.
* Not seen by the guard: object names inside string literals (``nextval('t2.seq')``,
  ``'t2.x'::regclass``), functions that run SQL text other than the small denylist below, and
  statements sent over raw psycopg connections. Strings are assumed to be lexed with
  ``standard_conforming_strings = on`` (the default; changing it needs a denied SET).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from functools import lru_cache
from types import MappingProxyType


class Grant(StrEnum):
    UNSAFE_RAW = "unsafe_raw"
    GLOBAL_WRITES = "global_writes"
    CROSS_TENANT_READS = "cross_tenant_reads"
    SYSTEM_IDENTITY = "system_identity"


_NO_PERSONAL_DATA: Mapping[str, frozenset[str]] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Policy:
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

    def __post_init__(self) -> None:
        # classify() relies on this, so an inconsistent policy fails loudly at construction.
        if self.readable_schema is not None and (
            Grant.CROSS_TENANT_READS not in self.active_grants
        ):
            raise ValueError("readable_schema requires the cross_tenant_reads grant")


@dataclass(frozen=True, slots=True)
class Verdict:
    allowed: bool
    kind: str
    grant_needed: Grant | None
    grant_used: Grant | None
    reason: str
    rule: str = ""
    # Every grant the statement relied on; grant_used is the first of them.
    grants_used: tuple[Grant, ...] = ()


@dataclass(frozen=True, slots=True)
class Write:
    verb: str
    schema: str | None  # None: unqualified, resolved through search_path
    table: str
    columns: frozenset[str] | None  # None: unknown, so assume every column


@dataclass(frozen=True, slots=True)
class Shape:
    """What a statement does, independent of any policy."""

    kind: str
    unverifiable: str = ""  # non-empty: why the statement as a whole cannot be checked
    writes: tuple[Write, ...] = ()
    schemas: frozenset[str] = frozenset()  # schema qualifiers of referenced objects
    calls: tuple[str, ...] = ()  # denylisted functions called
    locks: bool = False
    search_path: tuple[str, ...] | None = None
    parts: tuple[Shape, ...] = ()
    # Tables written through unqualified names; None if some write target is schema-qualified.
    # Lets classify() settle the common tenant-table write with one set operation.
    local_write_tables: frozenset[str] | None = frozenset()

    @property
    def plain(self) -> bool:
        return not (self.unverifiable or self.schemas or self.calls or self.parts)


# --- tokeniser ---------------------------------------------------------------------------------

_W, _Q, _S, _N, _P, _O = "w", "q", "s", "n", "p", "o"  # word, quoted ident, string, number...
Token = tuple[str, str]

_LEX = re.compile(
    r"""
      (?P<ws>\s+)
    | (?P<line>--[^\n]*)
    | (?P<block>/\*)
    | (?P<str>[eE]'(?:[^'\\]|\\.|'')*'|(?:[uU]&|[bBxXnN])?'(?:[^']|'')*')
    | (?P<uident>[uU]&")
    | (?P<ident>"(?:[^"]|"")+")
    | (?P<dollar>\$(?:[^\W\d]\w*)?\$)
    | (?P<param>\$\d+|%(?:\([^)]*\))?[sbt])
    | (?P<word>[^\W\d][\w$]*)
    | (?P<num>0[xXoObB][0-9a-fA-F_]+|(?:\d[\d_]*(?:\.[\d_]*)?|\.\d[\d_]*)(?:[eE][+-]?\d+)?)
    | (?P<op>::|.)
    """,
    re.VERBOSE | re.DOTALL,
)
_COMMENT_EDGE = re.compile(r"/\*|\*/")
# PostgreSQL folds only ASCII letters in UTF-8 databases; str.lower() would fold more.
_ASCII_FOLD = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
_KIND_OF_GROUP = {"str": _S, "num": _N, "param": _P}


class _Unparseable(Exception):
    pass


def _tokenise(sql: str) -> list[Token]:
    tokens: list[Token] = []
    pos, n = 0, len(sql)
    while pos < n:
        m = _LEX.match(sql, pos)
        assert m is not None  # the catch-all "op" branch matches any character
        group, text, end = m.lastgroup, m.group(), m.end()
        if group == "word":
            tokens.append((_W, text.lower() if text.isascii() else text.translate(_ASCII_FOLD)))
        elif group == "ident":
            tokens.append((_Q, text[1:-1].replace('""', '"')))
        elif group == "op":
            if text in ("'", '"', "$"):
                raise _Unparseable(f"unterminated or empty {text}...{text}")
            tokens.append((_O, text))
        elif group == "block":
            end = _block_comment_end(sql, pos)
        elif group == "dollar":
            close = sql.find(text, end)
            if close < 0:
                raise _Unparseable("unterminated dollar-quoted string")
            end = close + len(text)
            tokens.append((_S, sql[pos:end]))
        elif group == "uident":
            # U&"..." can spell any name through escapes; not worth decoding for ORM traffic.
            raise _Unparseable('U&"..." identifiers are not supported')
        elif group in _KIND_OF_GROUP:
            tokens.append((_KIND_OF_GROUP[group], text))
        pos = end
    return tokens


def _block_comment_end(sql: str, start: int) -> int:
    depth = 0  # PostgreSQL block comments nest, unlike C's
    for edge in _COMMENT_EDGE.finditer(sql, start):
        depth += 1 if edge.group() == "/*" else -1
        if depth == 0:
            return edge.end()
    raise _Unparseable("unterminated block comment")


# --- structural analysis -----------------------------------------------------------------------

_QUERY_HEADS = frozenset(
    {"select", "with", "values", "table", "insert", "update", "delete", "merge"}
)
_WRITE_HEADS = frozenset({"insert", "update", "delete", "merge"})
# Clause keywords that cannot occur inside a join condition at the same parenthesis depth, so
# they safely end a FROM list. Ending too late only risks false denials, too early a miss.
_FROM_LIST_END = frozenset(
    {
        "where", "group", "having", "order", "limit", "offset", "fetch", "for", "window",
        "union", "intersect", "except", "returning", "set",
    }
)  # fmt: skip
# Functions that change session state, reach outside the database, or run SQL given as text.
_DANGEROUS_CALLS = frozenset(
    {
        "set_config", "pg_read_file", "pg_read_binary_file", "pg_ls_dir", "pg_stat_file",
        "pg_file_write", "pg_file_unlink", "pg_file_rename", "loread", "lowrite",
        "query_to_xml", "query_to_xmlschema", "query_to_xml_and_xmlschema", "cursor_to_xml",
        "table_to_xml", "table_to_xml_and_xmlschema", "schema_to_xml",
        "schema_to_xml_and_xmlschema", "database_to_xml", "database_to_xml_and_xmlschema",
        "pg_terminate_backend", "pg_cancel_backend", "pg_reload_conf",
    }
)  # fmt: skip
_DANGEROUS_PREFIXES = ("dblink", "lo_")
_TRANSACTION = frozenset({"begin", "commit", "end", "rollback", "abort", "savepoint", "release"})
_OTHER_KINDS = {
    **dict.fromkeys(
        ("create", "alter", "drop", "grant", "revoke", "comment", "refresh", "reindex",
         "cluster", "security", "import", "reassign", "load"),
        "ddl",
    ),
    **dict.fromkeys(("vacuum", "analyze", "analyse", "checkpoint"), "maintenance"),
    **dict.fromkeys(("execute", "prepare", "deallocate"), "prepared_statement"),
    **dict.fromkeys(("listen", "notify", "unlisten"), "notify"),
    **dict.fromkeys(("declare", "fetch", "move", "close"), "cursor"),
    "copy": "copy", "do": "do", "call": "call", "lock": "lock", "discard": "discard",
    "reset": "reset",
}  # fmt: skip
_OPEN = (_O, "(")
_CLOSE = (_O, ")")
_COMMA = (_O, ",")
_DOT = (_O, ".")


@lru_cache(maxsize=4096)
def statement_shape(sql: str) -> Shape:
    try:
        tokens = _tokenise(sql)
    except _Unparseable as exc:
        return Shape("unparseable", unverifiable=f"unparseable SQL: {exc}")
    statements: list[list[Token]] = [[]]
    for tok in tokens:
        if tok == (_O, ";"):
            statements.append([])
        else:
            statements[-1].append(tok)
    statements = [s for s in statements if s]
    if not statements:
        return Shape("empty")
    if len(statements) > 1:
        return Shape(
            "multi_statement",
            unverifiable=f"{len(statements)} statements in one execute",
            parts=tuple(_analyse(s) for s in statements),
        )
    return _analyse(statements[0])


def _analyse(tokens: list[Token]) -> Shape:
    try:
        return _analyse_or_raise(tokens)
    except _Unparseable as exc:
        return Shape("unparseable", unverifiable=f"unparseable SQL: {exc}")


def _analyse_or_raise(tokens: list[Token]) -> Shape:
    head = next((tok for tok in tokens if tok != _OPEN), ("", ""))
    if head[0] != _W:
        raise _Unparseable("statement does not start with a keyword")
    first = head[1]
    if first == "explain":
        return _analyse_or_raise(_strip_explain(tokens))
    if first in _QUERY_HEADS:
        return _Scanner(tokens).run()
    if first == "truncate":
        writes = _truncate_targets(tokens)
        return Shape("truncate", writes=writes, local_write_tables=_local_write_tables(writes))
    if first == "set":
        return _analyse_set(tokens)
    if first == "show":
        return Shape("show")
    if first in _TRANSACTION or (first == "start" and tokens[1:2] == [(_W, "transaction")]):
        if (_W, "prepared") in tokens:
            return Shape("transaction", unverifiable="two-phase commit")
        return Shape("transaction")
    kind = _OTHER_KINDS.get(first, "unknown")
    return Shape(kind, unverifiable=f"{first.upper()} statements cannot be verified")


def _strip_explain(tokens: list[Token]) -> list[Token]:
    i = 1
    if tokens[i : i + 1] == [_OPEN]:
        i = _matching_close(tokens, i) + 1
    while i < len(tokens) and tokens[i] in ((_W, "analyze"), (_W, "analyse"), (_W, "verbose")):
        i += 1
    if i >= len(tokens):
        raise _Unparseable("EXPLAIN without a statement")
    return tokens[i:]


def _matching_close(tokens: list[Token], i: int) -> int:
    depth = 0
    for j in range(i, len(tokens)):
        if tokens[j] == _OPEN:
            depth += 1
        elif tokens[j] == _CLOSE:
            depth -= 1
            if depth == 0:
                return j
    raise _Unparseable("unbalanced parentheses")


def _local_write_tables(writes: Sequence[Write]) -> frozenset[str] | None:
    if any(w.schema is not None for w in writes):
        return None
    return frozenset(w.table for w in writes)


def _truncate_targets(tokens: list[Token]) -> tuple[Write, ...]:
    writes: list[Write] = []
    i, n = 1, len(tokens)
    if tokens[i : i + 1] == [(_W, "table")]:
        i += 1
    while i < n:
        if tokens[i] == (_W, "only"):
            i += 1
        if i >= n or tokens[i][0] not in (_W, _Q):
            raise _Unparseable("TRUNCATE without a table name")
        parts, i = _dotted_name(tokens, i)
        writes.append(Write("truncate", parts[-2] if len(parts) > 1 else None, parts[-1], None))
        if i < n and tokens[i] == (_O, "*"):
            i += 1
        if i < n and tokens[i] == _COMMA:
            i += 1
        else:
            break
    return tuple(writes)


def _analyse_set(tokens: list[Token]) -> Shape:
    target = tokens[1] if len(tokens) > 1 else ("", "")
    if target in ((_W, "constraints"), (_W, "transaction")):
        return Shape("transaction")
    if target != (_W, "search_path"):
        return Shape("set", unverifiable="SET of a session setting cannot be verified")
    refused = Shape("set_search_path", unverifiable="SET search_path to an unverifiable value")
    if len(tokens) < 4 or tokens[2] not in ((_O, "="), (_W, "to")):
        return refused
    names: list[str] = []
    for pos, (kind, value) in enumerate(tokens[3:]):
        if pos % 2:
            if (kind, value) != _COMMA:
                return refused
        elif kind == _Q or (kind == _W and value != "default"):
            names.append(value)
        elif kind == _S and value.startswith("'"):
            # A string element keeps its case, exactly like a quoted identifier.
            names.append(value[1:-1].replace("''", "'"))
        else:
            return refused
    if len(tokens) % 2:  # a trailing comma
        return refused
    return Shape(
        "set_search_path",
        unverifiable=f"SET search_path to {', '.join(names)}: not the run's schema(s)",
        search_path=tuple(names),
    )


def _dotted_name(tokens: list[Token], i: int) -> tuple[list[str], int]:
    parts = [tokens[i][1]]
    i += 1
    n = len(tokens)
    while i + 1 < n and tokens[i] == _DOT:
        nxt = tokens[i + 1]
        if nxt[0] not in (_W, _Q) and nxt != (_O, "*"):
            break
        parts.append(nxt[1])
        i += 2
    return parts, i


class _Frame:
    __slots__ = ("closer", "from_list", "subquery")

    def __init__(self, subquery: bool, closer: str) -> None:
        self.subquery = subquery  # a "(" opening SELECT/WITH/...: FROM there lists tables
        self.closer = closer
        self.from_list = False  # after FROM/JOIN/USING, where a comma introduces a table


class _Scanner:
    """One pass over a SELECT/INSERT/UPDATE/DELETE/MERGE (optionally with CTEs)."""

    def __init__(self, tokens: list[Token]) -> None:
        self.tokens = tokens
        self.writes: list[Write] = []
        self.schemas: set[str] = set()
        self.calls: list[str] = []
        self.locks = False
        self.unverifiable = ""
        self.main_kind = ""
        self.insert_index = -1  # the INSERT that an ON CONFLICT DO UPDATE SET belongs to

    def run(self) -> Shape:
        tokens, n = self.tokens, len(self.tokens)
        frames = [_Frame(subquery=True, closer="")]
        i = 0
        while i < n:
            kind, value = tokens[i]
            prev = tokens[i - 1] if i else None
            frame = frames[-1]
            if kind == _O:
                if value == "(" or value == "[":
                    nxt = tokens[i + 1] if i + 1 < n else ("", "")
                    subquery = value == "(" and nxt[0] == _W and nxt[1] in _QUERY_HEADS
                    frames.append(_Frame(subquery, ")" if value == "(" else "]"))
                elif value == ")" or value == "]":
                    if len(frames) == 1 or frame.closer != value:
                        raise _Unparseable("unbalanced brackets")
                    frames.pop()
                elif value == "," and frame.from_list:
                    i = self._table_ref(i + 1)
                    continue
                i += 1
                continue
            if kind == _W:
                at_head = prev is None or prev in (_OPEN, _CLOSE)
                if at_head and len(frames) == 1 and self.main_kind in ("", "with"):
                    self.main_kind = value if value in _QUERY_HEADS else self.main_kind
                if at_head and value in _WRITE_HEADS:
                    i = self._write_head(i, value)
                    continue
                if value in ("from", "join", "using", "table"):
                    # FROM inside EXTRACT(...)/substring(...)/TRIM(...) is not a table list.
                    if value != "from" or (frame.subquery and not _is_distinct_from(tokens, i)):
                        frame.from_list = True
                        i = self._table_ref(i + 1)
                        continue
                elif value in _FROM_LIST_END:
                    frame.from_list = False
                    if value == "for" and i + 1 < n and tokens[i + 1][1] in _LOCK_WORDS:
                        self.locks = True
                    elif value == "set" and tokens[i - 2 : i] == [(_W, "do"), (_W, "update")]:
                        self._add_conflict_columns(i + 1)
                    i += 1
                    continue
                elif value == "into":
                    self.unverifiable = "SELECT INTO creates a table"
                    i += 1
                    continue
            if kind in (_W, _Q):
                i = self._name_in_expression(i, prev)
                continue
            i += 1
        if len(frames) != 1:
            raise _Unparseable("unbalanced brackets")
        return self._shape()

    def _shape(self) -> Shape:
        kind = {"table": "select", "with": "select", "": "select"}.get(
            self.main_kind, self.main_kind
        )
        if kind in ("select", "values") and self.writes:
            kind = self.writes[0].verb  # a data-modifying CTE makes the statement a write
        if self.unverifiable:
            kind = "ddl"
        return Shape(
            kind,
            unverifiable=self.unverifiable,
            writes=tuple(self.writes),
            local_write_tables=_local_write_tables(self.writes),
            schemas=frozenset(self.schemas),
            calls=tuple(self.calls),
            locks=self.locks,
        )

    def _name_in_expression(self, i: int, prev: Token | None) -> int:
        tokens = self.tokens
        parts, j = _dotted_name(tokens, i)
        if j < len(tokens) and tokens[j] == _OPEN:
            self._call(parts)
        elif len(parts) >= 3:
            self.schemas.add(parts[-3])  # schema.table.column
        elif len(parts) == 2 and prev in ((_O, "::"), (_W, "as")):
            self.schemas.add(parts[0])  # schema-qualified type in a cast
        # Two parts elsewhere are relation.column: only FROM-like positions name tables.
        return j

    def _call(self, parts: list[str]) -> None:
        name = parts[-1]
        if name in _DANGEROUS_CALLS or name.startswith(_DANGEROUS_PREFIXES):
            self.calls.append(name)
        if len(parts) >= 2:
            self.schemas.add(parts[-2])

    def _table_ref(self, i: int) -> int:
        tokens, n = self.tokens, len(self.tokens)
        while i < n and tokens[i] in ((_W, "only"), (_W, "lateral")):
            i += 1
        if i >= n or tokens[i][0] not in (_W, _Q):
            return i  # a subquery, a join's USING (...) column list, or nothing
        parts, j = _dotted_name(tokens, i)
        if j < n and tokens[j] == _OPEN:
            self._call(parts)  # a set-returning function such as unnest(...)
        elif len(parts) >= 2:
            self.schemas.add(parts[-2])
        return j

    def _write_head(self, i: int, verb: str) -> int:
        tokens, n = self.tokens, len(self.tokens)
        j = i + 1
        if verb in ("insert", "merge", "delete"):
            if tokens[j : j + 1] != [(_W, "from" if verb == "delete" else "into")]:
                raise _Unparseable(f"{verb.upper()} without its target")
            j += 1
        if tokens[j : j + 1] == [(_W, "only")]:
            j += 1
        if j >= n or tokens[j][0] not in (_W, _Q):
            raise _Unparseable(f"{verb.upper()} without a table name")
        parts, j = _dotted_name(tokens, j)
        columns: frozenset[str] | None = None
        if verb == "insert":
            if tokens[j : j + 1] == [(_W, "as")]:
                j += 2
            if tokens[j : j + 1] == [_OPEN]:
                close = _matching_close(tokens, j)
                columns = _column_names(tokens[j + 1 : close])
                j = close + 1
            elif tokens[j : j + 2] == [(_W, "default"), (_W, "values")]:
                columns = frozenset()
            self.insert_index = len(self.writes)
        elif verb == "update":
            set_at = _index_of(tokens, (_W, "set"), j)
            columns = _set_columns(tokens, set_at + 1)
            j = set_at + 1
        self.writes.append(Write(verb, parts[-2] if len(parts) > 1 else None, parts[-1], columns))
        return j

    def _add_conflict_columns(self, i: int) -> None:
        write = self.writes[self.insert_index]
        if write.columns is not None:
            extra = _set_columns(self.tokens, i)
            self.writes[self.insert_index] = Write(
                write.verb, write.schema, write.table, write.columns | extra
            )


_LOCK_WORDS = frozenset({"update", "share", "no", "key"})


def _is_distinct_from(tokens: list[Token], i: int) -> bool:
    return i >= 2 and tokens[i - 1] == (_W, "distinct") and tokens[i - 2][1] in ("is", "not")


def _index_of(tokens: list[Token], wanted: Token, start: int) -> int:
    try:
        return tokens.index(wanted, start)
    except ValueError:
        raise _Unparseable(f"missing {wanted[1].upper()}") from None


def _column_names(tokens: list[Token]) -> frozenset[str]:
    """First name of each comma-separated item: ``a``, ``"b"``, ``c[1]``, ``d.field``."""
    names: set[str] = set()
    depth, item_start = 0, True
    for kind, value in tokens:
        if item_start and depth == 0 and kind in (_W, _Q):
            names.add(value)
        item_start = False
        if kind == _O:
            if value in "([":
                depth += 1
            elif value in ")]":
                depth -= 1
            elif value == "," and depth == 0:
                item_start = True
    return frozenset(names)


def _set_columns(tokens: list[Token], i: int) -> frozenset[str]:
    """Columns assigned by ``SET a = ..., (b, c) = ...``, starting right after SET."""
    names: set[str] = set()
    depth, item_start = 0, True
    for kind, value in tokens[i:]:
        if depth == 0 and kind == _W and value in ("from", "where", "returning"):
            break
        if item_start:
            if kind in (_W, _Q):
                names.add(value)
            elif (kind, value) == _OPEN:
                names.update(_column_names(tokens[i + 1 : _matching_close(tokens, i)]))
        item_start = False
        if kind == _O:
            if value in "([":
                depth += 1
            elif value in ")]":
                depth -= 1
                if depth < 0:
                    break
            elif value == "," and depth == 0:
                item_start = True
        i += 1
    return frozenset(names)


# --- policy ------------------------------------------------------------------------------------

_SYSTEM_SCHEMAS = frozenset({"pg_catalog", "information_schema"})
_PERSONAL_DATA_VERBS = frozenset({"insert", "update", "merge"})


@lru_cache(maxsize=64)
def _allowed(kind: str) -> Verdict:
    return Verdict(True, kind, None, None, "allowed")


def _denied(kind: str, grant: Grant | None, rule: str, reason: str) -> Verdict:
    return Verdict(False, kind, grant, None, reason, rule)


def classify(sql: str, policy: Policy) -> Verdict:
    """Decide whether a tenant run may execute ``sql`` under ``policy``."""
    shape = statement_shape(sql)
    if shape.plain and policy.readable_schema is None and not policy.deny_personal_data_writes:
        # The hot path: ORM reads, and writes to the tenant's own tables.
        written = shape.local_write_tables
        if written is not None and policy.shared_tables.isdisjoint(written):
            return _allowed(shape.kind)
    return _judge(shape, policy)


def _judge(shape: Shape, policy: Policy) -> Verdict:
    kind = shape.kind
    grants = policy.active_grants
    reading = policy.readable_schema
    if shape.search_path is not None and _search_path_ok(shape.search_path, policy):
        return _allowed(kind)
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

    # Grant denials wait until every write was checked, so that a hard denial (which no grant
    # can fix) wins over asking for a grant that would not suffice anyway.
    missing: tuple[Grant, str, str] | None = None  # (grant, rule, reason) of the first gap
    used: list[Grant] = []
    for write in shape.writes:
        if reading is not None:
            return _read_only(kind, reading, f"{write.verb.upper()} on '{write.table}'")
        if write.schema is None or write.schema == policy.schema:
            shared = write.schema is None and write.table in policy.shared_tables
        elif write.schema == "public":
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
            name = write.table if write.schema is None else f"public.{write.table}"
            missing = (
                Grant.GLOBAL_WRITES,
                "shared_write",
                f"{write.verb.upper()} on shared table '{name}' needs the global_writes grant",
            )
    if shape.locks and reading is not None:
        return _read_only(kind, reading, "row locks (FOR UPDATE/SHARE)")
    for schema in sorted(shape.schemas):
        if schema == policy.schema or schema == "public" or schema in _SYSTEM_SCHEMAS:
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
    if shape.calls:
        if Grant.UNSAFE_RAW not in grants:
            return _denied(
                "call_function",
                Grant.UNSAFE_RAW,
                "unverifiable",
                f"calling {', '.join(shape.calls)}() needs the unsafe_raw grant",
            )
        used.append(Grant.UNSAFE_RAW)
    return _allowed_with(kind, tuple(used))


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


def _search_path_ok(path: tuple[str, ...], policy: Policy) -> bool:
    own = (policy.schema,)
    if path == own or path == (*own, "public"):
        return True
    other = policy.readable_schema
    return other is not None and path in ((other,), (other, "public"))
