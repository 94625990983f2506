"""Differential fuzz of the guard's classifier against PostgreSQL itself.

Hypothesis builds statements out of the pieces where a hand-written lexer and PostgreSQL's
disagree (comments ended by ``\\r``, bytes >= 0x80 continuing identifiers before ``$$``,
dollar quotes, ``%`` forms sent verbatim, quotes, nested parentheses, keyword aliases, catalog
names) around a reference to another tenant's schema (t2), and around harmless t1 statements.
Each statement goes to the pure ``guard.classify`` with the policy of a grant-less run in t1.
Whenever the guard ALLOWS it, the statement runs for real, on its own connection, with
``search_path = t1, public``, inside a transaction that is rolled back; before the rollback,
``pg_stat_xact_user_tables`` tells which tables PostgreSQL scanned or changed in that
transaction. Any table outside t1 (or a write to public), or t2's canary in the result, is a
bypass: the guard let through what it exists to stop.

A fuzz that denies everything proves nothing, so the test also requires a reasonable number of
statements that were allowed and executed. The second test loads the hand-written lexer the
guard had before the pglast rewrite (from git history) and shows the same fuzz finds bypasses
in it.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import psycopg
import pytest
from django.db import connection
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from kumiko_jobs import guard
from kumiko_jobs.guard.tables import protected_tables, shared_tables
from tests.guardapp import support
from tests.guardapp.attacks_base import CANARY

pytestmark = pytest.mark.usefixtures("live_db")

ROOT = Path(__file__).resolve().parents[2]
# The last commit whose guard.py is the hand-written lexer (the rewrite to pglast follows it).
OLD_GUARD_COMMIT = "e233d1b"
EXAMPLES = 400
MIN_ALLOWED_AND_EXECUTED = 50  # a parse-tree classifier sketch (pglast) allowed+ran 73

T2 = "t2.guardapp_secret"
# Statements a grant-less t1 run may send: each must be allowed and must run.
HARMLESS = [
    "SELECT 1",
    "SELECT value FROM guardapp_secret",
    "SELECT 'x'",
    "SELECT label AS a FROM guardapp_secret WHERE id > 0",
    "SELECT count(*) FROM guardapp_secret s JOIN guardapp_finding f ON f.key = s.label",
    "INSERT INTO guardapp_finding (key, value) VALUES ('k', 'v')",
    "UPDATE guardapp_finding SET value = 'w' WHERE key = 'k'",
    "SELECT name FROM catalog_plan",
    "WITH x AS (SELECT 1 AS n) SELECT n FROM x",
    "SELECT relname FROM pg_class WHERE relname = 'guardapp_secret'",
]
# Pieces that open something in one lexer and perhaps not in the other, with what may close it.
PAIRS = [
    ("--", ""), ("--'", ""), ("/*", "*/"), ("/* /* */", "*/"), ("'", "'"), ("E'\\'", "'"),
    ("'\\'", "'"), ("U&'", "'"), ('"', '"'), ("$$", "$$"), ("$a$", "$a$"), ("a€$$", "a€$$"),
    ("a\xa0$$", "b\xa0$$"), ("٣$$", "٣$$"), ("🙈$$", "🙈$$"), ("é$$", "é$$"), ("x$$", "x$$"),
    ("%(", ")s"), ("%(length('x)s'))", "--'"), ("%s", ""), ("(", ")"), ("((", "))"),
    ("AS set,", ""), ('AS "is" distinct', ""), ("::text", ""), ("||", ""), (";", ""),
]  # fmt: skip
BREAKS = ["\n", "\r", "\f", "\v", " ", "\t", "\xa0", "\x85", "\u3000", "\r\n", ""]
# References to t2 (or writes to a shared table), as PostgreSQL would run them.
PAYLOADS = [
    f"UNION SELECT value FROM {T2}",
    f"FROM {T2}",
    f", (SELECT value FROM {T2} LIMIT 1)",
    f"|| (SELECT value FROM {T2} LIMIT 1)",
    f"; SELECT value FROM {T2}",
    f"; DELETE FROM {T2}",
    f"; UPDATE {T2} SET value = value",
    f"; TABLE {T2}",
    f"FROM ONLY ({T2})",
    f"FROM ({T2} s CROSS JOIN (SELECT 1) o)",
    f"FROM guardapp_secret set, {T2} x",
    "; UPDATE catalog_plan SET monthly_price = monthly_price",
    "; UPDATE pg_settings SET setting = 't2' WHERE name = 'search_path'; TABLE guardapp_secret",
    "; SELECT most_common_vals::text, histogram_bounds::text FROM pg_stats",
    "; WITH RECURSIVE r(n) AS (SELECT 1) SEARCH DEPTH FIRST BY n SET o "
    f"UPDATE {T2} SET value = value",
]


def _statement() -> st.SearchStrategy[str]:
    harmless = st.builds(
        lambda head, brk, tail: head + brk + tail,
        st.sampled_from(HARMLESS),
        st.sampled_from(BREAKS),
        st.sampled_from(["", "-- note", "/* note */", " ", "; ", "\r"]),
    )
    brk = st.sampled_from(BREAKS)
    attack = st.builds(
        lambda head, b1, pair, b2, payload, b3, noise: (
            head + b1 + pair[0] + b2 + payload + b3 + pair[1] + noise
        ),
        st.sampled_from(HARMLESS[:4]),
        brk,
        st.sampled_from(PAIRS),
        brk,
        st.sampled_from(PAYLOADS),
        brk,
        st.sampled_from(["", "", "", *(p[0] for p in PAIRS)]),
    )
    return st.one_of(harmless, attack, attack)


@dataclass
class Report:
    examples: int = 0
    allowed: int = 0
    executed: int = 0
    bypasses: list[tuple[str, str]] = field(default_factory=list)

    def summary(self, label: str) -> str:
        return (
            f"fuzz[{label}]: {self.examples} examples, {self.allowed} allowed by the guard, "
            f"{self.executed} of those executed by PostgreSQL, {len(self.bypasses)} bypasses"
        )


# Per-table activity of this backend not yet reported (this transaction's, and possibly earlier
# ones'): compared before and after the statement, the difference is the statement's.
_ACTIVITY = """
    SELECT schemaname, relname, seq_scan + coalesce(idx_scan, 0), n_tup_ins + n_tup_upd + n_tup_del
    FROM pg_stat_xact_user_tables WHERE schemaname <> 't1'
"""


def _activity(conn: psycopg.Connection[Any]) -> dict[tuple[str, str], tuple[int, int]]:
    return {(r[0], r[1]): (r[2], r[3]) for r in conn.execute(_ACTIVITY).fetchall()}


def _touched(
    before: dict[tuple[str, str], tuple[int, int]], after: dict[tuple[str, str], tuple[int, int]]
) -> list[str]:
    """Tables outside t1 the statement scanned or changed; public only counts when written."""
    found = []
    for (schema, table), (scans, writes) in sorted(after.items()):
        old_scans, old_writes = before.get((schema, table), (0, 0))
        if writes > old_writes or (schema != "public" and scans > old_scans):
            found.append(f"{schema}.{table}")
    return found


def _run_and_watch(conn: psycopg.Connection[Any], sql: str) -> tuple[bool, str]:
    """Run ``sql`` as a t1 job would (no parameters: sent verbatim) and roll it back.

    Returns (executed, what it touched outside t1 or leaked; '' if nothing)."""
    with conn.transaction(force_rollback=True):
        conn.execute("SET LOCAL search_path = t1, public")
        before = _activity(conn)
        try:
            with conn.transaction():  # a savepoint: an error leaves the outer one usable
                cursor = psycopg.ClientCursor(conn)
                cursor.execute(sql)
                results = []
                while True:
                    if cursor.description:
                        results.extend(cursor.fetchall())
                    if not cursor.nextset():
                        break
        except psycopg.Error:
            return False, ""
        # Anything PostgreSQL changed in the savepoint still counts in this transaction.
        touched = _touched(before, _activity(conn))
    leaked = CANARY in repr(results) or "t2-value" in repr(results)
    what = ", ".join(touched) + (" canary in the result" if leaked else "")
    return True, what.strip()


def _fuzz(classify: Callable[[str, Any], Any], policy: Any) -> Report:
    report = Report()
    observer = support.Observer()
    try:
        observer.rows(
            "INSERT INTO t2.guardapp_secret (label, value) VALUES ('canary', %s)", (CANARY,)
        )
        observer.rows("ANALYZE t2.guardapp_secret")
        conn = observer.connect(autocommit=False)
        observer.sessions.append(conn)  # closed with the observer, whatever happens
        conn.execute("SET statement_timeout = '2s'")
        conn.commit()

        @settings(
            max_examples=EXAMPLES,
            derandomize=True,
            database=None,
            deadline=None,
            phases=[Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        @given(_statement())
        def examine(sql: str) -> None:
            report.examples += 1
            if not classify(sql, policy).allowed:
                return
            report.allowed += 1
            executed, touched = _run_and_watch(conn, sql)
            report.executed += executed
            if touched:
                report.bypasses.append((sql, touched))

        examine()
    finally:
        observer.close()
    return report


def _policy(module: ModuleType) -> Any:
    return module.Policy(
        schema="t1",
        shared_tables=shared_tables(),
        protected_tables=protected_tables(),
    )


def _show(report: Report, label: str) -> str:
    lines = [report.summary(label)]
    lines += [
        f"  BYPASS {sql!r}\n    PostgreSQL touched: {what}" for sql, what in report.bypasses[:25]
    ]
    text = "\n".join(lines)
    print(text)
    return text


@pytest.fixture
def fuzz_data(tenants: Any) -> Iterator[None]:
    support.seed()
    yield
    support.clean()


def test_the_guard_never_allows_what_postgresql_runs_against_another_schema(fuzz_data):
    report = _fuzz(guard.classify, _policy(guard))
    text = _show(report, "current guard")
    assert report.bypasses == [], text
    assert report.examples == EXAMPLES
    # Proof that the fuzz exercises the allowed path, not only denials.
    assert report.executed >= MIN_ALLOWED_AND_EXECUTED, text


@pytest.fixture
def old_guard() -> Iterator[ModuleType]:
    """guard.py as it was before the pglast rewrite, imported from git history."""
    try:
        source = subprocess.run(
            ["git", "-C", str(ROOT), "show", f"{OLD_GUARD_COMMIT}:kumiko_jobs/guard.py"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"the hand-written guard of {OLD_GUARD_COMMIT} is not available: {exc}")
    name = "kumiko_old_hand_lexer_guard"
    spec = importlib.util.spec_from_loader(name, loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is built
    try:
        exec(compile(source, f"{OLD_GUARD_COMMIT}:kumiko_jobs/guard.py", "exec"), module.__dict__)
        yield module
    finally:
        del sys.modules[name]


def test_the_same_fuzz_finds_bypasses_in_the_old_hand_written_lexer(fuzz_data, old_guard):
    report = _fuzz(old_guard.classify, _policy(old_guard))
    text = _show(report, f"hand-written lexer of {OLD_GUARD_COMMIT}")
    assert report.executed >= MIN_ALLOWED_AND_EXECUTED, text
    assert len(report.bypasses) >= 1, text


def test_the_fuzz_sees_a_read_of_another_schema_when_one_happens(fuzz_data):
    """The detector itself: a plain read of t2, run on the fuzz's connection, is reported."""
    observer = support.Observer()
    try:
        observer.rows(
            "INSERT INTO t2.guardapp_secret (label, value) VALUES ('canary', %s)", (CANARY,)
        )
        conn = observer.connect(autocommit=False)
        observer.sessions.append(conn)
        assert _run_and_watch(conn, f"SELECT 1 FROM {T2} WHERE label <> ''") == (
            True,
            "t2.guardapp_secret",
        )
        executed, what = _run_and_watch(conn, "SELECT 'x'; UPDATE catalog_plan SET name = name")
        assert (executed, what) == (True, "public.catalog_plan")
        assert _run_and_watch(conn, "SELECT value FROM guardapp_secret") == (True, "")
        assert _run_and_watch(conn, "SELECT nonsense(") == (False, "")
    finally:
        observer.close()
    assert connection.settings_dict["NAME"].startswith("test_")
