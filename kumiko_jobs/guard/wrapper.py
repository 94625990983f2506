"""The guard on a connection: every statement of the job body judged before it is sent.

:class:`GuardWrapper` is the ``connection.execute_wrapper`` the guard installs (``guard.install``)
for the body only. It builds the :class:`~kumiko_jobs.guard.judge.Policy` of the call site from
the run's ``Watch`` (grants open now, the schema read, ``system_db``), asks the pure
``classify`` and turns a refusal into ``DatabaseAccessDenied`` before the statement reaches
PostgreSQL. The routes past execute wrappers (``cursor.copy()``/``stream()``/``callproc()``,
``dbshell``) are closed here too (:func:`guarded_routes`), because a guard that any of them
bypasses guards nothing. Reads and writes only the Watch, never the run state: the guard sits
below the run side.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from django.db.backends.utils import CursorDebugWrapper, CursorWrapper
from psycopg import sql as psycopg_sql

from ..core import conf, project_settings
from ..core.exceptions import DatabaseAccessDenied
from .judge import Grant, Policy, Verdict, classify
from .parse import statement_shape
from .tables import (
    kumiko_tables,
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
    "denial_message",
    "guarded_routes",
    "not_a_tenant_alias",
    "refuse",
]

logger = logging.getLogger("kumiko_jobs.guard")


def not_a_tenant_alias(conn: Any) -> str:
    """Why a connection that is not django-tenants' cannot serve a tenant run."""
    return (
        f"alias {conn.alias!r} is not a django-tenants connection, so the guard cannot tell "
        "which schema its unqualified names mean. Tenant runs use django-tenants aliases only."
    )


def refuse(watch: Watch, enforce: bool, kind: str, reason: str) -> None:
    """Deny what is not a statement (a connection, a shell, a transaction end): recorded on the
    Watch and raised in enforce mode, only logged in log mode."""
    message = f"Job {watch.job!r} (tenant {watch.schema or 'public'}): {reason}"
    if not enforce:
        logger.warning("DB guard (log mode) would deny: %s", message)
        return
    watch.violations.append(message)
    raise DatabaseAccessDenied(message, job_name=watch.job, kind=kind)


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
        refuse(
            wrapper.watch,
            wrapper.enforce,
            "shell",
            f"`dbshell` on alias {conn.alias!r} would start a database client with the "
            "project's credentials, outside the guard and the tenant's schema. Subprocesses "
            "are outside the guard; a job does not start them.",
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

    def __init__(self, watch: Watch, *, enforce: bool, report_use: Callable[[str], None]):
        self.watch = watch
        self.enforce = enforce
        self.report_use = report_use
        self.schema = watch.schema or project_settings.public_schema_name()
        origin = watch.origin or {}
        self.deny_personal = bool(origin.get("anonymous")) and not origin.get("public_intake")
        self._policies: dict[tuple[tuple[str, ...], str | None], Policy] = {}
        self._read_only: dict[str, Policy] = {}

    def policy(self) -> Policy:
        """The policy of the grants open now (one per combination, built once)."""
        key = (tuple(self.watch.active_grants), self.watch.readable_schema)
        policy = self._policies.get(key)
        if policy is None:
            grants = frozenset(Grant(g) for g in key[0] if g in Grant.__members__.values())
            policy = Policy(
                schema=self.schema,
                shared_tables=shared_tables(),
                active_grants=grants,
                readable_schema=key[1],
                personal_data_columns=personal_data_columns(),
                deny_personal_data_writes=self.deny_personal,
                protected_tables=protected_tables(),
                operator_tables=operator_tables(),
                kumiko_tables=kumiko_tables(),
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
            refuse(
                watch,
                self.enforce,
                "database",
                not_a_tenant_alias(conn),
            )
            return execute(sql, params, many, context)  # log mode
        text = sql if isinstance(sql, str) else _composed_text(sql, context)
        if watch.atomic and statement_shape(text, params is not None).ends_transaction:
            # Whatever the grants: the runner's transaction holds the body and its success.
            refuse(
                watch,
                self.enforce,
                "transaction",
                "an atomic job cannot end or restart its transaction (BEGIN, COMMIT, ROLLBACK, "
                "two-phase commit): the runner commits the body's writes together with the "
                "run's success. Savepoints (`with transaction.atomic():` inside the job) work; "
                "to commit on your own, drop atomic=True.",
            )
            return execute(sql, params, many, context)
        policy = self.policy()
        verdict = classify(text, policy, parameters=params is not None)
        grants = verdict.grants_used
        switched_to = _switched_schema(context["connection"], policy) if verdict.allowed else None
        if switched_to is not None:
            verdict, grants = self._judge_switch(text, params, switched_to, policy, verdict)
        if verdict.allowed:
            for grant in grants:
                self.report_use(str(grant))
            # What the guard allows under unsafe_raw (SET, set_config, session advisory locks,
            # temporary tables, ...) may outlive the statement: the tenancy step resets every
            # session after every run, whatever the guard saw (core.session).
            return execute(sql, params, many, context)
        message = denial_message(watch, verdict)
        if not self.enforce:
            logger.warning("DB guard (log mode) would deny: %s", message)
            return execute(sql, params, many, context)
        # Kept on the run, so a job that catches the exception still fails.
        watch.violations.append(message)
        raise DatabaseAccessDenied(
            message,
            job_name=watch.job,
            kind=verdict.kind,
            grant=str(verdict.grant_needed) if verdict.grant_needed else None,
        )

    def _judge_switch(
        self, text: str, params: Any, schema: str, policy: Policy, verdict: Verdict
    ) -> tuple[Verdict, tuple[Grant, ...]]:
        """A statement on a connection that django-tenants points at another ``schema``.

        The switch is judged like the ``SET search_path`` django-tenants sends for it, which the
        guard does not see for server-side cursors (``QuerySet.iterator()``: a raw psycopg
        cursor). As the schema is known, only plain reads may follow when it is another tenant's:
        unqualified names mean that tenant, and no grant allows writing outside the run's schema.
        """
        switched = classify(f'SET search_path = "{schema}"', policy, parameters=False)
        if not switched.allowed:
            return switched, ()
        if schema != project_settings.public_schema_name():
            read_only = self._read_only.get(schema)
            if read_only is None:
                read_only = self._read_only[schema] = Policy(
                    schema=self.schema,
                    shared_tables=shared_tables(),
                    active_grants=frozenset({Grant.CROSS_TENANT_READS}),
                    readable_schema=schema,
                    operator_tables=policy.operator_tables,
                    kumiko_tables=policy.kumiko_tables,
                    extra_functions=policy.extra_functions,
                    extra_schemas=policy.extra_schemas,
                )
            reading = classify(text, read_only, parameters=params is not None)
            if not reading.allowed:
                reason = (
                    f"the connection is switched to schema '{schema}' (django-tenants): a tenant "
                    f"run may only read there, never write or lock rows outside its own schema"
                )
                return Verdict(False, reading.kind, None, None, reason, "cross_schema"), ()
        return verdict, (*verdict.grants_used, *switched.grants_used)


def _switched_schema(conn: Any, policy: Policy) -> str | None:
    """The schema django-tenants points ``conn`` at, when it is not the run's (or the read) one."""
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


# How the job opens each grant's block, as the hint writes it: cross_tenant_reads names the
# tenant it reads (a bare ``ctx.cross_tenant_reads()`` would be a TypeError).
_GRANT_OPENERS = {"cross_tenant_reads": "ctx.cross_tenant_reads(other_tenant)"}


def denial_message(watch: Watch, verdict: Verdict) -> str:
    """The denial as the job's author reads it: what was refused and the way to do it right
    (the grant to declare or open, or why no grant allows it)."""
    job = watch.job
    where = watch.schema or "public"
    kind = verdict.kind
    article = "an" if kind[:1] in "aeiou" else "a"
    text = f"Job {job!r} (tenant {where}) was denied {article} {kind} statement: {verdict.reason}."
    if watch.system and verdict.rule == "shared_write":
        return text + " System jobs write inside `with ctx.system_db():`."
    if verdict.grant_needed is not None:
        grant = str(verdict.grant_needed)
        opener = _GRANT_OPENERS.get(grant, f"ctx.{grant}()")
        if grant in watch.declared_grants:
            return text + f" The job declares {grant!r}: wrap this code in `with {opener}:`."
        return (
            text + f" If this is intended, declare escape_hatch=EscapeHatch(reason='...', "
            f"grants=[{grant!r}]) on the job and wrap the code in `with {opener}:`."
        )
    if verdict.rule == "public_intake_required":
        return text + (
            " No grant allows this (rule public_intake_required): enqueue it from a view marked "
            "@kumiko_jobs.origin.public_intake if anonymous visitors may submit this data."
        )
    if verdict.rule == "protected":
        return text + (
            " No grant allows this: kumiko's history is read through its API (a run's "
            "own results: RunHandle.refresh(), get_result()); runs and tenants are changed "
            "through the admin, manage.py, or a system job inside ctx.system_db()."
        )
    if verdict.rule in ("operators", "catalog"):
        return text + " No grant allows this in a tenant run."
    return text + " No grant allows this; run a job in that tenant instead."
