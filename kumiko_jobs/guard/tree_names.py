"""Names in PostgreSQL's parse tree and in strings, read the way the server reads them.

Pure helpers of the walk (``guard.walker``, ``guard.catalog_reads``, ``guard.parse``): the
strings of a name list, a qualified name written inside a string literal (``nextval('t2.seq')``,
``'"T2"."x"'::regclass``) split and case-folded as PostgreSQL does, and constant nodes.

Pure: no Django, no database.
"""

from __future__ import annotations

from typing import Any

from .shape import Unverifiable

__all__ = ["int_constant", "name_list", "resolve_literal_name", "string_constant"]


def name_list(items: list[Any]) -> list[str]:
    """The strings of a name list (``[{"String": {"sval": ...}}, ...]``); "*" for ``A_Star``."""
    out: list[str] = []
    for item in items:
        string = item.get("String")
        out.append(string.get("sval", "") if string is not None else "*")
    return out


def resolve_literal_name(text: str) -> list[str]:
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
                    raise Unverifiable("unterminated quoted name in a string")
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
                raise Unverifiable(f"cannot read the name in the string {text!r}")
            parts.append(_fold(text[i:j]))
            i = j
        while i < n and text[i].isspace():
            i += 1
        if i == n:
            return parts
        if text[i] != ".":
            raise Unverifiable(f"cannot read the name in the string {text!r}")
        i += 1


_ASCII_FOLD = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def _fold(name: str) -> str:
    return name.translate(_ASCII_FOLD)


def string_constant(node: Any) -> str | None:
    """The text of a string constant node (``'t2.seq'``), or None for any other node."""
    const = node.get("A_Const") if isinstance(node, dict) else None
    if const is None or "sval" not in const:
        return None
    return str(const["sval"].get("sval", ""))


def int_constant(node: Any) -> int | None:
    const = node.get("A_Const") if isinstance(node, dict) else None
    if const is None or "ival" not in const:
        return None
    return int(const["ival"].get("ival", 0))
