"""The guard on a connection: every statement of the job body judged before it is sent.

:class:`GuardWrapper` is the ``connection.execute_wrapper`` the guard installs (``guard.install``)
for the body only. It builds the :class:`~kumiko_jobs.guard.verdict.Policy` of the call site
from the run's ``Watch`` (grants open now, the schema read, ``system_db``), asks the pure
``classify`` (and ``classify_switch`` for a connection django-tenants points elsewhere) and
hands a refusal to ``guard.denials``, which raises it before the statement reaches PostgreSQL.
The routes past execute wrappers (``cursor.copy()``/``stream()``/``callproc()``, ``dbshell``)
are closed here too (:func:`guarded_routes`), because a guard that any of them bypasses guards
nothing. Reads and writes only the Watch, never the run state: the guard sits below the run
side.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from django.db.backends.utils import CursorDebugWrapper, CursorWrapper
from psycopg import sql as psycopg_sql

from ..core import conf, project_settings
from ..core.grants import Grant
from . import denials, search_path_resync
from .denials import Route
from .judge import Policy, classify, classify_switch
from .parse import statement_shape
from .tables import (
    guarded_sequences,
    kumiko_tables,
    operator_record_tables,
    operator_tables,
    personal_data_columns,
    protected_tables,
    shared_tables,
)
from .watch import Watch

__all__ = [
    "GuardWrapper",
    "GuardedCursor",
    "GuardedDebugCursor",
    "guarded_routes",
]


@contextlib.contextmanager
def guarded_routes(conn: Any, wrapper: GuardWrapper) -> Iterator[None]:
    """Routes past the execute wrappers, closed for the body.

    Django's cursor wrapper hands unknown attributes straight to psycopg, so ``cursor.copy()``
    and ``cursor.stream()`` would reach PostgreSQL without passing any execute wrapper, and
    ``callproc()`` builds its statement inside psycopg's cursor. ``manage.py dbshell`` starts
    ``psql`` with the project's credentials: refused.
    """
    conn.make_cursor = lambda cursor: GuardedCursor(cursor, conn, wrapper)
    conn.make_debug_cursor = lambda cursor: GuardedDebugCursor(cursor, conn, wrapper)
    client = conn.client
    shell = client.runshell

    def refused_shell(parameters: Any) -> None:
        denials.refuse(
            wrapper.watch,
            Route.SHELL,
            f"`dbshell` on alias {conn.alias!r} would start a database client with the "
            "project's credentials, outside the guard and the tenant's schema. Subprocesses "
            "are outside the guard; a job does not start them.",
            enforce=wrapper.enforce,
        )
        shell(parameters)  # log mode

    client.runshell = refused_shell
    try:
        yield
    finally:
        del conn.make_cursor, conn.make_debug_cursor  # back to the class's methods
        with contextlib.suppress(AttributeError):
            del client.runshell


class _GuardsOtherRoutes:
    cursor: Any
    db: Any
    _guard: GuardWrapper

    def __init__(self, cursor: Any, db: Any, guard: GuardWrapper) -> None:
        super().__init__(cursor, db)  # type: ignore[call-arg]
        self._guard = guard

    def _check(self, sql: Any, params: Any) -> None:
        self._guard(_checked_only, sql, params, False, {"connection": self.db, "cursor": self})

    def copy(self, statement: Any, params: Any = None, **kwargs: Any) -> Any:
        self._check(statement, params)
        # psycopg sends the COPY when the caller enters the block, after this returns.
        return self.cursor.copy(statement, params, **kwargs)

    def stream(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        self._check(query, params)
        return self.cursor.stream(query, params, **kwargs)

    def callproc(self, procname: Any, params: Any = None, kparams: Any = None) -> Any:
        """The statement Django's psycopg cursor would build, sent through ``execute``."""
        if kparams is not None:
            return super().callproc(procname, params, kparams)  # type: ignore[misc]
        name = procname if isinstance(procname, psycopg_sql.Identifier) else None
        name = name or psycopg_sql.Identifier(procname)
        args = psycopg_sql.SQL(",").join(psycopg_sql.Literal(arg) for arg in params or ())
        self.execute(psycopg_sql.SQL("SELECT * FROM {}({})").format(name, args))  # type: ignore[attr-defined]
        return params


def _checked_only(sql: Any, params: Any, many: bool, context: Any) -> None:
    """The guard's ``execute`` for copy/stream: the caller runs the statement itself."""


class GuardedCursor(_GuardsOtherRoutes, CursorWrapper):
    """Django's cursor with the routes past the execute wrappers closed."""


class GuardedDebugCursor(_GuardsOtherRoutes, CursorDebugWrapper):
    """Django's debug cursor (DEBUG=True) with the same routes closed."""


class GuardWrapper:
    """The execute wrapper: judges each statement against the run's Watch (grants open now,
    readable schema, system_db), records a denial on it, and reports each grant a statement
    used with ``report_use`` (the escape-hatch audit)."""

    def __init__(self, watch: Watch, *, enforce: bool, report_use: Callable[[Grant], None]):
        self.watch = watch
        self.enforce = enforce
        self.report_use = report_use
        self.schema = watch.schema or project_settings.public_schema_name()
        self.public_schema = project_settings.public_schema_name()
        origin = watch.origin or {}
        self.deny_personal = bool(origin.get("anonymous")) and not origin.get("public_intake")
        self._policies: dict[tuple[tuple[Grant, ...], str | None], Policy] = {}

    def policy(self) -> Policy:
        """The policy of the grants open now (one per combination, built once)."""
        key = (tuple(self.watch.active_grants), self.watch.readable_schema)
        policy = self._policies.get(key)
        if policy is None:
            shared_sequences, operator_sequences, protected_sequences = guarded_sequences()
            policy = Policy(
                schema=self.schema,
                shared_tables=shared_tables() | shared_sequences,
                active_grants=frozenset(key[0]),
                readable_schema=key[1],
                personal_data_columns=personal_data_columns(),
                deny_personal_data_writes=self.deny_personal,
                protected_tables=protected_tables() | protected_sequences,
                operator_tables=operator_tables() | operator_sequences,
                kumiko_tables=kumiko_tables(),
                operator_records=operator_record_tables(),
                public_schema=self.public_schema,
                extra_functions=frozenset(conf.get().GUARD_EXTRA_FUNCTIONS),
                extra_schemas=project_settings.extra_search_paths(),
            )
            self._policies[key] = policy
        return policy

    def __call__(
        self,
        execute: Callable[..., Any],
        sql: Any,
        params: Any,
        many: bool,
        context: Mapping[str, Any],
    ) -> Any:
        watch = self.watch
        conn = context["connection"]
        if watch.system_db_open:
            return execute(sql, params, many, context)
        if watch.tenant is not None and getattr(conn, "schema_name", None) is None:
            denials.refuse_not_a_tenant_alias(watch, conn.alias, enforce=self.enforce)
            return execute(sql, params, many, context)  # log mode
        text = sql if isinstance(sql, str) else _composed_text(sql, context)
        if watch.atomic and statement_shape(text, params is not None).ends_transaction:
            # Whatever the grants: the runner's transaction holds the body and its success.
            denials.refuse(
                watch,
                Route.TRANSACTION,
                "an atomic job cannot end or restart its transaction (BEGIN, COMMIT, ROLLBACK, "
                "two-phase commit): the runner commits the body's writes together with the "
                "run's success. Savepoints (`with transaction.atomic():` inside the job) work; "
                "to commit on your own, drop atomic=True.",
                enforce=self.enforce,
            )
            return execute(sql, params, many, context)
        policy = self.policy()
        verdict = classify(text, policy, parameters=params is not None)
        grants = verdict.grants_used
        switched_to = _switched_schema(conn, policy) if verdict.allowed else None
        if switched_to is not None:
            switch = classify_switch(
                text,
                switched_to,
                policy,
                parameters=params is not None,
                public_schema=self.public_schema,
            )
            verdict = verdict if switch.allowed else switch
            grants = (*grants, *switch.grants_used)
        if verdict.allowed:
            for grant in grants:
                self.report_use(grant)
            shape = statement_shape(text, params is not None)  # cached: classify read it
            # The verdict assumed the path django-tenants set: make sure the server has it
            # (not before django-tenants' own SET, which goes through here to set it).
            if shape.kind != "set_search_path":
                search_path_resync.ensure(conn, execute, context)
            # What the guard allows under unsafe_raw (SET, set_config, session advisory locks,
            # temporary tables, ...) may outlive the statement: the tenancy step resets every
            # session after every run, whatever the guard saw (core.session).
            result = execute(sql, params, many, context)
            if shape.undoes_sets:
                search_path_resync.forget(conn)
            return result
        # Kept on the run (in enforce mode), so a job that catches the exception still fails.
        denials.refuse_statement(watch, verdict, enforce=self.enforce)
        return execute(sql, params, many, context)  # log mode


def _switched_schema(conn: Any, policy: Policy) -> str | None:
    """The schema django-tenants points ``conn`` at, when it is not the run's (or the read one)."""
    schema = getattr(conn, "schema_name", None)
    if schema is None or schema == policy.schema or schema == policy.readable_schema:
        return None
    return str(schema)


def _composed_text(sql: Any, context: Mapping[str, Any]) -> str:
    """psycopg ``Composable`` SQL, rendered the way the server will see it."""
    as_string = getattr(sql, "as_string", None)
    if as_string is None:
        return str(sql)
    return str(as_string(context["connection"].connection))
