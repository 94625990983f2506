"""Django 5.2 has no ``django.tasks``: kumiko_jobs.tasks says so clearly, and no other module
of the package imports it (or django.tasks) when it is imported."""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "kumiko_jobs"


def test_the_backend_module_names_the_fix_without_django_tasks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in [m for m in sys.modules if m == "django.tasks" or m.startswith("django.tasks.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "django.tasks", None)  # as if it did not exist
    monkeypatch.delitem(sys.modules, "kumiko_jobs.tasks", raising=False)
    with pytest.raises(ImportError, match=r"needs Django's task framework \(django.tasks"):
        importlib.import_module("kumiko_jobs.tasks")


def _module_level_imports(tree: ast.Module) -> list[str]:
    """Imports that run when the module is imported (not those inside functions)."""
    found: list[str] = []

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.Import):
                found.extend(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = "." * node.level + (node.module or "")
                found.extend(
                    f"{base}.{alias.name}" if not node.module else base for alias in node.names
                )
            elif isinstance(node, ast.If | ast.Try):
                visit(node.body)
                visit(node.orelse)
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)

    visit(tree.body)
    return found


def test_no_other_module_imports_the_backend_or_django_tasks_at_import_time() -> None:
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if path.name == "tasks.py" and path.parent == PACKAGE:
            continue
        tree = ast.parse(path.read_text(), str(path))
        for name in _module_level_imports(tree):
            if name.startswith("django.tasks") or name in (
                ".tasks",
                "..tasks",
                "kumiko_jobs.tasks",
            ):
                offenders.append(f"{path.relative_to(PACKAGE)}: {name}")
    assert offenders == []
