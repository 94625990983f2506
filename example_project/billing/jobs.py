"""Jobs of the billing app, discovered by kumiko_jobs at start-up."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from django.db import connection
from django.utils import timezone

from kumiko_jobs import Unrecoverable, job

from .models import ActivityLog, Invoice

if TYPE_CHECKING:
    from kumiko_jobs.run.context import JobContext


@job(
    retries=3,
    backoff={"type": "exponential", "delay": 1},
    tenant_visible_run=["invoice_id"],
    tenant_visible_failure={"message_key": "billing.sync_failed", "subject_fields": ["invoice_id"]},
    manual=True,
)
def sync_invoice(ctx: JobContext, *, invoice_id: int, fail_times: int = 0) -> None:
    """Send an invoice to the (pretend) accounting provider.

    ``fail_times`` makes the provider fail on the first attempts, to show retries.
    """
    invoice = Invoice.objects.get(pk=invoice_id)
    invoice.sync_attempts += 1
    invoice.save(update_fields=["sync_attempts"])
    if ctx.attempt <= fail_times:
        ctx.log.warning("provider timed out", invoice=invoice.number, attempt=ctx.attempt)
        raise ConnectionError("accounting provider timed out")
    invoice.synced_at = timezone.now()
    invoice.save(update_fields=["synced_at"])
    ctx.log.info("synced", invoice=invoice.number)


@job(
    tenant_visible_run=["invoice_id"],
    tenant_visible_failure={
        "message_key": "billing.invoice_rejected",
        "subject_fields": ["invoice_id"],
    },
)
def validate_invoice(ctx: JobContext, *, invoice_id: int) -> None:
    """Check an invoice; negative amounts are rejected for good."""
    invoice = Invoice.objects.get(pk=invoice_id)
    if invoice.amount < 0:
        raise Unrecoverable(f"invoice {invoice.number} has a negative amount")
    ActivityLog.objects.create(job=ctx.job_name, message=f"validated {invoice.number}")


@job
def record_activity(ctx: JobContext, *, message: str) -> None:
    """Write one line into the tenant's activity log."""
    ActivityLog.objects.create(job=ctx.job_name, message=message)


@job(tenant_visible_run=["invoice_id"])
def approve_invoice(ctx: JobContext, *, invoice_id: int) -> None:
    """Approve an invoice, then sync it.

    The sync is a follow-up (``ctx.enqueue``): it runs in the same tenant with the same
    correlation id, and only once this run has succeeded.
    """
    invoice = Invoice.objects.get(pk=invoice_id)
    ActivityLog.objects.create(job=ctx.job_name, message=f"approved {invoice.number}")
    ctx.enqueue(sync_invoice, invoice_id=invoice_id)


@job
def bench_write(ctx: JobContext, *, n: int) -> None:
    """One small tenant write: the unit of work that bench/throughput.py measures.

    Kept identical to the plain django-rq function of the benchmark so that the two numbers
    differ only by what kumiko_jobs adds around the job body.
    """
    ActivityLog.objects.create(job="bench", message=f"write {n}")


@job(rate_limit="20/s")
def bench_rate_write(ctx: JobContext, *, n: int) -> None:
    """``bench_write`` under a rate limit across tenants: bench/rate_limits.py."""
    ActivityLog.objects.create(job="bench", message=f"rate {n}")


@job(tenant_rate_limit="5/s")
def bench_tenant_rate_write(ctx: JobContext, *, n: int) -> None:
    """``bench_write`` under a rate limit per tenant: bench/rate_limits.py."""
    ActivityLog.objects.create(job="bench", message=f"tenant rate {n}")


@job(atomic=True)
def bench_write_atomic(ctx: JobContext, *, n: int) -> None:
    """``bench_write`` declared ``atomic=True``: bench/throughput.py --atomic, variant (d)."""
    ActivityLog.objects.create(job="bench", message=f"write {n}")


@job(per_tenant=True)
def bench_fanout(ctx: JobContext, *, n: int) -> None:
    """``bench_write`` as a per-tenant job: bench/fanout.py times its fan-out to every tenant.

    Enqueued without ``tenant=``, one run fans out into one child run per active tenant;
    with ``tenant=`` it is a single run, the same message a child gets.
    """
    ActivityLog.objects.create(job="bench", message=f"fanout {n}")


@job(system=True, timeout=3600)
def bench_hold(ctx: JobContext, *, key: str, seconds: int = 1800) -> None:
    """Keep this worker busy until the benchmark pushes a token onto the Redis list ``key``.

    bench/fairness.py starts its workers on these, so that a backlog can be built while both
    are warm and held, then released at one moment for every measured mode alike. It polls
    (every 5 ms) rather than blocking in BLPOP, which the worker's socket timeout would cut off.
    """
    import time

    import django_rq

    redis = django_rq.get_connection("default")
    deadline = time.monotonic() + seconds
    while redis.lpop(key) is None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"nobody pushed onto {key!r} within {seconds} s")
        time.sleep(0.005)


# --- the soak's jobs (bench/soak.py and the reliability tests) ------------------------------


@job(name="soak.work", retries=5, backoff={"type": "fixed", "delay": 1})
def soak_work(
    ctx: JobContext,
    *,
    n: int,
    sleep_ms: int = 0,
    fail_first: bool = False,
    defer_first: bool = False,
) -> Any:
    """One unit of soak work: maybe wait, fail once or defer once, then write the effect."""
    if sleep_ms:
        time.sleep(sleep_ms / 1000)
    if fail_first and ctx.attempt == 1:
        raise RuntimeError("soak: the first attempt fails on purpose")
    if defer_first and not ActivityLog.objects.filter(job="soak-defer", message=ctx.run_id):
        ActivityLog.objects.create(job="soak-defer", message=ctx.run_id)
        return ctx.defer(1)
    ActivityLog.objects.create(
        job="soak",
        message=f"{ctx.run_id} a{ctx.attempt} {connection.schema_name}",  # type: ignore[attr-defined]
    )
    return None


@job(name="soak.work_atomic", retries=5, backoff={"type": "fixed", "delay": 1}, atomic=True)
def soak_work_atomic(
    ctx: JobContext,
    *,
    n: int,
    sleep_ms: int = 0,
    fail_first: bool = False,
    defer_first: bool = False,
) -> Any:
    """soak.work with atomic=True: its effect row commits with the run's success, or not at all.

    A deferring attempt of an atomic job keeps nothing it wrote, so the deferral is decided from
    the run's own count (``ctx.defers``), not from a marker row.
    """
    if sleep_ms:
        time.sleep(sleep_ms / 1000)
    if fail_first and ctx.attempt == 1:
        raise RuntimeError("soak: the first attempt fails on purpose")
    if defer_first and ctx.defers == 0:
        return ctx.defer(1)
    ActivityLog.objects.create(
        job="soak",
        message=f"{ctx.run_id} a{ctx.attempt} {connection.schema_name}",  # type: ignore[attr-defined]
    )
    return None


def _sleep_then_write(ctx: JobContext, tag: str, seconds: float, sleep_attempts: int) -> None:
    """Sleep on the first ``sleep_attempts`` attempts (long enough to be killed mid-run in the
    crash and outage tests), then write one effect row."""
    if ctx.attempt <= sleep_attempts:
        time.sleep(seconds)
    ActivityLog.objects.create(
        job="sleeper",
        message=f"{tag} a{ctx.attempt} {connection.schema_name}",  # type: ignore[attr-defined]
    )


@job(name="soak.sleeper", retries=2, backoff={"type": "fixed", "delay": 0})
def soak_sleeper(
    ctx: JobContext, *, tag: str, seconds: float = 0.0, sleep_attempts: int = 1
) -> None:
    _sleep_then_write(ctx, tag, seconds, sleep_attempts)


@job(name="soak.sleeper_once", retries=0)
def soak_sleeper_once(
    ctx: JobContext, *, tag: str, seconds: float = 0.0, sleep_attempts: int = 1
) -> None:
    _sleep_then_write(ctx, tag, seconds, sleep_attempts)
