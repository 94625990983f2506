"""Attack strategies of issue 22, class 9: kumiko's own tables.

kumiko's history lives in public (``kumiko_jobs_jobrun``, ``_jobattempt``, ``_jobfailure``, ...)
and holds every tenant's arguments, results, errors and tracebacks. :func:`plant_history` puts
a run of t2 there through the observer, with the canary as its secret argument, its result and
error, its attempt's traceback and its failure's subject; a strategy that shows it read them.
With DB_ROLES off the classifier is the only wall: before issue 22's rule every one of these
got through (they read a "shared table"); with DB_ROLES on PostgreSQL refuses them too (the
tenant roles hold no privilege on kumiko's tables).

``GRANTED`` are the same reads inside ``ctx.cross_tenant_reads(t2)`` and ``ctx.unsafe_raw()``
(``guardapp.strategy_granted``): no grant opens kumiko's tables.

Proved able to fail: with ``kumiko_jobs/guard`` and ``history/run_reads.py`` reverted to the code
before this rule, every strategy here had its effect under the classifier alone
(``test_enforcement_no_strategy_has_its_effect[batch-classifier]``), and so did every
``GRANTED`` case (``test_kumiko_tables_stay_refused_inside_...[...-classifier]``).
"""

from __future__ import annotations

import datetime
import uuid
from typing import Any

from django.db import connection, transaction

from kumiko_jobs.models import JobAttempt, JobFailure, JobRun

from .attacks_base import CANARY, Class, Effect, Strategy, log_rows

L = Effect.LEAK
# The planted run of t2 (fixed, so unplanting finds it whatever a strategy did).
VICTIM_RUN = uuid.UUID("6b756d69-6b6f-4a6f-6273-68697374ff22")
VICTIM_JOB = "guardapp.gx_history_victim"

_ROWS: list[tuple[str, str]] = [
    ("own_run_arguments", "SELECT payload::text FROM kumiko_jobs_jobrun WHERE schema_name = 't2'"),
    ("own_run_star", f"SELECT * FROM kumiko_jobs_jobrun WHERE job_name = '{VICTIM_JOB}'"),
    ("own_run_qualified", "SELECT payload::text FROM public.kumiko_jobs_jobrun"),
    ("own_run_quoted", 'SELECT "payload"::text FROM "public"."kumiko_jobs_jobrun"'),
    ("own_run_table", "TABLE kumiko_jobs_jobrun"),
    ("own_run_result_and_error", "SELECT result::text, error_message FROM kumiko_jobs_jobrun"),
    ("own_run_for_update", "SELECT payload::text FROM kumiko_jobs_jobrun FOR UPDATE"),
    (
        "own_run_for_share_skip_locked",
        "SELECT payload::text FROM public.kumiko_jobs_jobrun FOR SHARE SKIP LOCKED",
    ),
    (
        "own_run_join_own",
        "SELECT r.payload::text FROM kumiko_jobs_jobrun r LEFT JOIN guardapp_secret g ON true",
    ),
    (
        "own_run_subquery",
        "SELECT (SELECT string_agg(payload::text, ',') FROM kumiko_jobs_jobrun)",
    ),
    (
        "own_run_cte",
        "WITH r AS (SELECT payload::text AS p FROM kumiko_jobs_jobrun) SELECT p FROM r",
    ),
    (
        "own_run_into_own",
        "INSERT INTO guardapp_finding (key, value) "
        "SELECT '{mark}', payload::text FROM kumiko_jobs_jobrun WHERE schema_name = 't2'",
    ),
    ("own_attempt_traceback", "SELECT traceback FROM kumiko_jobs_jobattempt"),
    ("own_failure_subject", "SELECT subject FROM public.kumiko_jobs_jobfailure"),
    # SQL text run by a function (needs unsafe_raw): the name is in a literal
    (
        "own_run_query_to_xml",
        "SELECT query_to_xml('SELECT payload::text FROM kumiko_jobs_jobrun', true, false, '')",
    ),
]


# --- routes: the ORM reaching kumiko's models from job code ------------------------------------


def orm_jobrun_filter(ctx: Any, mark: str) -> None:
    log_rows(ctx, list(JobRun.objects.filter(schema_name="t2").values_list("payload")))


def orm_jobrun_get(ctx: Any, mark: str) -> None:
    run = JobRun.objects.get(pk=VICTIM_RUN)
    log_rows(ctx, [run.payload, run.result, run.error_message])


def orm_jobrun_select_for_update(ctx: Any, mark: str) -> None:
    with transaction.atomic():
        rows = JobRun.objects.select_for_update().filter(schema_name="t2").values_list("payload")
        log_rows(ctx, list(rows))


def orm_jobattempt_traceback(ctx: Any, mark: str) -> None:
    log_rows(ctx, list(JobAttempt.objects.values_list("traceback")))


def orm_jobfailure_subject(ctx: Any, mark: str) -> None:
    log_rows(ctx, list(JobFailure.objects.values_list("subject")))


def orm_jobrun_raw_qualified(ctx: Any, mark: str) -> None:
    runs = JobRun.objects.raw("SELECT * FROM public.kumiko_jobs_jobrun")
    log_rows(ctx, [run.payload for run in runs])


_CALLABLES = [
    orm_jobrun_filter,
    orm_jobrun_get,
    orm_jobrun_select_for_update,
    orm_jobattempt_traceback,
    orm_jobfailure_subject,
    orm_jobrun_raw_qualified,
]

OWN_STRATEGIES: list[Strategy] = [
    *(Strategy(name=name, cls=Class.OWN, effect=L, sql=sql) for name, sql in _ROWS),
    *(Strategy(name=f.__name__, cls=Class.OWN, effect=L, perform=f) for f in _CALLABLES),
]

# Run inside the grant named (guardapp.strategy_granted): still refused, still no effect.
GRANTED: list[tuple[str, str]] = [
    ("own_run_arguments", "cross_tenant_reads"),
    ("own_run_qualified", "cross_tenant_reads"),
    ("orm_jobrun_filter", "cross_tenant_reads"),
    ("own_run_arguments", "unsafe_raw"),
    ("own_run_quoted", "unsafe_raw"),
    ("own_run_for_update", "unsafe_raw"),
    ("orm_jobattempt_traceback", "unsafe_raw"),
    ("orm_jobrun_raw_qualified", "unsafe_raw"),
    ("own_run_query_to_xml", "unsafe_raw"),
]


# --- the victim: a run of t2 in kumiko's history, planted through the observer ----------------


def _insert(o: Any, instance: Any) -> None:
    """``instance``'s row, as Django would write it, sent on the observer's connection."""
    fields = [
        f
        for f in instance._meta.concrete_fields
        if not (f.primary_key and getattr(instance, f.attname) is None)
    ]
    columns = ", ".join(f'"{f.column}"' for f in fields)
    values = [f.get_db_prep_save(getattr(instance, f.attname), connection) for f in fields]
    marks = ", ".join(["%s"] * len(values))
    o.rows(f'INSERT INTO public."{instance._meta.db_table}" ({columns}) VALUES ({marks})', values)


def plant_history(o: Any) -> None:
    now = datetime.datetime.now(datetime.UTC)
    run = JobRun(
        run_id=VICTIM_RUN,
        job_name=VICTIM_JOB,
        schema_name="t2",
        queue="default",
        status="failed",
        queued_at=now,
        payload={"args": [], "kwargs": {"note": f"{CANARY}arg"}},
        result={"total": f"{CANARY}result"},
        error_message=f"failed for {CANARY}error",
    )
    _insert(o, run)
    attempt = JobAttempt(
        run=run,
        number=1,
        started_at=now,
        finished_at=now,
        duration_ms=1.0,
        outcome="failed",
        traceback=f"Traceback: ValueError: {CANARY}trace",
    )
    _insert(o, attempt)
    failure = JobFailure(
        schema_name="t2",
        job_name=VICTIM_JOB,
        subject=f"{CANARY}subject",
        message_key="gx",
        failed_at=now,
        run_id=VICTIM_RUN,
    )
    _insert(o, failure)


def unplant_history(o: Any) -> None:
    o.rows("DELETE FROM public.kumiko_jobs_jobfailure WHERE run_id = %s", (VICTIM_RUN,))
    o.rows("DELETE FROM public.kumiko_jobs_jobattempt WHERE run_id = %s", (VICTIM_RUN,))
    o.rows("DELETE FROM public.kumiko_jobs_jobrun WHERE run_id = %s", (VICTIM_RUN,))
