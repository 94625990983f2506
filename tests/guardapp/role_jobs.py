"""Jobs of the two-walls suite (tests/integration/test_db_roles.py): what a tenant body's
database identity is, and what it can still do once the classifier only logs."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.db import connection

from example_project.catalog.models import Plan
from example_project.customers.models import Client
from kumiko_jobs import EscapeHatch, job
from kumiko_jobs.run.context import JobContext

from .models import Finding, Secret


def _note(key: str, value: Any) -> None:
    Finding.objects.create(key=key, value=str(value))


def _identity() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT session_user, current_user")
        session_user, current_user = cursor.fetchone()
    return f"{session_user}/{current_user}"


@job
def role_whoami(ctx: JobContext) -> None:
    _note("identity", _identity())
    _note("secrets", ",".join(Secret.objects.values_list("value", flat=True)))


# Raw driver first (never meets any execute wrapper), then the read of t2's secret.
UNDO_IDENTITY = {
    "reset_role": "RESET ROLE",
    "set_role_project": "SET ROLE {project}",
    "set_config_role": "SELECT set_config('role', 'none', false)",
    "set_session_authorization": "SET SESSION AUTHORIZATION {project}",
    "reset_session_authorization": "RESET SESSION AUTHORIZATION",
}


@job
def undo_identity_then_read(ctx: JobContext, *, case: str, project: str) -> None:
    raw = connection.connection  # psycopg's own connection, under every Django wrapper
    if raw is None:
        connection.ensure_connection()
        raw = connection.connection
    statement = UNDO_IDENTITY[case].format(project=f'"{project}"')
    try:
        raw.execute(statement)
        _note("undo", "accepted")
    except Exception as exc:  # the undo itself may be refused: the read still must fail
        raw.rollback()
        _note("undo", f"refused: {type(exc).__name__}")
    row = raw.execute("SELECT value FROM t2.guardapp_secret").fetchone()
    _note("leaked", row[0])


@job(escape_hatch=EscapeHatch(reason="test: shared catalog", grants=["global_writes"]))
def role_add_plan(ctx: JobContext, *, name: str) -> None:
    with ctx.global_writes():
        Plan.objects.create(name=name, monthly_price=Decimal("3.00"))
        _note("inside_global_writes", _identity())
    _note("after_global_writes", _identity())


@job(escape_hatch=EscapeHatch(reason="test: read t2", grants=["cross_tenant_reads"]))
def read_other_tenant(ctx: JobContext, *, schema: str, write_too: bool = False) -> None:
    other = Client.objects.get(schema_name=schema)
    with ctx.cross_tenant_reads(other):
        values = list(Secret.objects.values_list("value", flat=True))
        identity = _identity()
        if write_too:
            # Through the raw driver: the classifier never sees it; the READ ONLY
            # transaction refuses it.
            connection.connection.execute(
                "INSERT INTO guardapp_secret (label, value) VALUES ('x', 'written')"
            )
    _note("read", ",".join(values))
    _note("identity_in_block", identity)
    _note("identity_after", _identity())


@job(system=True)
def role_system_identity(ctx: JobContext) -> None:
    outside = _identity()
    with ctx.system_db():
        inside = _identity()
        Plan.objects.create(name=inside.split("/")[0], monthly_price=Decimal("0.00"))
        same = "sys-same" if inside == outside else f"sys-differs:{outside}"
        Plan.objects.create(name=same[:50], monthly_price=Decimal("0.00"))


@job
def swallow_denial(ctx: JobContext) -> None:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT value FROM t2.guardapp_secret")
    except Exception:
        pass
    _note("swallowed", "carried on")


@job
def write_shared_unguarded(ctx: JobContext) -> None:
    Plan.objects.create(name="sneaked", monthly_price=Decimal("0.01"))


@job
def open_project_connection(ctx: JobContext) -> None:
    from django.db import connections

    fresh = connections.create_connection("default")  # the project's credentials
    with fresh.cursor() as cursor:
        cursor.execute("SELECT value FROM t2.guardapp_secret")
        _note("leaked", cursor.fetchone()[0])


@job
def raw_read(ctx: JobContext, *, statement: str) -> None:
    """Runs ``statement`` on the run's psycopg connection, past the classifier entirely."""
    connection.ensure_connection()
    row = connection.connection.execute(statement).fetchone()
    _note("read", row[0] if row else None)


# --- what a body can leave behind through the raw driver (red-team pass, issue 12) -------------

ADMISSION_KEY = "kumiko_jobs:testapp.capped:t2"  # the key t2's capped enqueues lock


@job
def raw_hold_admission_lock(ctx: JobContext) -> None:
    """A session advisory lock on kumiko's admission key for t2, sent past the classifier."""
    from kumiko_jobs.core.db import ADMISSION_LOCK_CLASS

    connection.ensure_connection()
    connection.connection.execute(
        "SELECT pg_advisory_lock(%s, hashtext(%s))", [ADMISSION_LOCK_CLASS, ADMISSION_KEY]
    )


@job(escape_hatch=EscapeHatch(reason="test: read t2", grants=["cross_tenant_reads"]))
def plant_in_borrowed_session(ctx: JobContext) -> None:
    """Inside cross_tenant_reads(t2): leave the READ ONLY transaction by the raw driver and
    plant a temp table shadowing t2's guardapp_secret on t2's pooled connection."""
    with ctx.cross_tenant_reads(Client.objects.get(schema_name="t2")):
        connection.ensure_connection()
        raw = connection.connection
        raw.execute("ROLLBACK")
        raw.execute("CREATE TEMP TABLE guardapp_secret (id int, label text, value text)")
        raw.execute("INSERT INTO guardapp_secret VALUES (1, 't2-secret', 'PLANTED-by-t1')")


@job(escape_hatch=EscapeHatch(reason="test: shared catalog", grants=["global_writes"]))
def plant_in_project_session(ctx: JobContext) -> None:
    """Inside global_writes: a temp table shadowing the shared catalog_plan, on the project's
    connection, by the raw driver."""
    with ctx.global_writes():
        connection.ensure_connection()
        raw = connection.connection
        raw.execute("CREATE TEMP TABLE catalog_plan (id int, name text, monthly_price numeric)")
        raw.execute("INSERT INTO catalog_plan VALUES (1, 'PLANTED', 0)")


@job(escape_hatch=EscapeHatch(reason="test: shared catalog", grants=["global_writes"]))
def read_plans_in_global_writes(ctx: JobContext) -> None:
    """A later global_writes block of the same tenant: what it sees of the shared plans."""
    with ctx.global_writes():
        names = ",".join(sorted(Plan.objects.values_list("name", flat=True)))
    _note("plans", names)


@job(escape_hatch=EscapeHatch(reason="test: read t2", grants=["cross_tenant_reads"]))
def raw_write_in_cross_tenant_reads(ctx: JobContext) -> None:
    """Leave the READ ONLY transaction by the raw driver, then write t2."""
    with ctx.cross_tenant_reads(Client.objects.get(schema_name="t2")):
        connection.ensure_connection()
        raw = connection.connection
        raw.execute("ROLLBACK")
        raw.execute("UPDATE t2.guardapp_secret SET value = 'overwritten-by-t1'")


@job(escape_hatch=EscapeHatch(reason="test: shared catalog", grants=["global_writes"]))
def raw_read_in_global_writes(ctx: JobContext) -> None:
    """Read t2 by the raw driver inside global_writes."""
    with ctx.global_writes():
        connection.ensure_connection()
        row = connection.connection.execute("SELECT value FROM t2.guardapp_secret").fetchone()
    _note("leaked", row[0] if row else None)


@job
def read_own_secrets(ctx: JobContext) -> None:
    """The next run of a tenant: what its ORM sees of its own table."""
    _note("seen", ",".join(sorted(s.value for s in Secret.objects.all())))


@job(system=True)
def read_plans(ctx: JobContext) -> None:
    """A later system run: what the project's connection shows of the shared plans."""
    names = ",".join(sorted(Plan.objects.values_list("name", flat=True)))
    with ctx.system_db(), connection.cursor() as cursor:
        cursor.execute(
            'INSERT INTO "t1".guardapp_finding (key, value) VALUES (%s, %s)', ["plans", names]
        )


@job
def raw_set_own_role_default(ctx: JobContext) -> None:
    """A setting the tenant's role gives itself: it outlives every session reset."""
    connection.ensure_connection()
    connection.connection.execute("ALTER ROLE CURRENT_USER SET work_mem = '77MB'")


@job(escape_hatch=EscapeHatch(reason="test: shared catalog", grants=["global_writes"]))
def raw_write_registry_in_global_writes(ctx: JobContext) -> None:
    """The tenant registry is readable, never writable, even by the writer login."""
    with ctx.global_writes():
        connection.ensure_connection()
        connection.connection.execute(
            "UPDATE public.customers_client SET name = 'renamed-by-t1' WHERE schema_name = 't2'"
        )


@job(atomic=True)
def role_whoami_atomic(ctx: JobContext) -> None:
    """``role_whoami`` in one transaction with its success (``@job(atomic=True)``)."""
    _note("identity", _identity())
    _note("secrets", ",".join(Secret.objects.values_list("value", flat=True)))


@job
def roll_back_under_the_path(ctx: JobContext) -> None:
    """The body's first query opens a transaction (django-tenants' ``SET search_path`` is sent
    inside it), and a raw ``ROLLBACK`` ends it behind Django's back: the server's path is gone,
    while django-tenants still counts it as set for the rest of this run."""
    from django.db import transaction

    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        cursor.execute("ROLLBACK")
