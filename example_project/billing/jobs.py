"""Jobs of the billing app, discovered by kumiko_jobs at start-up."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.utils import timezone

from kumiko_jobs import Unrecoverable, job

from .models import ActivityLog, Invoice

if TYPE_CHECKING:
    from kumiko_jobs.context import JobContext


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
