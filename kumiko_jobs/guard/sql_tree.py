"""What a SQL statement does, read from PostgreSQL's own parse tree (pglast / libpg_query).

Pure: no Django, no database. :func:`statement_shape` turns the text psycopg will send into a
:class:`Shape` (relations read and written with their schemas, functions called, locks,
utility statements), independent of any policy; ``guard.classify`` applies the policy.

Why PostgreSQL's parser: a hand-written lexer disagreed with the server (``--`` comments end at
``\\r`` too; bytes >= 0x80 continue an identifier, so ``x€$$`` is no dollar quote; ``SEARCH``/
``CYCLE`` clauses, ``FROM ONLY (s.t)``, keyword aliases) and each disagreement was a way to send
``DELETE FROM <other tenant>`` past it. libpg_query is the server's lexer and grammar (of
PostgreSQL 18; older servers reject the newer syntax, see ``_NUMBER_FORMS`` for the one lexical
difference that matters), so the tree is what the server runs.

The walk is generic: every node of the tree is visited, and the node types that name objects
(``RangeVar``, ``FuncCall``, ``TypeName``, ``ColumnRef``, operators, ...) are judged wherever
they sit, so subqueries, CTEs (with ``SEARCH``/``CYCLE``), parenthesised joins, ``LATERAL``,
set operations and data-modifying CTEs need no special case.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

from pglast import parser as pg_parser
from psycopg import errors as pg_errors

# psycopg's own placeholder splitter, so the guard finds exactly the placeholders psycopg
# substitutes (its rules: %s %b %t %(name)s, %% -> %, a "%" before a newline is left alone,
# anything else after "%" is an error). Private API: tests/unit/test_guard.py pins the
# behaviour this module relies on, so a psycopg upgrade that changes it fails loudly.
from psycopg._queries import _split_query

from ..core.db import ADMISSION_LOCK_CLASS
from .allowlists import (
    ADVISORY_XACT_LOCKS,
    BUILTIN_FUNCTIONS,
    CATALOG_RELATIONS,
    READABLE_CATALOG_RELATIONS,
    REG_TYPES,
    SEQUENCE_FUNCTIONS,
)

CATALOG = "pg_catalog"
INFORMATION_SCHEMA = "information_schema"


@dataclass(frozen=True, slots=True)
class Write:
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
    # Catalog relations read that are not on the readable list: denied whatever the grants.
    forbidden_catalogs: tuple[str, ...] = ()
    # Why a detail makes the statement unsafe whatever the grants (kumiko's lock keys).
    forbidden: str = ""
    # BEGIN, COMMIT, ROLLBACK (not TO SAVEPOINT), two-phase commit, or a part that is: the
    # transaction itself changes. An atomic job's guard refuses these (steps/atomic.py).
    ends_transaction: bool = False

    @property
    def plain(self) -> bool:
        return not (
            self.unverifiable
            or self.schemas
            or self.calls
            or self.parts
            or self.forbidden_catalogs
            or self.forbidden
        )


class _Unverifiable(Exception):
    """A detail of the statement cannot be judged; the whole statement needs unsafe_raw."""


# --- placeholders: what the server receives ---------------------------------------------------


def _server_text(sql: str) -> tuple[str, list[int]]:
    """The text with psycopg's placeholders as ``$n``, and the ``n`` of each occurrence.

    This is the query psycopg sends with server-side binding; with client-side binding (Django's
    default ``ClientCursor``) each ``$n`` position receives a quoted literal instead. Either way
    the statement keeps its meaning only if every placeholder is a parameter node of the tree:
    one inside a literal, comment, dollar quote or identifier is rendered INTO that token.
    Raises ``psycopg.ProgrammingError`` for what psycopg itself refuses.
    """
    parts = _split_query(sql.encode(), "utf-8")
    if len(parts) == 1:
        return parts[0].pre.decode(), []
    chunks: list[str] = []
    numbers: list[int] = []
    named: dict[str, int] = {}
    for index, part in enumerate(parts[:-1]):
        if isinstance(part.item, str):
            number = named.setdefault(part.item, len(named) + 1)
        else:
            number = index + 1
        chunks.append(part.pre.decode())
        chunks.append(f"${number}")
        numbers.append(number)
    chunks.append(parts[-1].pre.decode())
    return "".join(chunks), numbers


# --- the walk ---------------------------------------------------------------------------------

_QUERY_STATEMENTS = {
    "SelectStmt": "select",
    "InsertStmt": "insert",
    "UpdateStmt": "update",
    "DeleteStmt": "delete",
    "MergeStmt": "merge",
}
_UTILITY_KINDS = {
    "CopyStmt": "copy",
    "DoStmt": "do",
    "CallStmt": "call",
    "LockStmt": "lock",
    "NotifyStmt": "notify",
    "ListenStmt": "notify",
    "UnlistenStmt": "notify",
    "PrepareStmt": "prepared_statement",
    "ExecuteStmt": "prepared_statement",
    "DeallocateStmt": "prepared_statement",
    "DeclareCursorStmt": "cursor",
    "FetchStmt": "cursor",
    "ClosePortalStmt": "cursor",
    "VacuumStmt": "maintenance",
    "CheckPointStmt": "maintenance",
    "DiscardStmt": "discard",
}
# Savepoints work inside the transaction (Django's nested atomic() blocks use them).
_INSIDE_TRANSACTION = frozenset(
    {"TRANS_STMT_SAVEPOINT", "TRANS_STMT_RELEASE", "TRANS_STMT_ROLLBACK_TO"}
)
_TWO_PHASE = frozenset(
    {"TRANS_STMT_PREPARE", "TRANS_STMT_COMMIT_PREPARED", "TRANS_STMT_ROLLBACK_PREPARED"}
)
# Non-decimal integers (0x1F, 0o17, 0b101) and digit separators (1_000) are PostgreSQL 16+.
# PostgreSQL 15 lexes "0x1F" as "0" followed by the column alias "x1F": a statement whose
# meaning depends on the server version is refused.
_NUMBER_FORMS = re.compile(rb"[-+\s(]*\.?[0-9][0-9.]*(?:[eE][-+]?[0-9]+)?([_xXoObB])?")


def _names(items: list[Any]) -> list[str]:
    """The strings of a name list (``[{"String": {"sval": ...}}, ...]``); "*" for ``A_Star``."""
    out: list[str] = []
    for item in items:
        string = item.get("String")
        out.append(string.get("sval", "") if string is not None else "*")
    return out


def _resolve_literal_name(text: str) -> list[str]:
    """Split a qualified name written in a string (``'t2.seq'``, ``'"T2"."x"'``) like PostgreSQL.

    Unquoted parts are folded to lower case (ASCII only, as in a UTF-8 database), quoted parts
    keep their case; whitespace around dots is ignored. Anything else is unverifiable.
    """
    parts: list[str] = []
    i, n = 0, len(text)
    while True:
        while i < n and text[i].isspace():
            i += 1
        if i < n and text[i] == '"':
            j = i + 1
            name: list[str] = []
            while True:
                k = text.find('"', j)
                if k < 0:
                    raise _Unverifiable("unterminated quoted name in a string")
                name.append(text[j:k])
                if text[k + 1 : k + 2] == '"':
                    name.append('"')
                    j = k + 2
                    continue
                i = k + 1
                break
            parts.append("".join(name))
        else:
            j = i
            while j < n and text[j] not in '."' and not text[j].isspace():
                j += 1
            if j == i:
                raise _Unverifiable(f"cannot read the name in the string {text!r}")
            parts.append(_fold(text[i:j]))
            i = j
        while i < n and text[i].isspace():
            i += 1
        if i == n:
            return parts
        if text[i] != ".":
            raise _Unverifiable(f"cannot read the name in the string {text!r}")
        i += 1


_ASCII_FOLD = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def _fold(name: str) -> str:
    return name.translate(_ASCII_FOLD)


def _string_constant(node: Any) -> str | None:
    const = node.get("A_Const") if isinstance(node, dict) else None
    if const is None or "sval" not in const:
        return None
    return str(const["sval"].get("sval", ""))


def _int_constant(node: Any) -> int | None:
    const = node.get("A_Const") if isinstance(node, dict) else None
    if const is None or "ival" not in const:
        return None
    return int(const["ival"].get("ival", 0))


_CONTAINERS = (dict, list)  # json.loads builds exactly these (type(), not isinstance: faster)


class _Walker:
    """One pass over a query statement's tree, collecting what it touches."""

    def __init__(self, source: bytes) -> None:
        self.source = source
        self.writes: list[Write] = []
        self.schemas: set[str] = set()
        self.calls: list[Call] = []
        self.locks = False
        self.unverifiable = ""
        self.forbidden = ""
        self.forbidden_catalogs: list[str] = []
        self.params: list[int] = []  # the number of every ParamRef met
        self.walked = False  # the whole statement was walked (a query statement)

    # generic descent: a node is {"TypeName": {fields}}, lists hold nodes or values
    def walk(self, value: Any) -> None:
        if type(value) is dict:
            handlers = _HANDLERS
            for key, child in value.items():
                handler = handlers.get(key)
                if handler is not None:
                    handler(self, child)
                elif type(child) in _CONTAINERS:
                    self.walk(child)
        else:
            for item in value:
                if type(item) in _CONTAINERS:
                    self.walk(item)

    def fields(self, node: dict[str, Any], *skip: str) -> None:
        for key, child in node.items():
            if type(child) in _CONTAINERS and key not in skip:
                self.walk({key: child} if key in _HANDLERS else child)

    # --- objects named in the tree --------------------------------------------------------

    def schema_ref(self, schema: str) -> None:
        if schema != CATALOG:
            self.schemas.add(schema)

    def relation(self, node: dict[str, Any]) -> None:
        schema = node.get("schemaname")
        name = node.get("relname", "")
        if schema is None:
            if name.startswith("pg_") or name in CATALOG_RELATIONS:
                # pg_catalog comes before the search path: this is a catalog relation.
                self.catalog_read(name)
        elif schema == CATALOG:
            self.catalog_read(name)
        else:
            self.schemas.add(schema)
        self.fields(node)

    def catalog_read(self, name: str) -> None:
        if name not in READABLE_CATALOG_RELATIONS:
            self.forbidden_catalogs.append(name)

    def write_target(self, verb: str, node: dict[str, Any], columns: frozenset[str] | None) -> None:
        schema = node.get("schemaname")
        name = node.get("relname", "")
        if schema is None and (name.startswith("pg_") or name in CATALOG_RELATIONS):
            schema = CATALOG  # UPDATE pg_settings ... writes the catalog, not a tenant table
        self.writes.append(Write(verb, schema, name, columns))

    def call(self, node: dict[str, Any]) -> None:
        parts = _names(node.get("funcname", []))
        name = parts[-1]
        schema = parts[-2] if len(parts) >= 2 else None
        args = node.get("args", [])
        if schema is None or schema == CATALOG:
            if name in SEQUENCE_FUNCTIONS:
                self.sequence_call(name, args)
            elif name in ADVISORY_XACT_LOCKS:
                self.advisory_lock(name, args)
            elif name not in BUILTIN_FUNCTIONS:
                self.calls.append(Call(schema, name))
        else:
            self.schemas.add(schema)
            self.calls.append(Call(schema, name))
        self.fields(node, "funcname")

    def sequence_call(self, name: str, args: list[Any]) -> None:
        first = args[0] if args else None
        literal = _string_constant(first)
        if literal is None and isinstance(first, dict) and "TypeCast" in first:
            cast = first["TypeCast"]
            if _names(cast["typeName"]["names"])[-1] == "regclass":
                literal = _string_constant(cast.get("arg"))
        if literal is None:
            raise _Unverifiable(f"{name}() of a sequence not named by a constant")
        parts = _resolve_literal_name(literal)
        if len(parts) > 3:
            raise _Unverifiable(f"{name}() of an improper name {literal!r}")
        schema = parts[-2] if len(parts) >= 2 else None
        if name == "currval":
            if schema is not None:
                self.schema_ref(schema)
        else:
            # nextval/setval change the sequence: a write, judged like one (public: shared).
            self.writes.append(Write(name, schema, parts[-1], frozenset()))

    def advisory_lock(self, name: str, args: list[Any]) -> None:
        if len(args) == 2:
            # Two int4 keys: kumiko's admission lock lives here under ADMISSION_LOCK_CLASS.
            key_class = _int_constant(args[0])
            if key_class is None:
                raise _Unverifiable(f"{name}() with two keys needs a constant first key")
            if key_class == ADMISSION_LOCK_CLASS:
                self.forbidden = f"{name}({key_class}, ...) takes kumiko's own admission lock class"
        # One bigint key: a separate key space. PostgreSQL's docs, Advisory Lock Functions
        # (https://www.postgresql.org/docs/current/functions-admin.html#FUNCTIONS-ADVISORY-LOCKS):
        # a resource is identified "either by a single 64-bit key value or two 32-bit key
        # values (note that these two key spaces do not overlap)"; pg_locks tells them apart
        # by objsubid (1: one int8 key, 2: two int4 keys). So no bigint meets kumiko's keys.

    def type_name(self, node: dict[str, Any]) -> None:
        names = _names(node.get("names", []))
        if len(names) >= 2:
            self.schema_ref(names[-2])
        self.fields(node, "names")

    def type_cast(self, node: dict[str, Any]) -> None:
        names = _names(node["typeName"].get("names", []))
        if names[-1] in REG_TYPES and (len(names) == 1 or names[-2] == CATALOG):
            literal = _string_constant(node.get("arg"))
            if literal is None:
                raise _Unverifiable(f"a cast to {names[-1]} of a value that is not a constant")
            self.reg_name(names[-1], literal)
        self.fields(node)

    def reg_name(self, reg_type: str, literal: str) -> None:
        if reg_type == "regrole":
            return
        if reg_type == "regnamespace":
            self.schema_ref(_resolve_literal_name(literal)[0])
            return
        text = literal
        if reg_type in ("regprocedure", "regoperator") and "(" in text:
            text = text[: text.index("(")]  # 'f(int)': the argument types name no relation
        if reg_type == "regtype" and '"' not in text and "." not in text:
            return  # 'integer', 'double precision', 'text[]': unqualified type names
        if reg_type in ("regoper", "regoperator") and "." not in text:
            return  # '+', '||': an unqualified operator
        if reg_type in ("regoper", "regoperator"):
            schema = text.split(".", 1)[0].strip()
            self.schema_ref(_resolve_literal_name(schema)[0])
            return
        parts = _resolve_literal_name(text)
        if len(parts) >= 2:
            # Only the schema matters: the cast yields an object id, which reveals nothing by
            # itself, and only allowlisted functions can be applied to it.
            self.schema_ref(parts[-2])

    def column_ref(self, node: dict[str, Any]) -> None:
        fields = _names(node.get("fields", []))
        if len(fields) >= 3 and "*" not in fields[:-1]:
            self.schema_ref(fields[-3])  # schema.table.column (or db.schema.table.column)

    def operator(self, node: dict[str, Any]) -> None:
        names = _names(node.get("name", []))
        if len(names) >= 2:
            self.schema_ref(names[-2])  # OPERATOR(t2.+)
        self.fields(node, "name")

    def qualified(self, node: dict[str, Any], key: str) -> None:
        names = _names(node.get(key, []))
        if len(names) >= 2:
            self.schema_ref(names[-2])  # COLLATE t2.c, TABLESAMPLE t2.method(...)
        self.fields(node, key)

    def operator_names(self, names: list[Any]) -> None:
        parts = _names(names)
        if len(parts) >= 2:
            self.schema_ref(parts[-2])  # ORDER BY x USING OPERATOR(t2.<), x OPERATOR(t2.=) ANY

    def constant(self, node: dict[str, Any]) -> None:
        if "ival" in node or "fval" in node:
            location = node.get("location", -1)
            if location >= 0:
                match = _NUMBER_FORMS.match(self.source, location)
                if match is not None and match.group(1):
                    raise _Unverifiable("a number written in a PostgreSQL 16+ only form")

    # --- statements -----------------------------------------------------------------------

    def insert(self, node: dict[str, Any]) -> None:
        columns: frozenset[str] | None = None
        if "cols" in node:
            columns = frozenset(t["ResTarget"]["name"] for t in node["cols"])
        elif "selectStmt" not in node:
            columns = frozenset()  # DEFAULT VALUES
        conflict = node.get("onConflictClause", {})
        if columns is not None and "targetList" in conflict:
            columns |= {t["ResTarget"]["name"] for t in conflict["targetList"]}
        self.write_target("insert", node["relation"], columns)
        self.fields(node, "relation")

    def update(self, node: dict[str, Any]) -> None:
        columns = frozenset(t["ResTarget"]["name"] for t in node.get("targetList", []))
        self.write_target("update", node["relation"], columns)
        self.fields(node, "relation")

    def delete(self, node: dict[str, Any]) -> None:
        self.write_target("delete", node["relation"], frozenset())
        self.fields(node, "relation")

    def merge(self, node: dict[str, Any]) -> None:
        columns: set[str] | None = set()
        for clause in node.get("mergeWhenClauses", []):
            when = clause["MergeWhenClause"]
            targets = when.get("targetList")
            if when["commandType"] == "CMD_INSERT" and targets is None and "values" in when:
                columns = None  # INSERT VALUES (...) without a column list: every column
            elif targets is not None and columns is not None:
                columns.update(t["ResTarget"]["name"] for t in targets)
        written = None if columns is None else frozenset(columns)
        self.write_target("merge", node["relation"], written)
        self.fields(node, "relation")

    def into(self, node: dict[str, Any]) -> None:
        self.unverifiable = "SELECT INTO creates a table"

    def locking(self, node: dict[str, Any]) -> None:
        self.locks = True
        self.fields(node)

    def param(self, node: dict[str, Any]) -> None:
        self.params.append(int(node.get("number", 0)))


_HANDLERS: dict[str, Any] = {
    "RangeVar": _Walker.relation,
    "FuncCall": _Walker.call,
    "TypeName": _Walker.type_name,
    # JSON inlines struct-typed fields without their node name: TypeCast.typeName,
    # ColumnDef.typeName (``AS t(a t2.type)``), XmlSerialize, JSON_TABLE columns, ...
    "typeName": _Walker.type_name,
    "useOp": _Walker.operator_names,
    "operName": _Walker.operator_names,
    "TypeCast": _Walker.type_cast,
    "ColumnRef": _Walker.column_ref,
    "A_Expr": _Walker.operator,
    "CollateClause": lambda walker, node: walker.qualified(node, "collname"),
    "RangeTableSample": lambda walker, node: walker.qualified(node, "method"),
    "A_Const": _Walker.constant,
    "InsertStmt": _Walker.insert,
    "UpdateStmt": _Walker.update,
    "DeleteStmt": _Walker.delete,
    "MergeStmt": _Walker.merge,
    "intoClause": _Walker.into,
    "LockingClause": _Walker.locking,
    "ParamRef": _Walker.param,
}


# --- statements -------------------------------------------------------------------------------


def _local_write_tables(writes: tuple[Write, ...]) -> frozenset[str] | None:
    if any(w.schema is not None for w in writes):
        return None
    return frozenset(w.table for w in writes)


def _unverifiable(kind: str, why: str) -> Shape:
    return Shape(kind, unverifiable=why)


def _query_shape(node_type: str, node: dict[str, Any], walker: _Walker) -> Shape:
    kind = _QUERY_STATEMENTS[node_type]
    if kind == "select" and "valuesLists" in node:
        kind = "values"
    try:
        walker.walk({node_type: node})
    except _Unverifiable as exc:
        return _unverifiable(kind, str(exc))  # walker.walked stays False: params counted anew
    walker.walked = True
    verbs = [w.verb for w in walker.writes if w.verb in ("insert", "update", "delete", "merge")]
    if kind in ("select", "values") and verbs:
        kind = verbs[0]  # a data-modifying CTE makes the statement a write
    if walker.unverifiable:
        kind = "ddl"
    writes = tuple(walker.writes)
    return Shape(
        kind,
        unverifiable=walker.unverifiable,
        writes=writes,
        local_write_tables=_local_write_tables(writes),
        schemas=frozenset(walker.schemas),
        calls=tuple(dict.fromkeys(walker.calls)),
        locks=walker.locks,
        forbidden_catalogs=tuple(dict.fromkeys(walker.forbidden_catalogs)),
        forbidden=walker.forbidden,
    )


def _statement_shape(stmt: dict[str, Any], walker: _Walker) -> Shape:
    ((node_type, node),) = stmt.items()
    if node_type in _QUERY_STATEMENTS:
        return _query_shape(node_type, node, walker)
    if node_type == "ExplainStmt":
        return _statement_shape(node["query"], walker)  # EXPLAIN ANALYZE executes it
    if node_type == "TruncateStmt":
        for relation in node.get("relations", []):
            walker.write_target("truncate", relation["RangeVar"], None)
        writes = tuple(walker.writes)
        return Shape("truncate", writes=writes, local_write_tables=_local_write_tables(writes))
    if node_type == "VariableSetStmt":
        return _set_shape(node)
    if node_type == "VariableShowStmt":
        return Shape("show")
    if node_type == "ConstraintsSetStmt":
        return Shape("transaction")
    if node_type == "TransactionStmt":
        if node.get("kind") in _TWO_PHASE:
            return replace(_unverifiable("transaction", "two-phase commit"), ends_transaction=True)
        return Shape("transaction", ends_transaction=node.get("kind") not in _INSIDE_TRANSACTION)
    kind = _UTILITY_KINDS.get(node_type, "ddl")
    label = node_type.removesuffix("Stmt")
    return _unverifiable(kind, f"{label} statements cannot be verified")


def _set_shape(node: dict[str, Any]) -> Shape:
    name = node.get("name", "")
    kind = node.get("kind")
    if kind == "VAR_SET_MULTI" and name == "TRANSACTION":
        return Shape("transaction")  # SET TRANSACTION: this transaction only
    if kind in ("VAR_RESET", "VAR_RESET_ALL"):
        return _unverifiable("reset", "RESET of a session setting cannot be verified")
    if name != "search_path" or node.get("is_local") or kind != "VAR_SET_VALUE":
        return _unverifiable("set", "SET of a session setting cannot be verified")
    names: list[str] = []
    for arg in node.get("args", []):
        value = _string_constant(arg)
        if value is None:
            return _unverifiable("set_search_path", "SET search_path to an unverifiable value")
        names.append(value)
    return Shape(
        "set_search_path",
        unverifiable=f"SET search_path to {', '.join(names)}: not the run's schema(s)",
        search_path=tuple(names),
    )


@lru_cache(maxsize=4096)
def statement_shape(sql: str, parameters: bool = True) -> Shape:
    """The shape of ``sql`` as the server receives it.

    ``parameters``: whether psycopg gets parameters with it (``params is not None``); only then
    does it substitute placeholders (and turn ``%%`` into ``%``). Without, the text is sent
    verbatim and ``%`` is an ordinary character.
    """
    expected: list[int] = []
    text = sql
    if parameters:
        try:
            text, expected = _server_text(sql)
        except (pg_errors.ProgrammingError, UnicodeError) as exc:
            return _unverifiable("unparseable", f"psycopg refuses the placeholders: {exc}")
    try:
        tree = json.loads(pg_parser.parse_sql_json(text))
    except pg_parser.ParseError as exc:
        return _unverifiable("unparseable", f"unparseable SQL: {exc}")
    statements = [s["stmt"] for s in tree.get("stmts", []) if "stmt" in s]
    if not statements:
        return Shape("empty")
    source = text.encode()
    shapes: list[Shape] = []
    found: list[int] = []
    for stmt in statements:
        walker = _Walker(source)
        shapes.append(_statement_shape(stmt, walker))
        # Query statements were walked whole; the others (utility statements) are not, so
        # their parameter nodes are counted here.
        found.extend(walker.params if walker.walked else _params(stmt))
    # Every placeholder must be a parameter node, and no parameter node may come from the text.
    if parameters and sorted(found) != sorted(expected):
        return _unverifiable(
            "unparseable",
            "a placeholder inside a literal, comment, dollar quote or identifier (or a $n in "
            "the text): psycopg would change the statement's meaning",
        )
    if len(shapes) > 1:
        return Shape(
            "multi_statement",
            unverifiable=f"{len(shapes)} statements in one execute",
            parts=tuple(shapes),
            ends_transaction=any(shape.ends_transaction for shape in shapes),
        )
    return shapes[0]


def _params(tree: Any) -> list[int]:
    """Numbers of every ``ParamRef`` in the tree (utility statements included)."""
    found: list[int] = []
    stack = [tree]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            ref = value.get("ParamRef")
            if ref is not None:
                found.append(int(ref.get("number", 0)))
            stack.extend(v for v in value.values() if isinstance(v, dict | list))
        elif isinstance(value, list):
            stack.extend(v for v in value if isinstance(v, dict | list))
    return found
