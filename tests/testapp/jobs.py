"""Jobs used by the integration tests. Each writes a Probe row in the schema it ran in."""

from __future__ import annotations

import os
import time

from django.db import connection

from kumiko_jobs import EscapeHatch, TenantVisibleError, Unrecoverable, job

from .models import Probe


def _probe(ctx, tag: str, note: str = "") -> Probe:
    return Probe.objects.create(
        tag=tag, schema_seen=connection.schema_name, attempt=ctx.attempt, note=note
    )


@job(tenant_visible_run=["tag"])
def probe(ctx, *, tag: str, payload: dict | None = None) -> str:
    _probe(ctx, tag, note=repr(payload) if payload else "")
    return tag


@job(tenant_visible_run=["tag"], tenant_operable=False)
def operators_only(ctx, *, tag: str) -> None:
    """Send the tenant's monthly invoice: only the operators retry or cancel its runs."""
    _probe(ctx, tag)


@job
def list_tags(ctx, *, tag: str) -> None:
    """Record every tag this run can see: proves a run reads only its own tenant's rows."""
    seen = sorted(Probe.objects.values_list("tag", flat=True))
    _probe(ctx, tag, note=",".join(seen))


@job(
    retries=2,
    backoff={"type": "fixed", "delay": 0},
    tenant_visible_failure={"message_key": "testapp.flaky_failed", "subject_fields": ["tag"]},
)
def flaky(ctx, *, tag: str, fail_times: int) -> None:
    _probe(ctx, tag, note=f"final={ctx.final_attempt}")
    if ctx.attempt <= fail_times:
        raise RuntimeError(f"boom on attempt {ctx.attempt}")


@job(retries=3, backoff={"type": "fixed", "delay": 0})
def gives_up(ctx, *, tag: str) -> None:
    _probe(ctx, tag)
    raise Unrecoverable("the input can never work")


@job(tenant_visible_failure={"message_key": "testapp.generic", "subject_fields": ["tag"]})
def visible_error(ctx, *, tag: str, key: str) -> None:
    _probe(ctx, tag)
    raise TenantVisibleError(key)


@job
def leaks_schema(ctx, *, tag: str, other: str) -> None:
    """Switches the connection to another schema and does not switch back."""
    _probe(ctx, tag)
    connection.set_schema(other)


@job
def crashes_connection(ctx, *, tag: str) -> None:
    """Leaves the connection in a failed transaction state."""
    _probe(ctx, tag)
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    raise RuntimeError("after using the connection")


@job
def with_followup(ctx, *, tag: str, fail: bool = False) -> None:
    _probe(ctx, tag)
    ctx.enqueue(probe, tag=f"{tag}-child")
    if fail:
        raise RuntimeError("parent fails, so the follow-up must not be sent")


@job
def defers_once(ctx, *, tag: str) -> object:
    if not Probe.objects.filter(tag=tag).exists():
        _probe(ctx, tag, note="deferring")
        return ctx.defer(1)
    _probe(ctx, f"{tag}-resumed")
    return None


@job(max_defers=2)
def defers_forever(ctx, *, tag: str) -> object:
    _probe(ctx, tag)
    return ctx.defer(0.001)


@job
def reports_pid(ctx, *, tag: str) -> None:
    _probe(ctx, tag, note=str(os.getpid()))


@job(system=True)
def system_tick(ctx, *, tag: str) -> None:
    assert connection.schema_name == "public"


# --- scheduling, events and concurrency (issue 5) -------------------------------------------


@job(per_tenant=True)
def fanned(ctx, *, tag: str) -> None:
    _probe(ctx, tag, note=ctx.trigger_name or "")


@job(cron="* * * * *", per_tenant=True)
def every_minute(ctx) -> None:
    _probe(ctx, "cron", note=ctx.trigger_name or "")


@job(cron="0 3 * * *", timezone="Europe/Berlin", system=True)
def nightly_cleanup(ctx) -> None:
    """A system cron job: one run in the public schema at 03:00 Berlin time."""


@job(on="invoices.paid", where={"status": "paid"})
def on_paid(ctx, *, invoice_id: int, status: str) -> None:
    _probe(ctx, f"paid-{invoice_id}", note=ctx.trigger_name or "")


@job(on=["invoices.paid", "invoices.voided"])
def on_any_invoice_event(ctx, **payload: object) -> None:
    _probe(ctx, f"any-{payload.get('invoice_id')}", note=ctx.trigger_name or "")


@job(concurrency="skip")
def skip_while_busy(ctx, *, tag: str) -> None:
    _probe(ctx, tag)


@job(concurrency="replace")
def latest_wins(ctx, *, tag: str) -> None:
    _probe(ctx, tag)


@job(concurrency="debounce", debounce=1)
def debounced(ctx, *, tag: str) -> None:
    _probe(ctx, tag)


@job(concurrency="sequential")
def one_at_a_time(ctx, *, tag: str) -> None:
    _probe(ctx, tag)


@job(max_per_tenant=2)
def capped(ctx, *, tag: str) -> None:
    _probe(ctx, tag)


@job(name="reliability.send_receipt", retries=2, backoff={"type": "fixed", "delay": 0})
def send_receipt(ctx, *, invoice_id: int, fail_after_effect: bool = False) -> None:
    """docs/reliability.md's example: the effect happens once per run, whatever retries.

    Its table (``receipt_sent``) exists only in t1, created by the test that uses it."""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO receipt_sent (idempotency_key, invoice_id) VALUES (%s, %s) "
            "ON CONFLICT (idempotency_key) DO NOTHING",
            [ctx.idempotency_key, invoice_id],
        )
        if cursor.rowcount == 0:
            ctx.log.info("receipt already sent by an earlier attempt", invoice=invoice_id)
    if fail_after_effect and ctx.attempt == 1:
        raise ConnectionError("the provider accepted the receipt, then the connection dropped")


def _mark(path: str, attempt: int, event: str) -> None:
    with open(path, "a") as marks:
        marks.write(f"{attempt} {event} {time.time():.6f}\n")


@job(timeout=1, retries=1, backoff={"type": "fixed", "delay": 0})
def overruns(ctx, *, tag: str, marks: str, seconds: float, then: str = "return") -> None:
    """On its first attempt, catches every Exception (RQ's timeout too) for ``seconds``.

    Appends ``<attempt> <event> <time>`` lines to the file ``marks``: ``start``, a ``tick``
    every 0.1 s, ``caught <type>`` for each exception it swallows, ``sql-ran`` or
    ``sql-refused`` for a write tried after each, and ``end`` when it stops on its own; then
    it returns, raises (``then="raise"``) or defers (``then="defer"``). Later attempts only
    mark start and end.
    """
    _mark(marks, ctx.attempt, "start")
    if ctx.attempt == 1:
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            try:
                time.sleep(0.1)
                _mark(marks, ctx.attempt, "tick")
            except Exception as exc:
                _mark(marks, ctx.attempt, f"caught {type(exc).__name__}")
                try:
                    _probe(ctx, tag, note="after the timeout")
                    _mark(marks, ctx.attempt, "sql-ran")
                except Exception:
                    _mark(marks, ctx.attempt, "sql-refused")
    _mark(marks, ctx.attempt, "end")
    if ctx.attempt == 1 and then == "raise":
        raise ValueError("something else went wrong after the timeout")
    if ctx.attempt == 1 and then == "defer":
        return ctx.defer(1)


# --- job semantics (issue 14) -----------------------------------------------------------------


_SIBLING_LINGER = 1.0  # seconds; many polls (every 0.05 s) of the sibling


def _wait_for_a_sibling(ctx, seconds: float) -> bool:
    """Wait (bounded) until another run of this job is running; True if one was seen.

    Two runs that both see each other overlapped; a sequential job's runs never can."""
    from kumiko_jobs.models import JobRun, RunStatus

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        others = JobRun.objects.filter(job_name=ctx.job_name, status=RunStatus.RUNNING)
        if others.exclude(pk=ctx.run_id).exists():
            ctx.log.info("a sibling run is running")
            # Linger so the sibling, polling too, sees this run before it ends: without it
            # the first to look finished at once and the other could miss the overlap.
            time.sleep(_SIBLING_LINGER)
            return True
        time.sleep(0.05)
    return False


@job(cron="0 4 * * *", system=True, concurrency="sequential")
def sequential_system_cron(ctx) -> None:
    """A long system cron that must never overlap itself."""
    _wait_for_a_sibling(ctx, 2.0)


@job(cron="0 4 * * *", system=True)
def parallel_system_cron(ctx) -> None:
    """The same cron without concurrency options: its ticks may overlap (calibration)."""
    _wait_for_a_sibling(ctx, 30.0)


@job(cron="0 5 * * *", system=True, concurrency="skip")
def skipping_system_cron(ctx) -> None:
    """A system cron whose tick is skipped while the previous one is still active."""


@job(system=True, max_per_tenant=1)
def capped_system(ctx, *, tag: str) -> None:
    """At most one waiting-or-running run of the system at once."""


# Bound of every wait below: a test that breaks fails in a minute instead of hanging.
_WAIT_BOUND = 60.0


def _wait_for_cancel_request(ctx) -> bool:
    deadline = time.monotonic() + _WAIT_BOUND
    while time.monotonic() < deadline:
        if ctx.cancel_requested:
            return True
        time.sleep(0.05)
    return False


@job(retries=2, backoff={"type": "fixed", "delay": 0})
def cancellable(ctx, *, tag: str) -> str:
    """Works in small steps and checks for a cancellation between them."""
    _probe(ctx, tag, note="started")
    deadline = time.monotonic() + _WAIT_BOUND
    while time.monotonic() < deadline:
        ctx.check_cancelled()
        time.sleep(0.05)
    return "never cancelled"


@job(retries=2, backoff={"type": "fixed", "delay": 0})
def completes_despite_cancel(ctx, *, tag: str) -> str:
    """Sees the request, but finishes its work and returns: success wins the race."""
    _probe(ctx, tag, note=f"saw request: {_wait_for_cancel_request(ctx)}")
    return "done"


@job(retries=2, backoff={"type": "fixed", "delay": 0})
def fails_after_cancel(ctx, *, tag: str) -> None:
    """Sees the request, then fails some other way: cancelled all the same, never retried."""
    _probe(ctx, tag, note=f"saw request: {_wait_for_cancel_request(ctx)}")
    raise RuntimeError("broke while stopping")


@job(retries=2, backoff={"type": "fixed", "delay": 0})
def swallows_cancel(ctx, *, tag: str) -> str:
    """Catches JobCancelled and returns: the acknowledged cancellation still ends the run."""
    from kumiko_jobs import JobCancelled

    _wait_for_cancel_request(ctx)
    try:
        ctx.check_cancelled()
    except JobCancelled:
        _probe(ctx, tag, note="caught")
    return "pretends to be done"


@job(retries=2, backoff={"type": "fixed", "delay": 0})
def ignores_cancel(ctx, *, tag: str) -> str:
    """Never checks: only a forking worker can stop it (after CANCEL_GRACE)."""
    _probe(ctx, tag, note="started")
    time.sleep(_WAIT_BOUND)
    return "ran to its end"


@job(cron="*/2 * * * * * *", system=True, queue="low")
def every_two_seconds(ctx) -> None:
    """A seconds crontab (7 fields): one tick every even second. On the "low" queue, so that
    tests running schedulers for other cron jobs do not see its ticks on "default"."""


@job
def logs_in_parts(ctx, *, tag: str) -> None:
    """ctx.log.child(): bound fields on every line of a part of the job; debug lines."""
    charge = ctx.log.child(step="charge", invoice=7)
    charge.info("charging", amount=12)
    charge.child(attempt_no=2, step="retry-charge").warning("again")
    ctx.log.debug("noisy detail", tag=tag)
    ctx.log.info("done")


_RAW = EscapeHatch(reason="tests: server-side sleeps and backend ids", grants=["unsafe_raw"])


def _backend_pid() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return int(cursor.fetchone()[0])


@job(timeout=1, escape_hatch=_RAW)
def sleeps_in_postgres(ctx, *, tag: str) -> None:
    """Blocks in one statement far beyond its timeout."""
    with ctx.unsafe_raw():
        _probe(ctx, tag, note=f"pid {_backend_pid()}")
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_sleep(30) /* kumiko-timeout-probe */")
    _probe(ctx, tag, note="woke up")


@job
def holds_a_slot(ctx, *, tag: str, release: str) -> None:
    """Runs until the file ``release`` exists (a minute at most): a test keeps a slot busy."""
    end = time.monotonic() + 60
    while not os.path.exists(release) and time.monotonic() < end:
        time.sleep(0.1)
    _probe(ctx, tag, note="released")


@job(escape_hatch=_RAW)
def reports_backend(ctx, *, tag: str) -> None:
    with ctx.unsafe_raw():
        _probe(ctx, tag, note=f"pid {_backend_pid()}")


@job
def final_attempt_probe(ctx, *, tag: str) -> None:
    _probe(ctx, tag, note=f"attempt {ctx.attempt} final {ctx.final_attempt}")


@job(concurrency="sequential")
def sequential_may_fail(ctx, *, tag: str, fail: bool = False) -> None:
    _probe(ctx, tag)
    if fail:
        raise RuntimeError("the sequential run failed")


def _fail_on_first_attempt(ctx) -> None:
    if ctx.attempt == 1:
        raise ConnectionError(f"attempt 1 of {ctx.job_name} failed")


@job(cron="0 6 * * *", system=True, retries=1, backoff={"type": "fixed", "delay": 0})
def cron_retried(ctx) -> None:
    """A system cron whose tick fails once, then succeeds."""
    _fail_on_first_attempt(ctx)


@job(per_tenant=True, retries=1, backoff={"type": "fixed", "delay": 0})
def fanout_child_retried(ctx, *, tag: str) -> None:
    """Each tenant's child fails its first attempt, then succeeds."""
    _probe(ctx, tag, note=f"attempt {ctx.attempt}")
    _fail_on_first_attempt(ctx)


from . import async_jobs  # noqa: E402,F401 - registers the async test jobs

# --- atomic=True (tests/integration/test_atomic.py) -----------------------------------------


@job(atomic=True, retries=1, backoff={"type": "fixed", "delay": 0})
def atomic_write(ctx, *, tag: str, fail: bool = False, how: str = "") -> str:
    """Write a Probe, then maybe fail or try to end the runner's transaction (``how``)."""
    _probe(ctx, tag)
    if how == "sql_commit":
        with connection.cursor() as cursor:
            cursor.execute("COMMIT")
    elif how == "driver_commit":
        connection.connection.commit()  # the raw psycopg connection: past every wrapper
    elif how == "swallow_commit":
        try:
            with connection.cursor() as cursor:
                cursor.execute("COMMIT")
        except Exception:
            pass
    elif how == "savepoint":
        from django.db import transaction

        try:
            with transaction.atomic():
                _probe(ctx, tag + "-inner")
                raise RuntimeError("rolls back the savepoint only")
        except RuntimeError:
            pass
    if fail:
        raise RuntimeError("atomic_write fails after its write")
    return tag


@job(retries=1, backoff={"type": "fixed", "delay": 0})
def plain_write(ctx, *, tag: str, how: str = "") -> str:
    """atomic_write without atomic=True (calibrations)."""
    _probe(ctx, tag)
    if how == "sql_commit":
        with connection.cursor() as cursor:
            cursor.execute("COMMIT")
    return tag


@job(
    atomic=True,
    tenant_visible_failure={"message_key": "testapp.generic", "subject_fields": ["tag"]},
)
def atomic_reports(ctx, *, tag: str) -> str:
    """Logs, reports progress and writes (tests/integration/test_atomic_finish_rides.py)."""
    ctx.log.info("writing", tag=tag)
    ctx.progress(0.5, "half way")
    _probe(ctx, tag)
    return tag


@job(atomic=True)
def atomic_followup(ctx, *, tag: str) -> None:
    ctx.enqueue(probe, tag=tag)


@job(unique=["invoice_id"])
def unique_sync(ctx, *, invoice_id: int, note: str = "", force: bool = False) -> None:
    """A unique job: one active run per (tenant, invoice_id), whatever the note."""
    _probe(ctx, f"unique-{invoice_id}", note=note)


@job(unique=True, unique_for=3600)
def unique_hourly(ctx, *, account: str, full: bool = False) -> None:
    """Unique by every argument, and for an hour after a run of the same key finished."""
    _probe(ctx, f"hourly-{account}", note=str(full))


@job
def enqueue_unique_followups(ctx, *, invoice_id: int) -> None:
    """Enqueues the same unique follow-up twice in one attempt."""
    unique_sync.enqueue(invoice_id=invoice_id, note="followup-1")
    unique_sync.enqueue(invoice_id=invoice_id, note="followup-2")


from . import workflow_jobs  # noqa: E402,F401 - registers the workflow test jobs


# Rate limits (tests/integration/test_rate_limits.py): starts counted per window by the fair
# dequeue, across tenants and per tenant.
@job(rate_limit="5/s")
def rate_probe(ctx, *, tag: str) -> str:
    _probe(ctx, tag)
    return tag


@job(tenant_rate_limit="2/h")
def tenant_rate_probe(ctx, *, tag: str) -> str:
    _probe(ctx, tag)
    return tag


# Flow control end to end (tests/integration/test_flow_end_to_end*.py): a retry with a real
# backoff (so rq-scheduler moves it) under a rate limit, and a unique job that defers once.
@job(retries=1, backoff={"type": "fixed", "delay": 1}, rate_limit="3/s")
def flow_retried(ctx, *, tag: str) -> str:
    _probe(ctx, tag, note=f"a{ctx.attempt}")
    if ctx.attempt == 1:
        raise RuntimeError("the first attempt fails; the retry waits a second in rq-scheduler")
    return tag


@job(unique=["invoice_id"], rate_limit="3/s")
def flow_unique_defers(ctx, *, invoice_id: int, tag: str) -> object:
    if not Probe.objects.filter(tag=tag, note="deferring").exists():
        _probe(ctx, tag, note="deferring")
        return ctx.defer(1)
    _probe(ctx, tag, note="resumed")
    return None


@job(rate_limit="2/h", rate_limit_by="account")
def per_account(ctx, *, account: str, tag: str) -> str:
    """Two starts an hour per external account, across tenants (``rate_limit_by``)."""
    _probe(ctx, tag, note=account)
    return tag


# Caps in the fair dequeue (tests/integration/test_fair_caps.py): a sequential job whose first
# attempt takes ``seconds``, and a job of its own cap per tenant.
@job(concurrency="sequential", retries=2, backoff={"type": "fixed", "delay": 0})
def sequential_sleeper(ctx, *, tag: str, seconds: float = 0.0) -> None:
    if ctx.attempt == 1:
        time.sleep(seconds)
    _probe(ctx, tag)


@job(tenant_concurrency=2, retries=2, backoff={"type": "fixed", "delay": 0})
def two_per_tenant(ctx, *, tag: str, seconds: float = 0.0) -> None:
    if ctx.attempt == 1:
        time.sleep(seconds)
    _probe(ctx, tag)


@job(retries=2, backoff={"type": "fixed", "delay": 0})
def effect_then_history_lost(ctx, *, tag: str, history_pid: int, dsn: str) -> None:
    """Commits its effect, then has PostgreSQL end session ``history_pid`` (the worker's
    history connection) and waits until it is gone, so that the run's finish meets a dead
    connection (tests/integration/test_chaos_finish_cut.py). Ends it on the first attempt only.
    """
    import psycopg

    _probe(ctx, tag)
    if ctx.attempt == 1:
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s, 30000)", [history_pid])


# A failover's lost success (tests/integration/test_failover_postgres.py): sequential runs whose
# first attempt waits for the test's signal, a file, so that the test decides when it ends.
def _held(ctx, tag: str, gate: str) -> None:
    deadline = time.monotonic() + _WAIT_BOUND
    while ctx.attempt == 1 and not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.05)
    _probe(ctx, tag)


@job(concurrency="sequential")
def held_once(ctx, *, tag: str, gate: str) -> None:
    """No retries: an attempt whose end is unknown is its last."""
    _held(ctx, tag, gate)


@job(concurrency="sequential", retries=1, backoff={"type": "fixed", "delay": 0})
def held_retried(ctx, *, tag: str, gate: str) -> None:
    _held(ctx, tag, gate)


@job(atomic=True, retries=2, backoff={"type": "fixed", "delay": 0})
def atomic_then_session_lost(ctx, *, tag: str, dsn: str) -> None:
    """Writes its effect in its atomic transaction, then (first attempt only) has PostgreSQL end
    the body's own session and waits until it is gone, so that the success meets a dead
    connection (tests/integration/test_chaos_finish_cut.py)."""
    import psycopg

    _probe(ctx, tag)
    if ctx.attempt == 1:
        pid = connection.connection.info.backend_pid
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s, 30000)", [pid])


if os.environ.get("KUMIKO_TEST_BOOT_JOB") == "1":
    # Only in the worker processes of tests/integration/test_chaos_worker_redis_cuts.py: a
    # worker with a boot job reads the Redis dataset's token when it starts.

    @job(per_tenant=True, run_on_boot=True)
    def booted(ctx) -> None:
        _probe(ctx, "booted")


# A system job tenant runs may start, counted against the starting tenant's flow control
# (tests/integration/test_flow_tenant_started.py).


@job(system=True, tenant_may_start=True)
def tenant_started_system(ctx, *, tag: str, seconds: float = 0.0) -> str:
    """Sleeps ``seconds``; returns the schema it ran in (a system run: public)."""
    time.sleep(seconds)
    return str(connection.schema_name)


@job
def starts_system_runs(ctx, *, tag: str, count: int = 1, seconds: float = 0.0) -> None:
    """A tenant's run that starts ``count`` runs of ``tenant_started_system``."""
    _probe(ctx, tag)
    for n in range(count):
        ctx.enqueue(tenant_started_system, tag=f"{tag}-{n}", seconds=seconds)


@job(system=True, tenant_may_start=True, concurrency="skip")
def tenant_started_skip(ctx, *, tag: str) -> str:
    return tag


@job(system=True, tenant_may_start=True, unique=("key",))
def tenant_started_unique(ctx, *, key: int, tag: str = "") -> str:
    return tag


@job
def starts_skip_and_unique(ctx, *, tag: str) -> None:
    """A tenant's run that starts a ``concurrency="skip"`` and a unique system job."""
    _probe(ctx, tag)
    ctx.enqueue(tenant_started_skip, tag=f"{tag}-skip")
    ctx.enqueue(tenant_started_unique, key=1, tag=f"{tag}-unique")
