"""From the text psycopg sends to a :class:`Shape`: placeholders, parsing, statement kinds.

:func:`statement_shape` is the guard's reading of a statement. It first works out the text the
server will receive (psycopg's placeholders, ``%%``), then hands it to PostgreSQL's own parser
(pglast / libpg_query), walks each statement (``guard.walker``) and says what the statement
does, independent of any policy; ``guard.judge`` applies the policy. Memoised by (text,
parameters): the ORM sends the same placeholder-bearing text over and over.

Why PostgreSQL's parser: a hand-written lexer disagreed with the server (``--`` comments end at
``\\r`` too; bytes >= 0x80 continue an identifier, so ``x€$$`` is no dollar quote; ``SEARCH``/
``CYCLE`` clauses, ``FROM ONLY (s.t)``, keyword aliases) and each disagreement was a way to send
``DELETE FROM <other tenant>`` past it. libpg_query is the server's lexer and grammar (of
PostgreSQL 18; older servers reject the newer syntax, see ``walker._NUMBER_FORMS`` for the one
lexical difference that matters), so the tree is what the server runs.

Pure: no Django, no database.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from functools import lru_cache
from typing import Any

from pglast import parser as pg_parser
from psycopg import errors as pg_errors

# psycopg's own placeholder splitter, so the guard finds exactly the placeholders psycopg
# substitutes (its rules: %s %b %t %(name)s, %% -> %, a "%" before a newline is left alone,
# anything else after "%" is an error). Private API: tests/unit/test_guard.py pins the
# behaviour this module relies on, so a psycopg upgrade that changes it fails loudly.
from psycopg._queries import _split_query

from .shape import Shape, Unverifiable, Write
from .walker import Walker, string_constant

__all__ = ["search_path_shape", "statement_shape"]


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


# --- statements -------------------------------------------------------------------------------

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
# What leaves a SET of the open transaction in place (any other transaction statement may roll it
# back: ROLLBACK, ROLLBACK TO SAVEPOINT, and COMMIT of a failed transaction, which rolls back).
_KEEPS_SETS = frozenset(
    {"TRANS_STMT_BEGIN", "TRANS_STMT_START", "TRANS_STMT_SAVEPOINT", "TRANS_STMT_RELEASE"}
)
_TWO_PHASE = frozenset(
    {"TRANS_STMT_PREPARE", "TRANS_STMT_COMMIT_PREPARED", "TRANS_STMT_ROLLBACK_PREPARED"}
)


# What a name in SQL text can be made of (unquoted; PostgreSQL folds it to lower case).
_WORDS = re.compile(r"[a-z_\x80-\U0010ffff][a-z0-9_$\x80-\U0010ffff]*")


def literal_words(strings: list[str]) -> frozenset[str]:
    """The words of string literals that might name a relation (``Shape.literal_words``)."""
    return frozenset(word for text in strings for word in _WORDS.findall(text.lower()))


def _local_write_tables(writes: tuple[Write, ...]) -> frozenset[str] | None:
    if any(w.schema is not None for w in writes):
        return None
    return frozenset(w.table for w in writes)


def _unverifiable(kind: str, why: str) -> Shape:
    return Shape(kind, unverifiable=why)


def _query_shape(node_type: str, node: dict[str, Any], walker: Walker) -> Shape:
    kind = _QUERY_STATEMENTS[node_type]
    if kind == "select" and "valuesLists" in node:
        kind = "values"
    try:
        walker.walk({node_type: node})
    except Unverifiable as exc:
        return _unverifiable(kind, str(exc))  # walker.walked stays False: params counted anew
    walker.walked = True
    walker.finish()
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
        qualified_relations=frozenset(walker.qualified_relations),
        relations=frozenset(walker.relations),
        literal_words=literal_words(walker.strings) if walker.calls else frozenset(),
    )


def _statement_shape(stmt: dict[str, Any], walker: Walker) -> Shape:
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
            return replace(
                _unverifiable("transaction", "two-phase commit"),
                ends_transaction=True,
                undoes_sets=True,
            )
        return Shape(
            "transaction",
            ends_transaction=node.get("kind") not in _INSIDE_TRANSACTION,
            undoes_sets=node.get("kind") not in _KEEPS_SETS,
        )
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
        value = string_constant(arg)
        if value is None:
            return _unverifiable("set_search_path", "SET search_path to an unverifiable value")
        names.append(value)
    return _search_path(tuple(names))


def _search_path(names: tuple[str, ...]) -> Shape:
    return Shape(
        "set_search_path",
        unverifiable=f"SET search_path to {', '.join(names)}: not the run's schema(s)",
        search_path=names,
    )


def search_path_shape(schemas: tuple[str, ...]) -> Shape:
    """The shape of ``SET search_path`` to ``schemas``, as :func:`statement_shape` reads it from
    the text, without text: how django-tenants switches a connection (``judge.classify_switch``).
    The names are its literals (``Shape.literal_words``), as they are of the statement's text."""
    return replace(_search_path(schemas), literal_words=literal_words(list(schemas)))


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
        walker = Walker(source)
        shape = _statement_shape(stmt, walker)
        if walker.walked:
            found.extend(walker.params)
        else:
            # Query statements were walked whole; the others (utility statements, and what
            # the walk gave up on) are not, so their parameter nodes and the relations they
            # name (``COPY kumiko_jobs_jobrun TO STDOUT``) are collected here.
            numbers, names, strings = _scan(stmt)
            found.extend(numbers)
            words = literal_words(strings) if shape.unverifiable else frozenset()
            if words or not names <= shape.relations:
                shape = replace(shape, relations=shape.relations | names, literal_words=words)
        shapes.append(shape)
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
            undoes_sets=any(shape.undoes_sets for shape in shapes),
            relations=frozenset().union(*(shape.relations for shape in shapes)),
            literal_words=frozenset().union(*(shape.literal_words for shape in shapes)),
        )
    return shapes[0]


def _scan(tree: Any) -> tuple[list[int], frozenset[str], list[str]]:
    """Numbers of every ``ParamRef`` in the tree (utility statements included), the names of
    every relation it names (a ``RangeVar``, also inlined without its node name, as in
    ``CopyStmt.relation``: a node with a ``relname``), and its strings (a ``DO`` body)."""
    found: list[int] = []
    names: set[str] = set()
    strings: list[str] = []
    stack = [tree]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            ref = value.get("ParamRef")
            if ref is not None:
                found.append(int(ref.get("number", 0)))
            relname = value.get("relname")
            if isinstance(relname, str):
                names.add(relname)
            text = value.get("sval")
            if isinstance(text, str):
                strings.append(text)
            stack.extend(v for v in value.values() if isinstance(v, dict | list))
        elif isinstance(value, list):
            stack.extend(v for v in value if isinstance(v, dict | list))
    return found, frozenset(names), strings
