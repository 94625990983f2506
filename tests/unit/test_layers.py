"""The package's import graph: no circles, RQ behind one door, and reasons for late imports.

docs/design.md, "The map", says which package owns what and what it may import; these tests
keep that true. They read the source (``ast``), so they see every import, at any depth, even
those that never run in a given process: an import made inside a function or under
``TYPE_CHECKING`` is still a dependency a reader has to follow.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "kumiko_jobs"
# Only the transport talks to Redis, RQ, rq-scheduler and django-rq (docs/design.md).
TRANSPORT_ONLY = ("rq", "rq_scheduler", "django_rq", "redis")

# The layers of docs/design.md, "The map", bottom to top: a package or root module imports only
# from layers below its own. Siblings in one layer never import each other, except the
# surfaces (the top layer), which are what Django, RQ, settings and users load and may use
# anything, one another included.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("models",),
    ("core",),
    ("origin", "signals"),
    ("log_context", "transport", "definition", "guard"),
    ("telemetry",),
    ("history",),
    ("enqueueing",),
    ("run",),
    ("worker", "operations", "task_jobs"),
    (
        "admin",
        "management",
        "checks",
        "urls",
        "apps",
        "tasks",
        "testing",
        "jobs",
        "bulk",
        "__init__",
        "runner",
        "context",
        "conf",
        "migrations",
        "templates",
        "locale",
    ),
)
SURFACES = LAYERS[-1]


@dataclass(frozen=True)
class Import:
    source: str  # the importing module, dotted
    target: str  # the imported module (for ``from x import y``: x.y when y is a module)
    names: tuple[str, ...]
    line: int
    in_function: bool
    comment: str  # the comment on the import's line or the line above it


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _reason_above(lines: list[str], first: int, last: int) -> str:
    """The comments on an import's lines or above it, through a block of imports (one reason
    may head several late imports)."""
    found = [text.split("#", 1)[1] for text in lines[first - 1 : last] if "#" in text]
    row = first - 2
    while row >= 0:
        text = lines[row].strip()
        if text.startswith("#"):
            found.append(text[1:])
        elif not text.startswith(("from ", "import ")):
            break
        row -= 1
    return " ".join(part.strip() for part in found)


def _modules() -> dict[str, Path]:
    return {
        _module_name(p): p for p in sorted(PACKAGE.rglob("*.py")) if "migrations" not in p.parts
    }


def _imports() -> Iterator[Import]:
    modules = _modules()
    for name, path in modules.items():
        source = path.read_text()
        lines = source.splitlines()
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        tree = ast.parse(source, str(path))
        functions = [
            n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
        ]
        inside = {id(n) for f in functions for n in ast.walk(f) if n is not f}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [(alias.name, ()) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    module = ".".join([*base, *([node.module] if node.module else [])])
                else:
                    module = node.module or ""
                names = tuple(alias.name for alias in node.names)
                submodules = [f"{module}.{n}" for n in names if f"{module}.{n}" in modules]
                targets = [(t, ()) for t in submodules] or [(module, names)]
            else:
                continue
            comment = _reason_above(lines, node.lineno, node.end_lineno or node.lineno)
            for target, names_ in targets:
                yield Import(name, target, names_, node.lineno, id(node) in inside, comment)


def _ours(target: str) -> bool:
    return target == "kumiko_jobs" or target.startswith("kumiko_jobs.")


def _circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_no_module_of_the_package_takes_part_in_an_import_circle() -> None:
    edges: dict[str, set[str]] = defaultdict(set)
    modules = _modules()
    for imp in _imports():
        # ``from . import x`` names the package only to reach x; the package's __init__ is a
        # dependency only when a name is taken from it.
        if _ours(imp.target) and imp.target in modules and imp.target != imp.source:
            edges[imp.source].add(imp.target)
    assert _circles(edges) == []


def _unit(module: str) -> str:
    """The top-level package or root module a module belongs to (``__init__`` for the root)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _layer_of() -> dict[str, int]:
    return {unit: n for n, units in enumerate(LAYERS) for unit in units}


def test_every_package_and_root_module_has_a_layer() -> None:
    """A new package or root module must be placed in the map before it can land."""
    units = {_unit(name) for name in _modules()}
    assert sorted(units - set(_layer_of())) == []


def test_imports_point_down_the_layers() -> None:
    layer = _layer_of()
    offenders = sorted(
        {
            f"{_unit(imp.source)} -> {_unit(imp.target)} ({imp.source}:{imp.line})"
            for imp in _imports()
            if _ours(imp.target)
            and _unit(imp.source) != _unit(imp.target)
            and _unit(imp.source) in layer
            and _unit(imp.target) in layer
            and _unit(imp.source) not in SURFACES
            and layer[_unit(imp.target)] >= layer[_unit(imp.source)]
        }
    )
    assert offenders == []


def test_only_the_transport_imports_redis_and_rq() -> None:
    offenders = [
        f"{imp.source}:{imp.line} imports {imp.target}"
        for imp in _imports()
        if imp.target.split(".")[0] in TRANSPORT_ONLY
        and not (
            imp.source == "kumiko_jobs.transport" or imp.source.startswith("kumiko_jobs.transport.")
        )
    ]
    assert offenders == []


# Redis commands that mean nothing else in the package: called on anything outside the
# transport, they are Redis spoken directly.
REDIS_ONLY_COMMANDS = frozenset(
    {
        "blmove", "evalsha", "expire", "hdel", "hexists", "hget", "hgetall", "hincrby", "hmget",
        "hset", "incrby", "llen", "lmove", "lpop", "lpush", "lrange", "lrem", "pexpire",
        "pipeline", "pttl", "publish", "pubsub", "register_script", "rpop", "rpush", "sadd",
        "scan_iter", "scard", "setex", "setnx", "sismember", "smembers", "srem", "ttl", "zadd",
        "zcard", "zincrby", "zrange", "zrangebyscore", "zrem", "zscore",
    }
)  # fmt: skip
# Commands whose names other objects share (dicts, Django's connection, a ContextVar): Redis
# only when called on something named like a Redis client.
REDIS_SHARED_COMMANDS = frozenset({"delete", "eval", "exists", "get", "mget", "set", "type"})
REDIS_CLIENT_NAMES = frozenset({"client", "connection", "pipe", "pipeline", "redis"})
# Where a Redis key's text starts: kumiko's keys (transport/keys.py) and RQ's own. (Not all of
# "kumiko_jobs:": the package's docstring and admission's PostgreSQL lock names start so.)
REDIS_KEY_START = ("kumiko:", "kumiko_jobs:boot:", "kj-cron-", "rq:")


def _outside_transport() -> Iterator[tuple[str, ast.AST]]:
    """Every AST node of the modules outside the transport (migrations are not read at all)."""
    for name, path in _modules().items():
        if name == "kumiko_jobs.transport" or name.startswith("kumiko_jobs.transport."):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            yield name, node


def _receiver_name(node: ast.expr) -> str:
    """``redis`` for ``redis.set``, ``connection`` for ``self.connection.hset``."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


def _redis_calls(found: Iterator[tuple[str, ast.AST]]) -> list[str]:
    offenders = []
    for name, node in found:
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        command, receiver = node.func.attr, _receiver_name(node.func.value)
        if command in REDIS_ONLY_COMMANDS or (
            command in REDIS_SHARED_COMMANDS and receiver in REDIS_CLIENT_NAMES
        ):
            offenders.append(f"{name}:{node.lineno} calls {receiver}.{command}")
    return offenders


def _key_texts(found: Iterator[tuple[str, ast.AST]]) -> list[str]:
    return [
        f"{name}:{node.lineno} writes {node.value!r}"
        for name, node in found
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and node.value.startswith(REDIS_KEY_START)
    ]


def test_only_the_transport_sends_redis_commands() -> None:
    """Every Redis command is a named function of the transport (docs/design.md, "The map"):
    no module outside it calls a Redis command on a client or a pipeline."""
    assert _redis_calls(_outside_transport()) == []


def test_only_the_transport_knows_redis_keys() -> None:
    """Key constants are private to the transport: ``transport.keys`` is imported only inside
    it, the transport's face re-exports none of them, and no module outside it writes a key's
    text (``"kumiko:..."``, ``"rq:..."``)."""
    keys = "kumiko_jobs.transport.keys"
    offenders = [
        f"{imp.source}:{imp.line} imports {imp.target}"
        for imp in _imports()
        if imp.target == keys
        and (
            imp.source == "kumiko_jobs.transport"
            or not imp.source.startswith("kumiko_jobs.transport.")
        )
    ]
    assert offenders == []
    assert _key_texts(_outside_transport()) == []


# The one builder of refusals (docs/guard.md, "One vocabulary"): the message a user reads, the
# violation kept on the run and the exception raised are made there and nowhere else.
REFUSAL_BUILDER = "kumiko_jobs.guard.denials"


def _refusals_built(found: Iterator[tuple[str, ast.AST]]) -> list[str]:
    """Where ``DatabaseAccessDenied`` is constructed or a violation recorded
    (``<watch>.violations.append(...)``) outside the builder."""
    offenders = []
    for name, node in found:
        if name == REFUSAL_BUILDER or not isinstance(node, ast.Call):
            continue
        func = node.func
        if _receiver_name(func) == "DatabaseAccessDenied":
            offenders.append(f"{name}:{node.lineno} constructs DatabaseAccessDenied")
        elif (
            isinstance(func, ast.Attribute)
            and func.attr in ("append", "extend", "insert")
            and _receiver_name(func.value) == "violations"
        ):
            offenders.append(f"{name}:{node.lineno} records a violation")
    return offenders


def _package_nodes() -> Iterator[tuple[str, ast.AST]]:
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            yield name, node


def test_refusals_are_built_only_by_the_guards_builder() -> None:
    """One way to refuse: nothing outside ``guard/denials.py`` constructs a
    ``DatabaseAccessDenied`` or appends to a Watch's violations."""
    assert _refusals_built(_package_nodes()) == []


# A function longer than a screen splits, or says why it does not (house.md): a comment just
# above it (or its decorators) that says "lines". Kept for the guard, where a long function is
# a security rule a reviewer must read whole.
LONG_FUNCTION_LINES = 60
GUARD_MODULES = 400


def _long_functions_without_a_reason(name: str, source: str) -> list[str]:
    lines = source.splitlines()
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        length = (node.end_lineno or node.lineno) - node.lineno + 1
        if length <= LONG_FUNCTION_LINES:
            continue
        first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
        above = _reason_above(lines, first, first - 1)
        if "lines" not in above:
            found.append(f"{name}:{node.lineno} {node.name} is {length} lines")
    return found


def test_the_guards_functions_and_modules_are_short_or_say_why() -> None:
    offenders = []
    for name, path in _modules().items():
        if not name.startswith("kumiko_jobs.guard"):
            continue
        source = path.read_text()
        offenders += _long_functions_without_a_reason(name, source)
        if len(source.splitlines()) >= GUARD_MODULES:
            offenders.append(f"{name} has {len(source.splitlines())} lines")
    assert offenders == []


def test_no_module_imports_another_modules_private_names() -> None:
    offenders = [
        f"{imp.source}:{imp.line} takes {name} from {imp.target}"
        for imp in _imports()
        if _ours(imp.target)
        for name in imp.names
        if name.startswith("_") and not name.startswith("__")
    ]
    assert offenders == []


def test_every_import_of_our_code_inside_a_function_says_why() -> None:
    """Late imports exist only where app loading or an optional dependency forces them, and the
    comment beside each says which."""
    offenders = [
        f"{imp.source}:{imp.line} imports {imp.target}"
        for imp in _imports()
        if imp.in_function and _ours(imp.target) and not imp.comment
    ]
    assert offenders == []


def test_the_checks_themselves_can_fail() -> None:
    """Calibration: the cycle finder finds a circle, the import reader sees late imports and
    imports of each layer, and the map knows the lowest and the highest units."""
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    layer = _layer_of()
    assert layer["core"] < layer["transport"] < layer["run"] < layer["worker"] < layer["admin"]
    seen = {(_unit(i.source), _unit(i.target)) for i in _imports() if _ours(i.target)}
    assert ("run", "core") in seen and ("worker", "run") in seen
    late = [imp for imp in _imports() if imp.in_function]
    assert late, "the package has no import inside a function at all: the reader is blind"
    # The Redis rules see a command on a client and a key's text (a file that breaks them).
    bad = ast.parse('redis.set("kumiko:x", 1, nx=True)\nself.connection.hset(k, f, 1)\nd.get(1)')
    walked = [("bad", node) for node in ast.walk(bad)]
    assert _redis_calls(iter(walked)) == ["bad:1 calls redis.set", "bad:2 calls connection.hset"]
    assert _key_texts(iter(walked)) == ["bad:1 writes 'kumiko:x'"]


# --- who writes the run history (docs/design.md, "Who writes the history") -------------------

# Every state change of a run or an attempt is a function of ``history/transitions.py``; these
# modules of the history write the rows too, each for the reason given. A new run's row is not
# a state change: inserting a ``JobRun`` is the enqueue's (``outbox.save``, ``insert_new``, the
# bulk enqueue's COPY, workflows, cron ticks, boot jobs) and allowed anywhere.
HISTORY_WRITERS = {
    "kumiko_jobs.history.transitions": "every state change of a run or an attempt",
    "kumiko_jobs.history.run_sql": "the hot statements' SQL text, which only transitions calls",
    "kumiko_jobs.history.retention": "erasure: expired runs deleted, a deleted tenant's scrubbed",
    "kumiko_jobs.history.workflows": (
        "a workflow's cancel moves its queued runs in the statement that cancels their steps"
    ),
}
HISTORY_MODELS = frozenset({"JobRun", "JobAttempt"})
HISTORY_TABLES = ("kumiko_jobs_jobrun", "kumiko_jobs_jobattempt")
# ORM calls that write, on a model's manager, a queryset or an instance.
ORM_WRITES = frozenset(
    {
        "update", "delete", "bulk_update", "update_or_create", "get_or_create", "create",
        "bulk_create", "_insert", "_update", "save", "_do_update", "_save_table",
    }
)  # fmt: skip
# Of those, the ones that only insert: allowed on JobRun (a new run), never on JobAttempt.
ORM_INSERTS = frozenset({"create", "bulk_create", "_insert"})
SQL_WRITE = re.compile(r"\b(UPDATE|DELETE\s+FROM|INSERT\s+INTO)\b", re.IGNORECASE)


def _root(node: ast.expr) -> ast.expr:
    """``JobRun`` for ``JobRun.objects.filter(...).first()``: what a chain of calls,
    attributes and subscripts starts from."""
    while True:
        if isinstance(node, ast.Attribute | ast.Subscript):
            node = node.value
        elif isinstance(node, ast.Call):
            node = node.func
        elif isinstance(node, ast.Await):
            node = node.value
        else:
            return node


def _model_of(node: ast.expr, bound: dict[str, str]) -> str | None:
    """The history model an expression's chain starts from (the model, or a name bound to a
    queryset, row or row list of it), else None."""
    root = _root(node)
    if isinstance(root, ast.Name):
        if root.id in HISTORY_MODELS:
            return root.id
        return bound.get(root.id)
    return None


def _names_in(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _bindings(scope: ast.AST, bound: dict[str, str], tables: set[str]) -> None:
    """Names in ``scope`` bound to a history model's rows (``bound``: name -> model) and names
    whose value mentions a history model at all (``tables``: a table name, a quoted one)."""
    for _ in range(3):  # a name bound from a name bound earlier: a few rounds settle it
        for node in ast.walk(scope):
            targets: list[ast.expr] = []
            value: ast.expr | None = None
            if isinstance(node, ast.Assign):
                targets, value = node.targets, node.value
            elif isinstance(node, ast.AnnAssign | ast.AugAssign) and node.value is not None:
                targets, value = [node.target], node.value
            elif isinstance(node, ast.For | ast.AsyncFor | ast.comprehension):
                targets, value = [node.target], node.iter
            elif isinstance(node, ast.withitem) and node.optional_vars is not None:
                targets, value = [node.optional_vars], node.context_expr
            elif isinstance(node, ast.arg) and node.annotation is not None:
                model = _names_in(node.annotation) & HISTORY_MODELS
                if model:
                    bound[node.arg] = min(model)
                continue
            if value is None:
                continue
            model_ = _model_of(value, bound)
            mentions = bool(_names_in(value) & (HISTORY_MODELS | tables))
            for target in targets:
                for name in _names_in(target):
                    if model_ is not None:
                        bound[name] = model_
                    if mentions:
                        tables.add(name)


def _sql_text(node: ast.AST) -> str:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(_sql_text(part) for part in node.values)
    return ""


def _history_writes(name: str, tree: ast.AST) -> list[str]:
    """Every write to JobRun's or JobAttempt's rows in one module's tree, except inserting a run:
    ORM writes on the models, their querysets and rows, and SQL that updates or deletes their
    rows (or inserts attempts) naming their tables."""
    module_bound: dict[str, str] = {}
    module_tables: set[str] = set()
    top = ast.Module(body=[s for s in getattr(tree, "body", []) if isinstance(s, ast.Assign)])
    _bindings(top, module_bound, module_tables)
    scopes = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    found: set[str] = set()
    for scope in [tree, *scopes]:
        bound, tables = dict(module_bound), set(module_tables)
        if scope is not tree:
            _bindings(scope, bound, tables)
        for node in ast.walk(scope):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                method = node.func.attr
                model = _model_of(node.func.value, bound)
                if model is None or method not in ORM_WRITES:
                    continue
                force_insert = any(
                    k.arg == "force_insert" and isinstance(k.value, ast.Constant) and k.value.value
                    for k in node.keywords
                )
                if model == "JobRun" and (method in ORM_INSERTS or force_insert):
                    continue
                found.add(f"{name}:{node.lineno} {model} .{method}()")
            elif isinstance(node, ast.JoinedStr | ast.Constant):
                text = _sql_text(node)
                verb = SQL_WRITE.search(text)
                if verb is None:
                    continue
                named = isinstance(node, ast.JoinedStr) and bool(
                    _names_in(node) & (HISTORY_MODELS | tables)
                )
                if not (named or any(t in text for t in HISTORY_TABLES)):
                    continue
                inserts_run = verb.group(1).upper().startswith("INSERT") and (
                    "JobAttempt" not in _names_in(node) and HISTORY_TABLES[1] not in text
                )
                if not inserts_run:
                    found.add(f"{name}:{node.lineno} SQL {verb.group(1).upper()}")
    return sorted(found)


# The writes of ``history/run_sql.py`` and ``history/atomic_sql.py``: only ``transitions`` calls
# them (and exports them).
HISTORY_SQL_WRITES = {
    "run_sql": frozenset({"start", "finish", "write_progress"}),
    "atomic_sql": frozenset({"atomic_success"}),
}


def _run_sql_writes(name: str, tree: ast.AST) -> list[str]:
    """Calls of ``run_sql.<write>`` / ``atomic_sql.<write>`` and imports of those names."""
    found = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.attr in HISTORY_SQL_WRITES.get(node.value.id, ())
        ):
            found.append(f"{name}:{node.lineno} calls {node.value.id}.{node.attr}")
        elif isinstance(node, ast.ImportFrom):
            module = (node.module or "").rsplit(".", 1)[-1]
            found += [
                f"{name}:{node.lineno} imports {module}.{alias.name}"
                for alias in node.names
                if alias.name in HISTORY_SQL_WRITES.get(module, ())
            ]
    return found


def test_only_the_history_writes_runs_and_attempts() -> None:
    """No module outside ``HISTORY_WRITERS`` writes a run's or an attempt's row: every state
    change is a function of ``history/transitions.py`` (docs/design.md, "Who writes the
    history"), which is also the only caller of ``run_sql``'s writes."""
    offenders = []
    for name, path in _modules().items():
        tree = ast.parse(path.read_text(), str(path))
        if name != "kumiko_jobs.history.transitions":
            offenders += _run_sql_writes(name, tree)
        if name not in HISTORY_WRITERS:
            offenders += _history_writes(name, tree)
    assert offenders == []


def test_the_history_rule_can_fail() -> None:
    """Calibration: the writes this rule exists for are seen (an update through a queryset
    variable, an instance's save, an attempt created, SQL naming the table through a variable),
    and what is allowed is not (inserting a run, reading, a dict's update)."""
    bad = ast.parse(
        "_RUN = JobRun._meta.db_table\n"
        "def f(run: JobRun):\n"
        "    runs = JobRun.objects.filter(pk=1)\n"
        "    runs.update(status='failed')\n"
        "    run.save(update_fields=['status'])\n"
        "    JobAttempt.objects.create(run=run)\n"
        "    cursor.execute(f'UPDATE {_RUN} SET status = %s', [1])\n"
        "    JobRun.objects.filter(pk=1).delete()\n"
        "    for row in runs:\n"
        "        row.delete()\n"
        "def g(row: JobRun):\n"
        "    row.save(force_insert=True)\n"
        "    JobRun.objects.bulk_create([row])\n"
        "    JobRun.objects.filter(pk=1).exists()\n"
        "    d = {}\n"
        "    d.update(a=1)\n"
    )
    assert sorted(
        _run_sql_writes(
            "bad",
            ast.parse(
                "from .run_sql import finish\nrun_sql.start()\n"
                "from ..history.atomic_sql import atomic_success\natomic_sql.atomic_success()\n"
                "atomic_sql.atomic_begin()\nother.finish()"
            ),
        )
    ) == [
        "bad:1 imports run_sql.finish",
        "bad:2 calls run_sql.start",
        "bad:3 imports atomic_sql.atomic_success",
        "bad:4 calls atomic_sql.atomic_success",
    ]
    assert _history_writes("bad", bad) == [
        "bad:10 JobRun .delete()",
        "bad:4 JobRun .update()",
        "bad:5 JobRun .save()",
        "bad:6 JobAttempt .create()",
        "bad:7 SQL UPDATE",
        "bad:8 JobRun .delete()",
    ]
    # The refusal rule sees a refusal built by hand, by either spelling, and a violation kept.
    bad = ast.parse(
        "raise DatabaseAccessDenied(m, kind='x')\nraise exceptions.DatabaseAccessDenied(m)\n"
        "watch.violations.append(m)\nstate.watch.violations.append(m)\nitems.append(m)"
    )
    walked = [("bad", node) for node in ast.walk(bad)]
    assert sorted(_refusals_built(iter(walked))) == [
        "bad:1 constructs DatabaseAccessDenied",
        "bad:2 constructs DatabaseAccessDenied",
        "bad:3 records a violation",
        "bad:4 records a violation",
    ]
    builder = [(REFUSAL_BUILDER, node) for node in ast.walk(bad)]
    assert _refusals_built(iter(builder)) == []
    # The length rule sees a long function, and takes a reason above it.
    body = "".join(f"    x = {n}\n" for n in range(LONG_FUNCTION_LINES))
    long = f"@cache\ndef f():\n{body}"
    assert _long_functions_without_a_reason("bad", long) == ["bad:2 f is 61 lines"]
    assert _long_functions_without_a_reason("bad", "# 61 lines: why\n" + long) == []
