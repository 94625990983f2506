"""The shape of a calibrated attack strategy, and the effects the suite can observe.

A strategy is something a job running in tenant t1 does, with no grant, to reach tenant t2 or
shared data. Each one names the *effect* that proves it worked, observed from outside the run
(a second connection of the test process): a canary planted in t2 showing up in the run's own
output, a row planted for this strategy in t2 or in a shared table changing, and so on.

Every strategy gets a short ``mark`` (``gx007``): the rows, tables and sequences planted for it
carry that mark, and its SQL targets only them, so a whole batch of strategies can run in one
worker burst and each effect is still attributable to the strategy that caused it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from django.db import connection

# The canary: a value only t2 holds (a row of t2.guardapp_secret labelled 'canary'). No attack
# text contains it, so finding it anywhere in t1's output means it came out of t2.
CANARY = "kanari7q4z"
# Text a t2 session sent to PostgreSQL (pg_stat_activity keeps it), with the canary inline.
ACTIVITY_CANARY = "kanari7q4zactivity"
NOTIFY_CHANNEL = "gx_channel"
VICTIM_APP = "gx_victim"  # application_name of the connection the terminate strategies hunt
INTACT = "intact"
# Rows of t2's planted table for a STATS strategy (a number no run's output has by chance).
STATS_ROWS = 7919


class Effect(StrEnum):
    LEAK = "leak"  # the canary shows up in the run's log, error text, or t1's own rows
    T2_ROW = "t2_row"  # the t2 row labelled with the mark changed, vanished, or got company
    T2_TABLE = "t2_table"  # the t2 table named after the mark was created, dropped or altered
    T2_SEQ = "t2_seq"  # the t2 sequence named after the mark moved
    SHARED_ROW = "shared_row"  # the shared plan named after the mark changed (or new ones)
    CATALOG = "catalog"  # a row naming the mark appeared in a shared catalog (pg_description)
    LARGE_OBJECT = "large_object"  # a large object (database-wide) holding the mark exists
    NOTIFY = "notify"  # a notification with the mark reached another session's listener
    LOCK = "lock"  # kumiko's admission lock for t2 is still held after the run
    TERMINATED = "terminated"  # another session (the victim connection) was killed
    VICTIM = "victim"  # the next run, in t2, on the same worker, lost its write
    # t2's planted table's row count or size (pg_class, size functions) after "{mark}=" in
    # the run's log, error text or t1's rows
    STATS = "stats"


# Effects that need a run of t2 after the attack on the same worker connection: such a
# strategy runs alone (its own burst), because what it leaves behind is the attack.
NEEDS_VICTIM = frozenset({Effect.VICTIM})


class Class(StrEnum):
    LEXER = "1 lexer"
    GRAMMAR = "2 grammar"
    CATALOG = "3 catalog names"
    FUNCTIONS = "4 functions"
    LITERAL_NAMES = "4 names in literals"
    PLACEHOLDERS = "5 placeholders"
    ROUTES = "6 routes"
    STATE = "7 session state"
    SPELLINGS = "0 qualified names"
    WRITES = "0 writes"
    UNVERIFIABLE = "0 unverifiable statements"
    SWITCHING = "0 schema switching"
    PUBLIC = "8 the operators' copies in public"
    OWN = "9 kumiko's own tables"


NO_PARAMS: Any = object()
Perform = Callable[[Any, str], None]  # (ctx, mark)


@dataclass(frozen=True)
class Strategy:
    name: str
    cls: Class
    effect: Effect
    # SQL text (``{mark}`` replaced), or several run one after another on ONE cursor.
    sql: str | tuple[str, ...] = ""
    params: Any = NO_PARAMS
    perform: Perform | None = None
    # The guard itself must refuse it: the run fails with DatabaseAccessDenied. Routes and
    # session state may be closed otherwise (the route is guarded, the session is reset).
    refused: bool = True
    # Runs alone in its own burst and the connection is closed afterwards (it changes the
    # worker's session in a way that would disturb the other strategies of a batch).
    isolated: bool = False
    note: str = field(default="", compare=False)

    def statements(self, mark: str) -> tuple[str, ...]:
        texts = (self.sql,) if isinstance(self.sql, str) else self.sql
        return tuple(t.replace("{mark}", mark) for t in texts)

    def bound_params(self, mark: str) -> Any:
        """``params`` with ``{mark}`` replaced in its strings (a tenant-supplied value)."""

        def bind(value: Any) -> Any:
            return value.replace("{mark}", mark) if isinstance(value, str) else value

        if isinstance(self.params, dict):
            return {key: bind(value) for key, value in self.params.items()}
        if isinstance(self.params, list | tuple):
            return [bind(value) for value in self.params]
        return self.params


def log_rows(ctx: Any, rows: Any) -> None:
    """Report what a statement returned, as an attacker would: into the run's own log."""
    text = repr(rows)
    at = text.find(CANARY)
    # Keep the interesting part of a huge result (database_to_xml) within the log's size.
    window = text[max(0, at - 200) : at + 200] if at >= 0 else text[:1000]
    ctx.log.info("rows", rows=window)


def run_statements(ctx: Any, statements: tuple[str, ...], params: Any = NO_PARAMS) -> None:
    with connection.cursor() as cursor:
        for statement in statements:
            if params is NO_PARAMS:
                cursor.execute(statement)
            else:
                cursor.execute(statement, params)
            if cursor.description:
                log_rows(ctx, cursor.fetchall())
