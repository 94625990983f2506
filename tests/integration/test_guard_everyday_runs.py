"""Ordinary ORM work passes the guard: real jobs in t1, no grant, DB_GUARD 'enforce'.

The attack suite proves what the guard stops; this proves what it must not stop. Each case is
one run of ``guardapp.everyday`` (joins and subqueries, aggregates, window functions,
``select_for_update(skip_locked=True)``, ``bulk_create(update_conflicts=True)``, JSON lookups,
``iterator()``, savepoints, ``ANY(%s)``, the tenant's own sequence, transaction-level advisory
locks, ``EXPLAIN``, ``SHOW``, reads of shared tables), all in one worker burst.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.conf import settings
from django.db import connection
from django.test import override_settings
from django_tenants.utils import tenant_context

from kumiko_jobs.models import JobRun, RunStatus
from tests.conftest import work
from tests.guardapp import jobs, support

pytestmark = pytest.mark.usefixtures("live_db")

EXPECTED = {
    "subquery_join": "[]",
    "aggregates": "[{'label': 't1-secret', 'n': 1, 'longest': 8}]",
    "window_function": "[('t1-secret', 1)]",
    "exists_outerref": "['t1-secret']",
    "skip_locked": "['t1-secret']",
    "upsert": "'second'",
    "json_lookup": "['json']",
    "iterator": "['t1-secret']",
    "get_or_create": "True",
    "update_f_expression": "1",
    "nested_atomic": "['outer']",
    "raw_any": "[('t1-secret',)]",
    "own_sequence_and_xact_lock": "(True,)",
    "explain_and_show": "(True, ('0',))",
    "shared_reads": "(['basic', 'pro'], True)",
    "count_exists_distinct": "(1, True, 1)",
}


@pytest.fixture
def guard_data(tenants: dict[str, object]) -> Iterator[None]:
    support.seed()
    yield
    support.clean()


def test_everyday_orm_work_runs_under_enforce_without_grants(tenants, guard_data):
    assert sorted(EXPECTED) == jobs.everyday_case_names()
    with override_settings(KUMIKO_JOBS={**settings.KUMIKO_JOBS, "DB_GUARD": "enforce"}):
        with tenant_context(tenants["t1"]):
            handles = {case: jobs.everyday.enqueue(case=case) for case in EXPECTED}
        work()
    connection.set_schema_to_public()
    runs = {case: JobRun.objects.get(pk=h.run_id) for case, h in handles.items()}
    failed = {
        case: (run.status, run.error_type, run.error_message[:300])
        for case, run in runs.items()
        if run.status != RunStatus.SUCCEEDED
    }
    assert failed == {}
    results = {
        key.removeprefix("everyday:"): value
        for key, value in support.findings("t1").items()
        if key.startswith("everyday:")
    }
    assert results == EXPECTED
    # ... and nothing of it reached another tenant or the shared tables.
    assert support.secrets("t2") == [("t2-secret", "t2-value")]
    assert support.plans() == [("basic", "10.00"), ("pro", "25.00")]
