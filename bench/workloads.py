"""The plain django-rq side of the benchmarks: what a team writes without kumiko_jobs.

RQ imports these by dotted path in the worker, so they live in a module of their own rather
than in the benchmark script (whose name is ``__main__`` when it runs).
"""

from __future__ import annotations

from django_tenants.utils import schema_context

from example_project.billing.models import ActivityLog


def plain_write(schema_name: str, n: int) -> None:
    """The same write as ``billing.bench_write``, entering the tenant by hand."""
    with schema_context(schema_name):
        ActivityLog.objects.create(job="bench", message=f"write {n}")


def plain_sleep_write(schema_name: str, tag: str, seconds: float) -> None:
    """``soak.sleeper``'s body for plain RQ: wait ``seconds`` (the GIL released, as in a socket
    read), then the same one write, entering the tenant by hand (bench/scale.py)."""
    import time

    time.sleep(seconds)
    with schema_context(schema_name):
        ActivityLog.objects.create(job="sleeper", message=f"{tag} a1 {schema_name}")
