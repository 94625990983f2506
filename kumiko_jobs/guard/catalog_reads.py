"""Column-level judging of the catalog relations that are readable but hold some values.

``pg_class`` says which tables exist (Django's introspection reads it) and, in ``reltuples`` and
``relpages``, how many rows every tenant's tables have; ``pg_proc`` and ``pg_views`` name
functions and views and, in ``prosrc`` and ``definition``, carry their text with its literals
(issue 22). ``allowlists.RESTRICTED_CATALOG_COLUMNS`` lists those columns. The walker hands
this module every relation, column reference, ``*``, join and field selection of a statement;
:meth:`RestrictedColumns.refusals` then names what could reach a restricted column.

The rules are conservative, by name, over the whole statement (no scope analysis, so a tenant
column that happens to be called ``definition`` in a statement that also reads ``pg_views`` is
refused too: name the columns, or split the statement):

* a column reference whose last name is a restricted column of a relation read, in any clause
  (a ``WHERE reltuples > 1000`` or an ``ORDER BY`` is an oracle), or a field selection
  ``(c).reltuples``;
* a whole-row reference (``c``, ``to_jsonb(c)``) or a qualified star (``c.*``) naming such a
  relation, its alias, or a join alias around it;
* an unqualified ``*`` (``SELECT *``, ``TABLE pg_class``, ``RETURNING *``) over a FROM list that
  holds such a relation directly (a subquery's ``*`` is judged inside it);
* column aliases on such a relation (``pg_class AS c(a, b, ...)`` renames ``reltuples``), and
  ``NATURAL JOIN`` or ``USING (reltuples)`` with it (a join on the column is a comparison).

Pure: no Django, no database.
"""

from __future__ import annotations

from typing import Any

from .allowlists import (
    CATALOG_RELATIONS,
    RESTRICTED_CATALOG_COLUMNS,
    RESTRICTED_INFORMATION_SCHEMA_COLUMNS,
)
from .shape import CATALOG, INFORMATION_SCHEMA
from .tree_names import name_list

__all__ = ["RestrictedColumns", "restricted_columns"]


def restricted_columns(schema: str | None, name: str) -> frozenset[str] | None:
    """The restricted columns of the relation ``schema.name`` as PostgreSQL resolves it."""
    if schema is None:
        if name.startswith("pg_") or name in CATALOG_RELATIONS:
            return RESTRICTED_CATALOG_COLUMNS.get(name)  # pg_catalog precedes the search path
        return None
    if schema == CATALOG:
        return RESTRICTED_CATALOG_COLUMNS.get(name)
    if schema == INFORMATION_SCHEMA:
        return RESTRICTED_INFORMATION_SCHEMA_COLUMNS.get(name)
    return None


def _range_var_columns(node: dict[str, Any]) -> frozenset[str] | None:
    return restricted_columns(node.get("schemaname"), node.get("relname", ""))


class RestrictedColumns:
    """What one statement does with column-restricted catalog relations."""

    __slots__ = ("columns", "joins", "names", "refs", "refused", "selected", "stars")

    def __init__(self) -> None:
        self.columns: set[str] = set()  # restricted columns of the relations read
        self.names: set[str] = set()  # their names and aliases, join aliases around them
        self.refs: list[list[str]] = []  # every column reference, as its list of names
        self.selected: list[Any] = []  # every field selection's names, (x).name
        self.refused: list[str] = []
        # Kept, not judged, during the walk: most statements read no restricted relation, and
        # then there is nothing to judge (the ORM's statements pay a list append each).
        self.stars: list[tuple[list[Any], list[Any]]] = []
        self.joins: list[dict[str, Any]] = []

    def relation(self, node: dict[str, Any]) -> None:
        """A relation read (a ``RangeVar``)."""
        columns = _range_var_columns(node)
        if columns is None:
            return
        name = node.get("relname", "")
        self.columns |= columns
        self.names.add(name)
        alias = node.get("alias") or {}
        if "aliasname" in alias:
            self.names.add(alias["aliasname"])
        if alias.get("colnames"):
            self.refused.append(f"{name} with column aliases")

    def column_ref(self, fields: list[str]) -> None:
        self.refs.append(fields)

    def field_selection(self, indirection: list[Any]) -> None:
        self.selected.append(indirection)

    def star_over(self, from_items: list[Any], targets: list[Any]) -> None:
        """An unqualified ``*`` among ``targets`` expands every relation of ``from_items``."""
        if from_items and targets:
            self.stars.append((from_items, targets))

    def join(self, node: dict[str, Any]) -> None:
        """A join: its alias hides the relations inside; NATURAL and USING compare columns."""
        self.joins.append(node)

    def _star_over(self, from_items: list[Any], targets: list[Any]) -> None:
        if not any(_is_bare_star(target) for target in targets):
            return
        for item in from_items:
            for name, _ in _direct_restricted(item):
                self.refused.append(f"* over {name}")

    def _join(self, node: dict[str, Any]) -> None:
        inside = _direct_restricted(node)
        if not inside:
            return
        for key in ("alias", "join_using_alias"):
            alias = node.get(key) or {}
            if "aliasname" in alias:
                self.names.add(alias["aliasname"])
        if node.get("isNatural"):
            self.refused.append(f"NATURAL JOIN with {inside[0][0]}")
        for column in name_list(node.get("usingClause", [])):
            if any(column in columns for _, columns in inside):
                self.refused.append(f"JOIN ... USING ({column})")

    def refusals(self) -> list[str]:
        """What in the statement could read a restricted column; empty if nothing."""
        if not self.columns:
            return []  # no restricted relation read: nothing to judge
        for node in self.joins:
            self._join(node)  # first: a join's alias names what is inside it
        for from_items, targets in self.stars:
            self._star_over(from_items, targets)
        found = list(self.refused)
        for fields in self.refs:
            last = fields[-1]
            if last == "*":
                if any(name in self.names for name in fields[:-1]):
                    found.append(".".join(fields))
            elif last in self.columns:
                found.append(".".join(fields))
            elif last in self.names:
                found.append(f"the whole row {'.'.join(fields)}")
        for indirection in self.selected:
            found.extend(f"(...).{n}" for n in name_list(indirection) if n in self.columns)
        return found


def _is_bare_star(target: Any) -> bool:
    # Called for every select-list entry of every statement: no list built on the way.
    value = target.get("ResTarget", {}).get("val") if isinstance(target, dict) else None
    ref = value.get("ColumnRef") if isinstance(value, dict) else None
    if ref is None:
        return False
    fields = ref.get("fields", ())
    return len(fields) == 1 and "A_Star" in fields[0]


def _direct_restricted(item: Any) -> list[tuple[str, frozenset[str]]]:
    """Restricted relations a FROM item holds directly (through joins, not subqueries), with
    their restricted columns."""
    if not isinstance(item, dict):
        return []
    if "RangeTableSample" in item:  # FROM pg_class TABLESAMPLE ...: still the relation's rows
        item = item["RangeTableSample"].get("relation", {})
    if "RangeVar" in item:
        item = item["RangeVar"]
    if "relname" in item and "larg" not in item:
        columns = _range_var_columns(item)
        return [] if columns is None else [(item["relname"], columns)]
    join = item.get("JoinExpr", item)
    if "larg" in join:
        return [*_direct_restricted(join["larg"]), *_direct_restricted(join["rarg"])]
    return []
