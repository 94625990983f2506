"""No module over 400 lines and no function over 60 without a reason (docs/maintainers/README.md).

A module that long holds several concerns, and a function longer than a screen is read in
pieces anyway: split it, or say on its ``def`` line why it stays whole (``# long: <why>``).
``WAITING`` names those still over a limit, each with whom it waits for; it only shrinks: an
entry that is no longer over its limit fails too, so that it is taken off.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "kumiko_jobs"
MODULE_LINES = 400
FUNCTION_LINES = 60

# Over a limit, each with whom it waits for (empty since issue 29's branches landed: keep it so).
WAITING: dict[str, str] = {}


def modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "migrations" not in p.parts)


def long_modules() -> set[str]:
    return {
        str(p.relative_to(PACKAGE))
        for p in modules()
        if len(p.read_text().splitlines()) > MODULE_LINES
    }


def long_functions(source: str, name: str) -> set[str]:
    """``name:function`` of each function over the limit whose ``def`` line gives no reason."""
    lines = source.splitlines()
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length > FUNCTION_LINES and "# long:" not in lines[node.lineno - 1]:
                found.add(f"{name}:{node.name}")
    return found


def all_long_functions() -> set[str]:
    found: set[str] = set()
    for p in modules():
        found |= long_functions(p.read_text(), str(p.relative_to(PACKAGE)))
    return found


def test_no_module_is_over_400_lines() -> None:
    assert sorted(long_modules() - set(WAITING)) == []


def test_no_function_is_over_60_lines_without_a_reason() -> None:
    assert sorted(all_long_functions() - set(WAITING)) == []


def test_the_waiting_list_only_shrinks() -> None:
    """An entry that is within its limit now is taken off the list."""
    assert sorted(set(WAITING) - long_modules() - all_long_functions()) == []


def test_calibration_a_long_function_is_seen_unless_it_says_why() -> None:
    body = "\n".join(f"    x{n} = {n}" for n in range(FUNCTION_LINES))
    assert long_functions(f"def f():\n{body}\n", "m.py") == {"m.py:f"}
    assert long_functions(f"def f():  # long: one table\n{body}\n", "m.py") == set()
    assert long_functions(f"def f():\n{body[: body.rindex(chr(10))]}\n", "m.py") == set()
