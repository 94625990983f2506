"""Every refusal of the guard and of the tenant's login, built in one place.

A refusal has three parts that must agree: the message the job's author reads (which job, in
which tenant, what was refused and the way to do it right), the violation kept on the run's
``Watch`` (so that a job that catches the exception still fails) and the
``DatabaseAccessDenied`` raised, whose ``kind`` is the statement's kind or the :class:`Route`
refused and whose ``grant`` is the one that would allow it. Each refusal is one function here;
nothing else in the package builds a ``DatabaseAccessDenied`` or records a violation
(``tests/unit/test_layers.py`` keeps it so).

Two families:

* a **statement** the judge refused (:func:`refuse_statement`), with a hint chosen by the
  verdict's ``Rule`` (:data:`NO_GRANT_HINTS`) or the grant that would allow it;
* a **route** that is no statement (:class:`Route`): a connection the guard cannot place, a
  shell, the end of an atomic job's transaction, a connection opened outside the body or with
  the project's credentials, PostgreSQL's own ``permission denied``.

In ``log`` mode (``DB_GUARD``) a refusal of the body's guard is only logged ("DB guard (log
mode) would deny"); what the tenant's login and a run's end refuse is refused in every mode.
"""

from __future__ import annotations

import logging
from enum import StrEnum
from types import MappingProxyType

from ..core.exceptions import DatabaseAccessDenied
from ..core.grants import Grant
from .verdict import Rule, Verdict
from .watch import Watch

__all__ = [
    "NO_GRANT_HINTS",
    "Route",
    "privilege_denied",
    "record_privilege_denial",
    "refuse",
    "refuse_not_a_tenant_alias",
    "refuse_outside_body",
    "refuse_statement",
    "statement_message",
    "swallowed",
]

logger = logging.getLogger("kumiko_jobs.guard")


class Route(StrEnum):
    """A way to PostgreSQL the guard refuses that is not a judged statement; the value is the
    refusal's ``DatabaseAccessDenied.kind`` (docs/guard.md, "Every route")."""

    # An alias that is not django-tenants' (the schema of its names is unknown), or one
    # connected in another thread during the body (the async ORM).
    DATABASE = "database"
    # ``manage.py dbshell``: a database client with the project's credentials.
    SHELL = "shell"
    # BEGIN, COMMIT, ROLLBACK in an atomic job: the runner's transaction holds the body.
    TRANSACTION = "transaction"
    # A connection opened from the run's context outside the body (after the run, another
    # thread) or, under DB_ROLES, with the project's credentials during it.
    CONNECTION = "connection"
    # PostgreSQL's ``permission denied`` to the tenant's login (the second wall).
    PRIVILEGE = "privilege"


# The hint after a statement's refusal when no grant allows it, by the rule that refused it.
# Every rule has one (a new rule without a hint fails tests/unit/test_guard.py).
_ANOTHER_TENANT = " No grant allows this; run a job in that tenant instead."
_NOT_IN_A_TENANT_RUN = " No grant allows this in a tenant run."
NO_GRANT_HINTS: MappingProxyType[Rule, str] = MappingProxyType(
    {
        Rule.PUBLIC_INTAKE_REQUIRED: (
            f" No grant allows this (rule {Rule.PUBLIC_INTAKE_REQUIRED}): enqueue it from a view "
            "marked @kumiko_jobs.origin.public_intake if anonymous visitors may submit this data."
        ),
        Rule.PROTECTED: (
            " No grant allows this: kumiko's history is read through its API (a run's "
            "own results: RunHandle.refresh(), get_result()); runs and tenants are changed "
            "through the admin, manage.py, or a system job inside ctx.system_db()."
        ),
        Rule.OPERATORS: _NOT_IN_A_TENANT_RUN,
        Rule.CATALOG: _NOT_IN_A_TENANT_RUN,
        Rule.CROSS_SCHEMA: _ANOTHER_TENANT,
        Rule.READ_ONLY: _ANOTHER_TENANT,
        Rule.SHARED_WRITE: _ANOTHER_TENANT,
        Rule.UNVERIFIABLE: _ANOTHER_TENANT,
    }
)

# How the job opens each grant's block, as the hint writes it: cross_tenant_reads names the
# tenant it reads (a bare ``ctx.cross_tenant_reads()`` would be a TypeError).
_GRANT_OPENERS = {Grant.CROSS_TENANT_READS: "ctx.cross_tenant_reads(other_tenant)"}


def _who(watch: Watch) -> str:
    return f"Job {watch.job!r} (tenant {watch.schema or 'public'})"


def statement_message(watch: Watch, verdict: Verdict) -> str:
    """The refusal of a statement as the job's author reads it: what was refused and the way to
    do it right (the grant to declare or open, or why no grant allows it)."""
    kind = verdict.kind
    article = "an" if kind[:1] in "aeiou" else "a"
    text = f"{_who(watch)} was denied {article} {kind} statement: {verdict.reason}."
    if watch.system and verdict.rule is Rule.SHARED_WRITE:
        return text + " System jobs write inside `with ctx.system_db():`."
    grant = verdict.grant_needed
    if grant is not None:
        opener = _GRANT_OPENERS.get(grant, f"ctx.{grant}()")
        if grant in watch.declared_grants:
            return text + f" The job declares {grant.value!r}: wrap this code in `with {opener}:`."
        return (
            text + f" If this is intended, declare escape_hatch=EscapeHatch(reason='...', "
            f"grants=[{grant.value!r}]) on the job and wrap the code in `with {opener}:`."
        )
    return text + (NO_GRANT_HINTS[verdict.rule] if verdict.rule is not None else _ANOTHER_TENANT)


def refuse_statement(watch: Watch, verdict: Verdict, *, enforce: bool) -> None:
    """The body's guard refused a statement: recorded and raised, only logged in log mode."""
    message = statement_message(watch, verdict)
    if not enforce:
        logger.warning("DB guard (log mode) would deny: %s", message)
        return
    raise _recorded(watch, message, verdict.kind, verdict.grant_needed)


def refuse(watch: Watch, route: Route, reason: str, *, enforce: bool = True) -> None:
    """Refuse what is not a statement (a connection, a shell, a transaction's end) during the
    body: recorded on the Watch and raised; in log mode (``enforce`` false) only logged."""
    message = f"{_who(watch)}: {reason}"
    if not enforce:
        logger.warning("DB guard (log mode) would deny: %s", message)
        return
    raise _recorded(watch, message, route)


def refuse_not_a_tenant_alias(watch: Watch, alias: str, *, enforce: bool) -> None:
    """A tenant run's statement or connection on an alias that is not django-tenants'."""
    refuse(
        watch,
        Route.DATABASE,
        f"alias {alias!r} is not a django-tenants connection, so the guard cannot tell "
        "which schema its unqualified names mean. Tenant runs use django-tenants aliases only.",
        enforce=enforce,
    )


def refuse_outside_body(watch: Watch, route: Route, reason: str) -> None:
    """Refuse what a run's context did where no wall stands (after the run, or in another thread
    outside the body), in every mode: logged, recorded while the run can still fail, raised."""
    message = f"{_who(watch)}: {reason}"
    logger.warning("%s", message)
    if not watch.ended:
        watch.violations.append(message)
    raise DatabaseAccessDenied(message, job_name=watch.job, kind=route)


def record_privilege_denial(watch: Watch, primary: str) -> str:
    """PostgreSQL refused the tenant's login (its ``permission denied``, ``primary``): recorded
    on the run, which fails even if the job catches it; the message, for
    :func:`privilege_denied`."""
    message = (
        f"{_who(watch)} was denied by PostgreSQL: {primary}. The job body runs as the tenant's "
        "own database role, which holds no privilege outside its schema and the shared tables "
        "it may read (docs/guard.md, Two walls). No grant allows this; run a job in that "
        "tenant instead."
    )
    watch.violations.append(message)
    return message


def privilege_denied(watch: Watch, message: str) -> DatabaseAccessDenied:
    """The run's exception for PostgreSQL's refusal recorded as ``message``."""
    return DatabaseAccessDenied(message, job_name=watch.job, kind=Route.PRIVILEGE)


def swallowed(watch: Watch) -> DatabaseAccessDenied:
    """The run's failure when its job caught a refusal and carried on (the first one kept)."""
    return DatabaseAccessDenied(
        "the job swallowed a database access denial: " + watch.violations[0], job_name=watch.job
    )


def _recorded(
    watch: Watch, message: str, kind: str, grant: Grant | None = None
) -> DatabaseAccessDenied:
    watch.violations.append(message)
    return DatabaseAccessDenied(message, job_name=watch.job, kind=kind, grant=grant)
