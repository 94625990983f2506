"""Paths and dotted names the docs and the package's own comments name keep resolving.

A maintainer follows them ("see ``worker/sweep.py``", "``guard.roles.connections.login``"); after a
move, a stale one sends the reader to a file or function that is not there. Read as text, never
imported:

* **file paths** (``worker/sweep.py``, ``docs/design.md``, ``fair.py``) in docs/, README.md,
  bench/, scripts/ and kumiko_jobs/: each must be a file relative to the repository, to
  ``kumiko_jobs/`` (or its ``run/`` and ``templates/``), or to the naming file's folder; a bare
  file name must be some file of the repository's;
* **dotted names in double backquotes** in kumiko_jobs/ (``guard.roles.connections``,
  ``worker.pauses.resume``, ``unique.covering_run``) whose first part is one of kumiko's own
  modules: some module whose dotted path ends with the leading parts must define (``def``,
  ``class``, an assignment or an import) each name that follows.

* **full dotted names** (``kumiko_jobs.core.conf.get``, `kumiko_jobs.transport.Scheduler`) in
  docs/, README.md and kumiko_jobs/, however quoted: imported for real, each must be a module or
  an attribute of one, unless it is one of kumiko's names that are no path (``KUMIKO_NAMES``).

Names of a user's project (the tutorial's ``shop/urls.py``), of other packages
(``django_rq/...``) and of this workplace (``ARCHITECTURE.md``) are listed in ``ELSEWHERE``.
"""

from __future__ import annotations

import ast
import importlib
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "kumiko_jobs"

# Named files that are not this repository's: the user's project in the tutorials, other
# packages' files, the workplace's shared documents.
ELSEWHERE = (
    "ARCHITECTURE.md",
    "shop/",
    "notes/",
    "billing/",
    "customers/",
    "django_rq/",
    "admin/css/",
    "KUMIKO_REPO_ROOT/",
)

# A path: words and dashes joined by slashes, ending in an extension of ours; not part of a
# longer word, a URL or ``git show <commit>:<path>`` (the file at an old commit).
FILE_PATH = re.compile(
    r"(?<![\w./:-])((?:[\w-]+/)*[\w-]+\.(?:py|md|html|js|css|sh|toml))(?![\w/-])"
)
DOTTED = re.compile(r"``([a-z_][a-z0-9_]*(?:\.[a-z_][a-z0-9_]*)+)``")
# Dotted words that are not module paths: the run's span name, Django's default admin site.
NOT_MODULE_PATHS = {"job.execute", "admin.site"}
FILE_SUFFIXES = (".py", ".md", ".html", ".js", ".css")


def documents() -> Iterator[Path]:
    yield ROOT / "README.md"
    yield from sorted((ROOT / "docs").rglob("*.md"))
    yield from sorted((ROOT / "bench").glob("*.py"))
    yield ROOT / "bench" / "README.md"
    yield from sorted(p for p in (ROOT / "scripts").iterdir() if p.is_file())
    yield from package_modules()


def package_modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "migrations" not in p.parts)


@cache
def file_names() -> frozenset[str]:
    skip = {".git", ".venv", ".venv-django52", "node_modules", "__pycache__"}
    return frozenset(p.name for p in ROOT.rglob("*") if p.is_file() and not skip & set(p.parts))


def resolves(path: str, named_in: Path) -> bool:
    if path.startswith(ELSEWHERE):
        return True
    templates = PACKAGE / "templates"
    bases = [ROOT, PACKAGE, PACKAGE / "run", templates, templates / "admin" / "kumiko_jobs"]
    bases.append(named_in.parent)
    if any((base / path).is_file() for base in bases):
        return True
    return "/" not in path and path in file_names()


def stale_file_paths() -> list[str]:
    stale = []
    for document in documents():
        for match in FILE_PATH.finditer(document.read_text()):
            if not resolves(match.group(1), document):
                stale.append(f"{document.relative_to(ROOT)}: {match.group(1)}")
    return stale


@cache
def modules_by_dotted_path() -> dict[str, Path]:
    out = {}
    for path in package_modules():
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


@cache
def defined_names(module: Path) -> frozenset[str]:
    """Every name the module defines anywhere: functions, classes, methods, assignments
    (``self.x = ...`` too), imports."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(module.read_text())):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.alias):
            names.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return frozenset(names)


def own_module_names() -> set[str]:
    return {dotted.rsplit(".", 1)[-1] for dotted in modules_by_dotted_path()} - {"kumiko_jobs"}


def dotted_resolves(name: str) -> bool:
    parts = name.split(".")
    modules = modules_by_dotted_path()
    for cut in range(len(parts), 0, -1):
        head, rest = ".".join(parts[:cut]), parts[cut:]
        found = [p for d, p in modules.items() if d == head or d.endswith("." + head)]
        if any(all(n in defined_names(p) for n in rest) for p in found):
            return True
    return False


def stale_dotted_names() -> list[str]:
    ours = own_module_names()
    stale = []
    for module in package_modules():
        for match in DOTTED.finditer(module.read_text()):
            name = match.group(1)
            if name in NOT_MODULE_PATHS or name.endswith(FILE_SUFFIXES):
                continue  # (a file name is the file paths' test's)
            if name.split(".")[0] in ours and not dotted_resolves(name):
                stale.append(f"{module.relative_to(ROOT)}: {name}")
    return stale


# ``kumiko_jobs.`` followed by names (all of them: possessive), not part of a longer dotted
# word, and not a file name (``commands/kumiko_jobs.py``).
FULL_DOTTED = re.compile(r"(?<![\w./])kumiko_jobs(?:\.[A-Za-z_]\w*)++(?<!\.py)(?<!\.md)")
# kumiko's names that start like a path and are none (``KUMIKO_NAMES`` says which kinds).
CHECK_ID = re.compile(r"kumiko_jobs\.(?:[EW]\d{3}|E0xx)")


def full_dotted_documents() -> Iterator[Path]:
    yield ROOT / "README.md"
    yield from sorted((ROOT / "docs").rglob("*.md"))
    yield from package_modules()


def imports(name: str) -> bool:
    """Whether ``name`` is a module, or an attribute (at any depth) of the longest module it
    starts with."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            # A module of the package that exists but cannot import here (kumiko_jobs.tasks on
            # Django 5.2, which has no django.tasks): its names are read from its source.
            source = PACKAGE.joinpath(*parts[1:cut]).with_suffix(".py")
            if parts[0] == "kumiko_jobs" and 1 < cut < len(parts) and source.is_file():
                return parts[cut] in defined_names(source)
            continue
        for attribute in parts[cut:]:
            if not hasattr(found, attribute):
                return False
            found = getattr(found, attribute)
        return True
    return False


@cache
def package_literals() -> frozenset[str]:
    """Every string (and bytes) literal of the package, and the fixed start of every f-string:
    the logger names, signing salts and labels, span names and dispatch uids it writes."""
    found: set[str] = set()
    for module in package_modules():
        for node in ast.walk(ast.parse(module.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str | bytes):
                value = node.value
                found.add(value.decode() if isinstance(value, bytes) else value)
            elif isinstance(node, ast.JoinedStr) and node.values:
                first = node.values[0]
                if isinstance(first, ast.Constant) and isinstance(first.value, str):
                    found.add(first.value)
    return frozenset(found)


@cache
def kumiko_names() -> frozenset[str]:
    """KUMIKO_NAMES: names written like ``kumiko_jobs.x`` that are no path: the permissions of
    kumiko's models, the names of its own jobs, and the ``kumiko_jobs`` test fixture's
    attributes (docs/testing.md: ``kumiko_jobs.run()``)."""
    from django.apps import apps

    from kumiko_jobs.definition.registry import registry

    names: set[str] = {d.name for d in registry}
    for model in apps.get_app_config("kumiko_jobs").get_models():
        meta = model._meta
        names |= {f"kumiko_jobs.{a}_{meta.model_name}" for a in meta.default_permissions}
        names |= {f"kumiko_jobs.{codename}" for codename, _ in meta.permissions}
    fixture = PACKAGE / "testing" / "assertions.py"
    names |= {f"kumiko_jobs.{n}" for n in defined_names(fixture) if not n.startswith("_")}
    return frozenset(names)


def names_a_thing(name: str) -> bool:
    """``name`` imports, or is one of kumiko's names that are no path: a system check's id, a
    permission, a job, the test fixture's attribute, or a literal the package writes (a logger
    name, a signing label such as ``kumiko_jobs.db_roles.password:``)."""
    if imports(name) or CHECK_ID.fullmatch(name) or name in kumiko_names():
        return True
    return any(
        literal == name
        or literal.startswith((name + ":", name + "."))
        or (literal.endswith(".") and name.startswith(literal))
        for literal in package_literals()
    )


def stale_full_dotted_names() -> list[str]:
    stale = []
    for document in full_dotted_documents():
        for match in FULL_DOTTED.finditer(document.read_text()):
            if not names_a_thing(match.group(0)):
                stale.append(f"{document.relative_to(ROOT)}: {match.group(0)}")
    return stale


def test_full_dotted_names_import() -> None:
    assert stale_full_dotted_names() == []


def test_calibration_a_moved_module_in_a_full_dotted_name_is_seen() -> None:
    """The names this round found stale (``kumiko_jobs.enqueue.api.Job`` from before the
    enqueue side became ``enqueueing``; ``kumiko_jobs.scrubbing``, now in ``core``) are caught,
    and so is a function that was renamed; the names that are no path are not."""
    assert names_a_thing("kumiko_jobs.enqueueing.api.Job")
    assert not names_a_thing("kumiko_jobs.enqueue.api.Job")
    assert not names_a_thing("kumiko_jobs.scrubbing")
    assert not names_a_thing("kumiko_jobs.core.conf.no_such_function")
    assert names_a_thing("kumiko_jobs.E001") and names_a_thing("kumiko_jobs.manage_queues")
    assert names_a_thing("kumiko_jobs.sweep_abandoned") and names_a_thing("kumiko_jobs.pushes")
    assert names_a_thing("kumiko_jobs.db_roles.password")
    found = FULL_DOTTED.findall("see `kumiko_jobs.core.conf.get()`, commands/kumiko_jobs.py")
    assert found == ["kumiko_jobs.core.conf.get"]


def test_named_file_paths_exist() -> None:
    assert stale_file_paths() == []


def test_named_dotted_names_exist() -> None:
    assert stale_dotted_names() == []


def test_calibration_a_moved_file_and_a_renamed_function_are_seen() -> None:
    """The same rules flag what a move leaves behind (so the tests above can fail)."""
    here = PACKAGE / "worker" / "sweep.py"
    assert resolves("worker/sweep.py", here) and resolves("fair.py", here)
    assert not resolves("worker.py", here)
    assert not resolves("guard/db_roles.py", here)
    assert dotted_resolves("guard.roles.connections") and dotted_resolves(
        "worker.pauses.paused_by_rule"
    )
    assert not dotted_resolves("runner.call_job")
    assert not dotted_resolves("worker.pauses.no_such_function")
