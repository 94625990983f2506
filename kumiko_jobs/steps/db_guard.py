"""Check every SQL statement of the job body against the grants the job opened.

Installed with ``connection.execute_wrapper`` on every database alias, for the job body only:
the runner's own history writes happen outside it. The classification is ``guard.classify``
(pure); this module builds the policy for the call site and turns a refusal into
``DatabaseAccessDenied`` before the statement reaches PostgreSQL.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Mapping
from functools import cache
from typing import Any

from django.apps import apps
from django.db import connections
from django.db.backends.utils import CursorDebugWrapper, CursorWrapper

from .. import audit, conf
from ..context import RunState
from ..exceptions import DatabaseAccessDenied
from ..guard import Grant, Policy, Verdict, classify
from ..pipeline import Next

logger = logging.getLogger("kumiko_jobs.guard")

PERSONAL_DATA_ATTRIBUTE = "kumiko_personal_data"


@cache
def shared_tables() -> frozenset[str]:
    """Tables that exist only in public: models of SHARED_APPS that are not also TENANT_APPS."""
    shared, tenant = conf.shared_apps()
    tables = set(conf.get().EXTRA_SHARED_TABLES)
    for config in apps.get_app_configs():
        if config.name in shared and config.name not in tenant:
            for model in config.get_models(include_auto_created=True):
                tables.add(model._meta.db_table.lower())
    return frozenset(tables)


@cache
def protected_tables() -> frozenset[str]:
    """kumiko_jobs' own tables and the tenant and domain tables: no grant writes them."""
    from django_tenants.utils import get_tenant_domain_model, get_tenant_model

    models = [
        *apps.get_app_config("kumiko_jobs").get_models(),
        get_tenant_model(),
        get_tenant_domain_model(),
    ]
    return frozenset(model._meta.db_table.lower() for model in models)


@cache
def personal_data_columns() -> Mapping[str, frozenset[str]]:
    """``{table: columns}`` from models that list ``kumiko_personal_data = ["field", ...]``."""
    found: dict[str, frozenset[str]] = {}
    for model in apps.get_models():
        names = getattr(model, PERSONAL_DATA_ATTRIBUTE, None)
        if names:
            columns = {
                str(getattr(model._meta.get_field(name), "column", name)).lower() for name in names
            }
            found[model._meta.db_table.lower()] = frozenset(columns)
    return found


def db_guard(state: RunState, call_next: Next) -> None:
    mode = conf.get().DB_GUARD
    if mode == "off":
        call_next(state)
        return
    wrapper = GuardWrapper(state, enforce=mode == "enforce")
    with contextlib.ExitStack() as stack:
        for conn in connections.all():
            stack.enter_context(conn.execute_wrapper(wrapper))
            stack.enter_context(_guarded_cursors(conn, wrapper))
        call_next(state)


@contextlib.contextmanager
def _guarded_cursors(conn: Any, wrapper: GuardWrapper) -> Iterator[None]:
    """Route psycopg's ``cursor.copy()`` and ``cursor.stream()`` through the guard too.

    Django's cursor wrapper hands unknown attributes straight to psycopg, so those two would
    reach PostgreSQL without passing any execute wrapper.
    """
    conn.make_cursor = lambda cursor: GuardedCursor(cursor, conn, wrapper)
    conn.make_debug_cursor = lambda cursor: GuardedDebugCursor(cursor, conn, wrapper)
    try:
        yield
    finally:
        del conn.make_cursor, conn.make_debug_cursor  # back to the class's methods


class _GuardsCopyAndStream:
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
        return self.cursor.copy(statement, params, **kwargs)

    def stream(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        self._check(query, params)
        return self.cursor.stream(query, params, **kwargs)


def _checked_only(sql: Any, params: Any, many: bool, context: Any) -> None:
    """The guard's ``execute`` for copy/stream: the caller runs the statement itself."""


class GuardedCursor(_GuardsCopyAndStream, CursorWrapper):
    pass


class GuardedDebugCursor(_GuardsCopyAndStream, CursorDebugWrapper):
    pass


class GuardWrapper:
    def __init__(self, state: RunState, *, enforce: bool):
        self.state = state
        self.enforce = enforce
        env = state.envelope
        self.schema = env.schema or conf.public_schema_name()
        origin = env.origin or {}
        self.deny_personal = bool(origin.get("anonymous")) and not origin.get("public_intake")
        self._policies: dict[tuple[tuple[str, ...], str | None], Policy] = {}
        self._read_only: dict[str, Policy] = {}

    def policy(self) -> Policy:
        key = (tuple(self.state.active_grants), self.state.readable_schema)
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
                extra_functions=frozenset(conf.get().GUARD_EXTRA_FUNCTIONS),
                extra_schemas=conf.extra_search_paths(),
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
        state = self.state
        if state.system_db_open:
            return execute(sql, params, many, context)
        text = sql if isinstance(sql, str) else _composed_text(sql, context)
        policy = self.policy()
        verdict = classify(text, policy, parameters=params is not None)
        grants = verdict.grants_used
        switched_to = _switched_schema(context["connection"], policy) if verdict.allowed else None
        if switched_to is not None:
            verdict, grants = self._judge_switch(text, params, switched_to, policy, verdict)
        if verdict.allowed:
            for grant in grants:
                audit.record_use(state, str(grant))
            return execute(sql, params, many, context)
        message = denial_message(state, verdict)
        if not self.enforce:
            logger.warning("DB guard (log mode) would deny: %s", message)
            return execute(sql, params, many, context)
        # Kept on the run, so a job that catches the exception still fails.
        state.guard_violations.append(message)
        raise DatabaseAccessDenied(
            message,
            job_name=state.envelope.job,
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
        if schema != conf.public_schema_name():
            read_only = self._read_only.get(schema)
            if read_only is None:
                read_only = self._read_only[schema] = Policy(
                    schema=self.schema,
                    shared_tables=shared_tables(),
                    active_grants=frozenset({Grant.CROSS_TENANT_READS}),
                    readable_schema=schema,
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


def denial_message(state: RunState, verdict: Verdict) -> str:
    job = state.envelope.job
    where = state.envelope.schema or "public"
    text = f"Job {job!r} (tenant {where}) was denied a {verdict.kind} statement: {verdict.reason}."
    if state.definition.system and verdict.rule == "shared_write":
        return text + " System jobs write inside `with ctx.system_db():`."
    if verdict.grant_needed is not None:
        grant = str(verdict.grant_needed)
        if grant in state.definition.grants:
            return text + f" The job declares {grant!r}: wrap this code in `with ctx.{grant}():`."
        return (
            text + f" If this is intended, declare escape_hatch=EscapeHatch(reason='...', "
            f"grants=[{grant!r}]) on the job and wrap the code in `with ctx.{grant}():`."
        )
    if verdict.rule == "public_intake_required":
        return text + (
            " No grant allows this (rule public_intake_required): enqueue it from a view marked "
            "@kumiko_jobs.origin.public_intake if anonymous visitors may submit this data."
        )
    if verdict.rule == "protected":
        return text + (
            " No grant allows this: runs and tenants are changed through the admin, "
            "manage.py, or a system job inside ctx.system_db()."
        )
    return text + " No grant allows this; run a job in that tenant instead."
