"""The walk over PostgreSQL's parse tree that collects what a query statement touches.

Generic on purpose: every node of the tree is visited, and the node types that name objects
(``RangeVar``, ``FuncCall``, ``TypeName``, ``ColumnRef``, operators, ...) are judged wherever
they sit (``_HANDLERS``), so subqueries, CTEs (with ``SEARCH``/``CYCLE``), parenthesised joins,
``LATERAL``, set operations and data-modifying CTEs need no special case: a node type the walk
does not know is descended into, never skipped. ``guard.parse`` runs one :class:`Walker` per
statement and turns what it collected into a ``Shape``.

Names written inside strings (``nextval('t2.seq')``, ``'t2.x'::regclass``) are split and
case-folded here as PostgreSQL does, because they reach objects just like names in the tree.

Pure: no Django, no database.
"""

from __future__ import annotations

import re
from typing import Any

from ..core.db import ADMISSION_LOCK_CLASS, ADMISSION_LOCK_TABLE
from .allowlists import (
    ADVISORY_XACT_LOCKS,
    BUILTIN_FUNCTIONS,
    CATALOG_RELATIONS,
    CATALOG_VALUE_FUNCTION_PREFIX,
    CATALOG_VALUE_FUNCTIONS,
    READABLE_CATALOG_RELATIONS,
    REG_TYPES,
    SEQUENCE_FUNCTIONS,
)
from .catalog_reads import RestrictedColumns
from .shape import CATALOG, INFORMATION_SCHEMA, Call, Unverifiable, Write
from .tree_names import int_constant, name_list, resolve_literal_name, string_constant

__all__ = ["Walker", "string_constant"]  # string_constant: re-exported for guard.parse

# Non-decimal integers (0x1F, 0o17, 0b101) and digit separators (1_000) are PostgreSQL 16+.
# PostgreSQL 15 lexes "0x1F" as "0" followed by the column alias "x1F": a statement whose
# meaning depends on the server version is refused.
_NUMBER_FORMS = re.compile(rb"[-+\s(]*\.?[0-9][0-9.]*(?:[eE][-+]?[0-9]+)?([_xXoObB])?")


_CONTAINERS = (dict, list)  # json.loads builds exactly these (type(), not isinstance: faster)


class Walker:
    """One pass over a query statement's tree, collecting what it touches.

    ``walk`` descends generically; the handlers in ``_HANDLERS`` record writes, schemas,
    calls, locks and parameter numbers, or raise :class:`Unverifiable` for a detail that
    cannot be judged.
    """

    def __init__(self, source: bytes) -> None:
        self.source = source
        self.writes: list[Write] = []
        self.schemas: set[str] = set()
        self.calls: list[Call] = []
        self.locks = False
        self.unverifiable = ""
        self.forbidden = ""
        self.forbidden_catalogs: list[str] = []
        self.restricted = RestrictedColumns()  # catalog columns holding tenants' values
        # relations named <schema>.<name> (the judge picks the public schema's, by its name)
        self.qualified_relations: set[tuple[str, str]] = set()
        self.relations: set[str] = set()  # every relation named, in any schema
        self.strings: list[str] = []  # the values of string constants
        self.params: list[int] = []  # the number of every ParamRef met
        self.walked = False  # the whole statement was walked (a query statement)

    # generic descent: a node is {"TypeName": {fields}}, lists hold nodes or values
    def walk(self, value: Any) -> None:
        """Descend into a node or list, calling the handler of each node type naming objects."""
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
        """Walk a node's fields except ``skip`` (what a handler has judged itself)."""
        for key, child in node.items():
            if type(child) in _CONTAINERS and key not in skip:
                self.walk({key: child} if key in _HANDLERS else child)

    # --- objects named in the tree --------------------------------------------------------

    def schema_ref(self, schema: str) -> None:
        """A schema named in the statement (pg_catalog is always on the path, so not counted)."""
        if schema != CATALOG:
            self.schemas.add(schema)

    def relation(self, node: dict[str, Any]) -> None:
        """A relation read: catalog relations by their list, others by their schema."""
        schema = node.get("schemaname")
        name = node.get("relname", "")
        self.relations.add(name)
        if schema is None:
            if name.startswith("pg_") or name in CATALOG_RELATIONS:
                # pg_catalog comes before the search path: this is a catalog relation.
                self.catalog_read(name)
        elif schema == CATALOG:
            self.catalog_read(name)
        else:
            self.schemas.add(schema)
            self.qualified_relations.add((schema, name))
            if schema == INFORMATION_SCHEMA and name.startswith("_pg_"):
                self.forbidden_catalogs.append(f"{schema}.{name}")  # internal, undocumented
        if name == ADMISSION_LOCK_TABLE:
            # A row lock on it (FOR UPDATE) would hold kumiko's admission lock of any tenant.
            self.forbidden = f"{name} is kumiko's admission lock table"
        self.restricted.relation(node)
        self.fields(node)

    def finish(self) -> None:
        """After the walk: what reads restricted catalog columns is a forbidden catalog read."""
        self.forbidden_catalogs.extend(self.restricted.refusals())

    def catalog_read(self, name: str) -> None:
        """A catalog relation read: denied whatever the grants unless it only describes objects."""
        if name not in READABLE_CATALOG_RELATIONS:
            self.forbidden_catalogs.append(name)

    def write_target(self, verb: str, node: dict[str, Any], columns: frozenset[str] | None) -> None:
        """A relation written (INSERT/UPDATE/DELETE/MERGE/TRUNCATE target) and its columns."""
        schema = node.get("schemaname")
        name = node.get("relname", "")
        if schema is None and (name.startswith("pg_") or name in CATALOG_RELATIONS):
            schema = CATALOG  # UPDATE pg_settings ... writes the catalog, not a tenant table
        self.relations.add(name)
        self.writes.append(Write(verb, schema, name, columns))

    def call(self, node: dict[str, Any]) -> None:
        """A call: sequences and advisory locks judged by their arguments, others by allowlist."""
        parts = name_list(node.get("funcname", []))
        name = parts[-1]
        schema = parts[-2] if len(parts) >= 2 else None
        args = node.get("args", [])
        if schema is None or schema == CATALOG:
            if name in SEQUENCE_FUNCTIONS:
                self.sequence_call(name, args)
            elif name in ADVISORY_XACT_LOCKS:
                self.advisory_lock(name, args)
            elif name in CATALOG_VALUE_FUNCTIONS or name.startswith(CATALOG_VALUE_FUNCTION_PREFIX):
                self.forbidden_catalogs.append(f"{name}()")  # definitions, sizes, counters
            elif name not in BUILTIN_FUNCTIONS:
                self.calls.append(Call(schema, name))
        else:
            self.schemas.add(schema)
            self.calls.append(Call(schema, name))
        self.fields(node, "funcname")

    def sequence_call(self, name: str, args: list[Any]) -> None:
        """``nextval``/``setval``/``currval`` name their sequence in a string: read it as a name."""
        first = args[0] if args else None
        literal = string_constant(first)
        if literal is None and isinstance(first, dict) and "TypeCast" in first:
            cast = first["TypeCast"]
            if name_list(cast["typeName"]["names"])[-1] == "regclass":
                literal = string_constant(cast.get("arg"))
        if literal is None:
            raise Unverifiable(f"{name}() of a sequence not named by a constant")
        parts = resolve_literal_name(literal)
        if len(parts) > 3:
            raise Unverifiable(f"{name}() of an improper name {literal!r}")
        schema = parts[-2] if len(parts) >= 2 else None
        self.relations.add(parts[-1])  # a sequence is a relation too (kumiko's are refused)
        if name == "currval":
            if schema is not None:
                self.schema_ref(schema)
        else:
            # nextval/setval change the sequence: a write, judged like one (public: shared).
            self.writes.append(Write(name, schema, parts[-1], frozenset()))

    def advisory_lock(self, name: str, args: list[Any]) -> None:
        """A transaction advisory lock: never in kumiko's own admission lock class."""
        if len(args) == 2:
            # Two int4 keys: kumiko's admission lock lives here under ADMISSION_LOCK_CLASS.
            key_class = int_constant(args[0])
            if key_class is None:
                raise Unverifiable(f"{name}() with two keys needs a constant first key")
            if key_class == ADMISSION_LOCK_CLASS:
                self.forbidden = f"{name}({key_class}, ...) takes kumiko's own admission lock class"
        # One bigint key: a separate key space. PostgreSQL's docs, Advisory Lock Functions
        # (https://www.postgresql.org/docs/current/functions-admin.html#FUNCTIONS-ADVISORY-LOCKS):
        # a resource is identified "either by a single 64-bit key value or two 32-bit key
        # values (note that these two key spaces do not overlap)"; pg_locks tells them apart
        # by objsubid (1: one int8 key, 2: two int4 keys). So no bigint meets kumiko's keys.

    def type_name(self, node: dict[str, Any]) -> None:
        """A type name, which may be schema-qualified (``t2.mytype``)."""
        names = name_list(node.get("names", []))
        if len(names) >= 2:
            self.schema_ref(names[-2])
        self.fields(node, "names")

    def type_cast(self, node: dict[str, Any]) -> None:
        """A cast; to a reg* type, the string cast names an object, read like a name."""
        names = name_list(node["typeName"].get("names", []))
        if names[-1] in REG_TYPES and (len(names) == 1 or names[-2] == CATALOG):
            literal = string_constant(node.get("arg"))
            if literal is None:
                raise Unverifiable(f"a cast to {names[-1]} of a value that is not a constant")
            self.reg_name(names[-1], literal)
        self.fields(node)

    def reg_name(self, reg_type: str, literal: str) -> None:
        """The object a ``'...'::reg*`` string names: only its schema matters."""
        if reg_type == "regrole":
            return
        if reg_type == "regnamespace":
            self.schema_ref(resolve_literal_name(literal)[0])
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
            self.schema_ref(resolve_literal_name(schema)[0])
            return
        parts = resolve_literal_name(text)
        if len(parts) >= 2:
            # Only the schema matters: the cast yields an object id, which reveals nothing by
            # itself, and only allowlisted functions can be applied to it.
            self.schema_ref(parts[-2])

    def column_ref(self, node: dict[str, Any]) -> None:
        """A column reference; three parts or more name a schema."""
        fields = name_list(node.get("fields", []))
        if len(fields) >= 3 and "*" not in fields[:-1]:
            self.schema_ref(fields[-3])  # schema.table.column (or db.schema.table.column)
        self.restricted.column_ref(fields)

    def select(self, node: dict[str, Any]) -> None:
        """A SELECT: a bare ``*`` over a restricted catalog relation expands its values."""
        self.restricted.star_over(node.get("fromClause", []), node.get("targetList", []))
        self.fields(node)

    def indirection(self, node: dict[str, Any]) -> None:
        """A field selection ``(x).name``: judged like a column reference to ``name``."""
        self.restricted.field_selection(node.get("indirection", []))
        self.fields(node)

    def join(self, node: dict[str, Any]) -> None:
        """A join (its alias, NATURAL, USING) around a restricted catalog relation."""
        self.restricted.join(node)
        self.fields(node)

    def returning(self, node: dict[str, Any], *from_keys: str) -> None:
        """``RETURNING *`` of a write expands the relations of its FROM/USING too."""
        items: list[Any] = []
        for key in from_keys:
            value = node.get(key)
            items.extend(value if isinstance(value, list) else [value] if value else [])
        self.restricted.star_over(items, node.get("returningClause", {}).get("exprs", []))

    def operator(self, node: dict[str, Any]) -> None:
        """An expression's operator, which may be schema-qualified."""
        names = name_list(node.get("name", []))
        if len(names) >= 2:
            self.schema_ref(names[-2])  # OPERATOR(t2.+)
        self.fields(node, "name")

    def qualified(self, node: dict[str, Any], key: str) -> None:
        """A node whose ``key`` field is a possibly qualified name (collation, sampling method)."""
        names = name_list(node.get(key, []))
        if len(names) >= 2:
            self.schema_ref(names[-2])  # COLLATE t2.c, TABLESAMPLE t2.method(...)
        self.fields(node, key)

    def operator_names(self, names: list[Any]) -> None:
        """An operator named in ``USING``/``ANY`` forms, possibly qualified."""
        parts = name_list(names)
        if len(parts) >= 2:
            self.schema_ref(parts[-2])  # ORDER BY x USING OPERATOR(t2.<), x OPERATOR(t2.=) ANY

    def constant(self, node: dict[str, Any]) -> None:
        """A numeric constant: refused if written in a form only PostgreSQL 16+ reads alike.
        A string constant is kept (``Shape.literal_words``)."""
        text = node.get("sval")
        if type(text) is dict:
            self.strings.append(text.get("sval", ""))
        elif "ival" in node or "fval" in node:
            location = node.get("location", -1)
            if location >= 0:
                match = _NUMBER_FORMS.match(self.source, location)
                if match is not None and match.group(1):
                    raise Unverifiable("a number written in a PostgreSQL 16+ only form")

    # --- statements -----------------------------------------------------------------------

    def insert(self, node: dict[str, Any]) -> None:
        """INSERT: its target and the columns it writes (ON CONFLICT's too)."""
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
        """UPDATE: its target and the columns it sets."""
        columns = frozenset(t["ResTarget"]["name"] for t in node.get("targetList", []))
        self.write_target("update", node["relation"], columns)
        self.returning(node, "fromClause")
        self.fields(node, "relation")

    def delete(self, node: dict[str, Any]) -> None:
        """DELETE: its target (no columns written)."""
        self.write_target("delete", node["relation"], frozenset())
        self.returning(node, "usingClause")
        self.fields(node, "relation")

    def merge(self, node: dict[str, Any]) -> None:
        """MERGE: its target and every column its WHEN clauses write."""
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
        self.returning(node, "sourceRelation")
        self.fields(node, "relation")

    def into(self, node: dict[str, Any]) -> None:
        """SELECT INTO creates a table: unverifiable."""
        self.unverifiable = "SELECT INTO creates a table"

    def locking(self, node: dict[str, Any]) -> None:
        """FOR UPDATE/SHARE: the statement locks rows."""
        self.locks = True
        self.fields(node)

    def param(self, node: dict[str, Any]) -> None:
        """A ``$n`` parameter node, counted to match psycopg's placeholders."""
        self.params.append(int(node.get("number", 0)))


_HANDLERS: dict[str, Any] = {
    "RangeVar": Walker.relation,
    "FuncCall": Walker.call,
    "TypeName": Walker.type_name,
    # JSON inlines struct-typed fields without their node name: TypeCast.typeName,
    # ColumnDef.typeName (``AS t(a t2.type)``), XmlSerialize, JSON_TABLE columns, ...
    "typeName": Walker.type_name,
    "useOp": Walker.operator_names,
    "operName": Walker.operator_names,
    "TypeCast": Walker.type_cast,
    "ColumnRef": Walker.column_ref,
    "SelectStmt": Walker.select,
    "A_Indirection": Walker.indirection,
    "JoinExpr": Walker.join,
    "A_Expr": Walker.operator,
    "CollateClause": lambda walker, node: walker.qualified(node, "collname"),
    "RangeTableSample": lambda walker, node: walker.qualified(node, "method"),
    "A_Const": Walker.constant,
    "InsertStmt": Walker.insert,
    "UpdateStmt": Walker.update,
    "DeleteStmt": Walker.delete,
    "MergeStmt": Walker.merge,
    "intoClause": Walker.into,
    "LockingClause": Walker.locking,
    "ParamRef": Walker.param,
}
