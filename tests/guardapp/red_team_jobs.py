"""Jobs of tests/integration/test_red_team_round4.py: what a tenant job tries against what
landed in round 4 (results read by id, unique keys, the history's columns, state that outlives
a run). Each job writes what it got into its own tenant's finding table, which the test reads
through its second connection."""

from __future__ import annotations

import dataclasses
from typing import Any

from django.db import connection
from django_tenants.utils import schema_context
from psycopg.types.string import TextLoader

from kumiko_jobs import EscapeHatch, job
from kumiko_jobs.core import current
from kumiko_jobs.enqueueing.handle import RunHandle
from kumiko_jobs.models import JobRun
from kumiko_jobs.run.context import JobContext

from .models import Finding


def _note(key: str, value: Any) -> None:
    Finding.objects.create(key=key, value=str(value)[:900])


# --- results read by id ---------------------------------------------------------------------


def _refresh(run_id: str) -> str:
    try:
        row = RunHandle(run_id=run_id, job_name="x", schema_name=None).refresh()
    except JobRun.DoesNotExist:
        return "DoesNotExist"
    return f"read schema={row.schema_name} result={row.result} payload={row.payload}"


@job
def read_run_by_id(ctx: JobContext, *, run_id: str, how: str) -> None:
    """Another tenant's (or a system) run, through ``RunHandle.refresh()``, plainly, from the
    public schema's context, or with the run's envelope cleared or forged."""
    if how == "plain":
        _note("read", _refresh(run_id))
    elif how == "schema_context_public":
        with schema_context("public"):
            _note("read", _refresh(run_id))
    elif how == "envelope_cleared":
        current.current_envelope.set(None)
        _note("read", _refresh(run_id))
    elif how == "envelope_forged":
        envelope = current.current_envelope.get()
        assert envelope is not None
        current.current_envelope.set(dataclasses.replace(envelope, schema=None))
        _note("read", _refresh(run_id))
    else:
        raise AssertionError(how)


# --- kumiko's history columns: unique_key, atomic_key, the admission lock ----------------------


@job
def claim_unique_key(ctx: JobContext, *, key: str, route: str) -> None:
    """Gives the attacker's own run another tenant's unique key: that tenant's next unique
    enqueue with the same arguments would return this run (and its own work never runs)."""
    if route == "orm":
        JobRun.objects.filter(pk=ctx.run_id).update(unique_key=key)
    elif route == "cursor":
        with connection.cursor() as cursor:
            cursor.execute(
                "UPDATE public.kumiko_jobs_jobrun SET unique_key = %s WHERE run_id = %s",
                [key, ctx.run_id],
            )
    elif route == "raw":
        connection.ensure_connection()
        raw: Any = connection.connection
        raw.execute(
            "UPDATE public.kumiko_jobs_jobrun SET unique_key = %s WHERE run_id = %s",
            [key, ctx.run_id],
        )
    else:
        raise AssertionError(route)
    _note("claimed", route)


@job
def read_history_keys(ctx: JobContext, *, route: str) -> None:
    """The other tenant's runs' atomic and unique keys (and results), read from kumiko's table."""
    sql = (
        "SELECT run_id::text, atomic_key, unique_key, result::text FROM "
        "public.kumiko_jobs_jobrun WHERE schema_name = 't2'"
    )
    if route == "orm":
        rows: list[Any] = list(
            JobRun.objects.filter(schema_name="t2").values_list("run_id", "unique_key", "result")
        )
    else:
        with connection.cursor() as cursor:
            cursor.execute(sql)
            rows = cursor.fetchall()
    _note("keys", rows)


@job
def empty_admission_locks(ctx: JobContext) -> None:
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM public.kumiko_jobs_admissionlock")
    _note("emptied", "yes")


# --- state that outlives a run: Python objects on the worker's connection ----------------------

SEEN: list[str] = []


def _spy(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
    SEEN.append(f"{sql} {params}")
    return execute(sql, params, many, context)


@job
def plant_execute_wrapper(ctx: JobContext) -> None:
    """An execute wrapper of the job's own, put first (the guard's is popped from the end)."""
    connection.execute_wrappers.insert(0, _spy)


@job
def plant_settings_option(ctx: JobContext) -> None:
    """A connection option written into the wrapper's settings (Django shares the dict with
    ``settings.DATABASES``), which a new session of any later run would start with."""
    options = connection.settings_dict.setdefault("OPTIONS", {})
    options["options"] = "-c statement_timeout=4321"
    options["application_name"] = "gx_planted"


@job
def dump_seen(ctx: JobContext) -> None:
    # What the wrapper saw of the finding tables' writes (the victim's among them, if any).
    _note("seen", " | ".join(s for s in SEEN if "guardapp_finding" in s))


@job
def victim_write(ctx: JobContext, *, value: str) -> None:
    _note("victim", value)
    with connection.cursor() as cursor:
        cursor.execute("SHOW statement_timeout")
        _note("statement_timeout", cursor.fetchone()[0])


@job(escape_hatch=EscapeHatch(reason="test: a session setting", grants=["unsafe_raw"]))
def plant_custom_setting(ctx: JobContext) -> None:
    with ctx.unsafe_raw(), connection.cursor() as cursor:
        cursor.execute("SELECT set_config('gx.planted', 'by-t1', false)")


@job
def read_custom_setting(ctx: JobContext) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT coalesce(current_setting('gx.planted', true), '<none>')")
        _note("custom", cursor.fetchone()[0])


# --- a context smuggled into a later run -------------------------------------------------------

KEPT: dict[str, Any] = {}


@job(escape_hatch=EscapeHatch(reason="test: a shared write", grants=["global_writes"]))
def keep_granted_context(ctx: JobContext) -> None:
    KEPT["ctx"] = ctx


@job
def use_kept_context(ctx: JobContext, *, mark: str) -> None:
    """A grant-less run using the granted run's kept ``ctx`` to write a shared table."""
    from example_project.catalog.models import Plan

    kept = KEPT["ctx"]
    with kept.global_writes():
        Plan.objects.filter(name=mark).update(monthly_price=99)
    _note("wrote", "yes")


# --- Python state on the connection that the next run inherits -------------------------------


class _SpyLoader(TextLoader):
    """A text loader of the job's own, registered on the psycopg connection: it sees every
    text value later statements on that connection read."""

    def load(self, data: Any) -> str:
        value = super().load(data)
        SEEN.append(f"guardapp_finding-loaded {value}")
        return value


@job
def plant_psycopg_loader(ctx: JobContext) -> None:
    connection.ensure_connection()
    raw: Any = connection.connection
    for name in ("text", "varchar"):
        raw.adapters.register_loader(name, _SpyLoader)


@job
def victim_read(ctx: JobContext) -> None:
    from .models import Secret

    _note("read", list(Secret.objects.values_list("value", flat=True)))


@job
def plant_tenant_attributes(ctx: JobContext, *, schema: str) -> None:
    """Points django-tenants' wrapper at another schema in Python only (no statement is
    sent, so the guard sees nothing), for whatever runs next on the connection."""
    from example_project.customers.models import Client

    tenant = Client.objects.get(schema_name=schema)
    connection.set_tenant(tenant)


SYSTEM_SAW: dict[str, Any] = {}


@job(system=True)
def system_writes_unqualified(ctx: JobContext) -> None:
    """A system job whose raw SQL names a tenant table unqualified (in public it does not
    exist, so the run fails; in a tenant's schema it would land there)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_schema()")
        SYSTEM_SAW["schema"] = cursor.fetchone()[0]
        cursor.execute("INSERT INTO guardapp_finding (key, value) VALUES ('system', 'wrote')")


@job(system=True)
def system_reads_run_by_id(ctx: JobContext, *, run_id: str, schema: str) -> None:
    """A system run loads a run by id from the public schema, then inside a tenant's context."""
    from django_tenants.utils import tenant_context

    from example_project.customers.models import Client

    SYSTEM_SAW["public"] = _refresh(run_id)
    with ctx.system_db(), tenant_context(Client.objects.get(schema_name=schema)):
        SYSTEM_SAW["tenant"] = _refresh(run_id)
