"""Testing the billing jobs with ``kumiko_jobs.testing`` (the worked example of docs/testing.md).

These are ordinary pytest-django tests in the ``db`` fixture: each runs in a transaction that
is rolled back at the end, and nothing needs a worker or Redis. ``kumiko_jobs`` is the fixture
of the ``kumiko_jobs.testing`` plugin (``pytest_plugins = ["kumiko_jobs.testing"]`` in the
project's top-level ``conftest.py``, example_project/conftest.py), which also runs each body as
its tenant's database role (``DB_ROLES``) and drops the roles at the end of the session.
Tenants: example_project/conftest.py creates ``t1`` once per session; a tenant's schema is DDL,
too slow to create per test. Run: ``python -m pytest example_project --ds
example_project.settings`` (this repository's suite runs it so:
tests/integration/test_example_project_tests.py).
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from django_tenants.utils import schema_context

from example_project.billing import jobs
from example_project.billing.models import ActivityLog, Invoice

pytestmark = pytest.mark.django_db


@pytest.fixture
def invoice() -> Invoice:
    with schema_context("t1"):
        return Invoice.objects.create(number="INV-7", amount=Decimal("99.00"))


def test_approving_an_invoice_syncs_it(kumiko_jobs: Any, invoice: Invoice) -> None:
    # What a view would do: enqueue inside the tenant's request (here: its schema).
    with schema_context("t1"):
        handle = jobs.approve_invoice.enqueue(invoice_id=invoice.pk)

    kumiko_jobs.assert_enqueued(jobs.approve_invoice, tenant="t1", invoice_id=invoice.pk)
    kumiko_jobs.run()  # the approval, then its follow-up, the sync

    kumiko_jobs.assert_succeeded(handle)
    (sync,) = kumiko_jobs.runs(jobs.sync_invoice, tenant="t1")
    assert sync.status == "succeeded" and sync.parent_run_id.hex == handle.run_id
    with schema_context("t1"):
        invoice.refresh_from_db()
        assert invoice.synced_at is not None
        assert ActivityLog.objects.filter(message="approved INV-7").exists()


def test_a_flaky_provider_is_retried_with_backoff(kumiko_jobs: Any, invoice: Invoice) -> None:
    handle = jobs.sync_invoice.enqueue(tenant="t1", invoice_id=invoice.pk, fail_times=2)

    first = kumiko_jobs.run()  # attempt 1 fails; attempt 2 waits for its backoff (1 s)
    assert [(r.attempt, r.outcome) for r in first] == [(1, "retrying")]

    rest = kumiko_jobs.run(include_scheduled=True)  # move the clock past every backoff
    assert [(r.attempt, r.outcome) for r in rest] == [(2, "retrying"), (3, "succeeded")]
    kumiko_jobs.assert_succeeded(handle)
    with schema_context("t1"):
        invoice.refresh_from_db()
        assert invoice.sync_attempts == 3


def test_a_negative_invoice_is_rejected_for_good(kumiko_jobs: Any) -> None:
    with schema_context("t1"):
        bad = Invoice.objects.create(number="INV-8", amount=Decimal("-1"))
    handle = jobs.validate_invoice.enqueue(tenant="t1", invoice_id=bad.pk)

    kumiko_jobs.run()

    run = kumiko_jobs.assert_failed(handle, "Unrecoverable")
    assert run.attempts == 1  # Unrecoverable is never retried
    kumiko_jobs.assert_nothing_enqueued()
