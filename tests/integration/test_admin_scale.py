"""The run lists when the history is large and the tenants many (issue 15).

Real PostgreSQL and the real middleware stack (``localhost`` = operators, ``t1.localhost`` =
tenant t1); rows are bulk-created, since what is tested is how the admin reads them. The
limits (pages counted, tenants listed) are lowered here so that a few hundred rows show what
millions would; bench/history_scale.py measures the real sizes.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from kumiko_jobs import transport
from kumiko_jobs.admin import filters, pagination
from kumiko_jobs.admin.run_job import RunJobForm
from kumiko_jobs.models import JobFailure, JobRun, RunStatus
from tests.integration.test_admin import (
    FAILURES,
    RUN_JOB,
    RUNS,
    client_for,
    make_user,
    text,
)

pytestmark = pytest.mark.usefixtures("live_db")


@pytest.fixture
def operator() -> Any:
    return client_for("localhost", "public", make_user("public", "operator", superuser=True))


@pytest.fixture
def clerk() -> Any:
    user = make_user("t1", "clerk", perms=("view_jobrun", "view_jobfailure"))
    return client_for("t1.localhost", "t1", user)


def bulk_runs(
    count: int, *, schema: str = "t1", job: str = "scale.job_a", status: str = "succeeded"
) -> list[JobRun]:
    now = timezone.now()
    return JobRun.objects.bulk_create(
        JobRun(
            run_id=uuid.uuid4(),
            job_name=job,
            schema_name=schema,
            subject=f"invoice_id={i}",
            status=status,
            queue="default",
            queued_at=now - timedelta(minutes=i),
            correlation_id=uuid.uuid4().hex,
        )
        for i in range(count)
    )


def bulk_failures(count: int, *, schema: str = "t1", job: str = "scale.job_a") -> list[JobFailure]:
    now = timezone.now()
    return JobFailure.objects.bulk_create(
        JobFailure(
            schema_name=schema,
            job_name=job,
            subject=f"invoice_id={i}",
            message_key="billing.sync_failed",
            failed_at=now - timedelta(minutes=i),
            run_id=uuid.uuid4(),
        )
        for i in range(count)
    )


def on_page(response: Any) -> list[uuid.UUID]:
    assert response.status_code == 200, response.content[:300]
    return [run.pk for run in response.context["cl"].result_list]


def filter_choices(response: Any, parameter: str) -> list[str]:
    cl = response.context["cl"]
    spec = next(s for s in cl.filter_specs if getattr(s, "parameter_name", "") == parameter)
    return [str(c["display"]) for c in spec.choices(cl)][1:]  # without "All"


# --- counting and pages -----------------------------------------------------------------------


def test_pages_are_counted_only_as_far_as_the_list_goes(operator, monkeypatch):
    monkeypatch.setattr(pagination, "MAX_PAGES", 2)
    runs = bulk_runs(130)  # newest first, one minute apart
    newest_first = [r.run_id for r in runs]

    with CaptureQueriesContext(connection) as captured:
        first = operator.get(RUNS)
    assert on_page(first) == newest_first[:50]
    assert "More than 100 job runs: the newest are listed." in text(first)
    counts = [q["sql"] for q in captured.captured_queries if "COUNT(" in q["sql"].upper()]
    assert counts and all("LIMIT 101" in sql for sql in counts)  # never the whole table

    # The last page offered holds rows 51-100, in the list's order (keys, then rows).
    assert on_page(operator.get(RUNS, {"p": 2})) == newest_first[50:100]
    # Page 3 is not offered: Django's changelist answers an unknown page with ?e=1.
    assert operator.get(RUNS, {"p": 3}).status_code == 302


def test_calibration_an_uncapped_list_says_how_many(operator, monkeypatch):
    monkeypatch.setattr(pagination, "MAX_PAGES", 3)
    bulk_runs(130)
    html = text(operator.get(RUNS))
    assert "130 job runs" in html and "More than" not in html


def test_select_all_is_refused_beyond_what_the_list_counts(operator, monkeypatch):
    monkeypatch.setattr(pagination, "MAX_PAGES", 1)
    runs = bulk_runs(60, status=RunStatus.QUEUED)
    data = {
        "action": "cancel_selected",
        "index": 0,
        "select_across": "1",
        "_selected_action": [str(runs[0].run_id)],
    }
    response = operator.post(RUNS, data, follow=True)
    assert "More than 50 runs match: filter the list to fewer" in text(response)
    assert JobRun.objects.filter(status=RunStatus.CANCELLED).count() == 0

    # Calibration: the same "select all" within the cap does act on every row.
    monkeypatch.setattr(pagination, "MAX_PAGES", 2)
    operator.post(RUNS, data, follow=True)
    assert JobRun.objects.filter(status=RunStatus.CANCELLED).count() == 60


# --- filters --------------------------------------------------------------------------------


def test_job_filter_reads_the_names_from_the_index_for_each_audience(operator, clerk):
    bulk_runs(3, job="scale.b_job")
    bulk_runs(2, job="scale.a_job")
    bulk_runs(2, schema="t2", job="scale.c_only_t2")
    expected = list(
        JobRun.objects.order_by("job_name").values_list("job_name", flat=True).distinct()
    )
    assert filters.run_job_names() == expected == ["scale.a_job", "scale.b_job", "scale.c_only_t2"]
    assert filter_choices(operator.get(RUNS), "job") == expected
    # A tenant sees its own jobs only, never another tenant's.
    assert filters.run_job_names("t1") == ["scale.a_job", "scale.b_job"]
    assert filter_choices(clerk.get(RUNS), "job") == ["scale.a_job", "scale.b_job"]


def test_many_tenants_turn_the_tenant_filter_into_an_input(operator, monkeypatch):
    bulk_runs(2, schema="t2", status=RunStatus.FAILED)
    bulk_runs(1, schema="t3", status=RunStatus.FAILED)
    bulk_runs(1, schema="t2")

    # Few tenants: one link each (t1, t2, t3 and "system").
    few = operator.get(RUNS)
    assert filter_choices(few, "tenant")[:3] == [
        "t1 (Tenant T1)",
        "t2 (Tenant T2)",
        "t3 (Tenant T3)",
    ]
    assert 'id="kj-tenant-filter"' not in text(few)

    monkeypatch.setattr(filters.TenantFilter, "MAX_CHOICES", 2)
    many = operator.get(RUNS, {"status__exact": "failed"})
    html = text(many)
    assert 'id="kj-tenant-filter"' in html and 'name="tenant"' in html
    assert filter_choices(many, "tenant") == ["system (no tenant)"]
    assert "?tenant=t3" not in html and "tenant=t3&amp;" not in html
    # The input's form carries the other filters along.
    assert '<input type="hidden" name="status__exact" value="failed">' in html

    chosen = operator.get(RUNS, {"status__exact": "failed", "tenant": "t2"})
    assert len(on_page(chosen)) == 2
    assert {r.schema_name for r in chosen.context["cl"].result_list} == {"t2"}
    assert filter_choices(chosen, "tenant") == ["t2", "system (no tenant)"]


def test_listing_tenants_costs_one_bounded_query(operator, monkeypatch):
    monkeypatch.setattr(filters.TenantFilter, "MAX_CHOICES", 2)
    with CaptureQueriesContext(connection) as captured:
        operator.get(RUNS)
    tenant_queries = [q["sql"] for q in captured.captured_queries if "customers_client" in q["sql"]]
    # The domain lookup of the middleware and the filter's one LIMITed read of the tenants.
    listing = [sql for sql in tenant_queries if "ORDER BY" in sql]
    assert len(listing) == 1 and "LIMIT 3" in listing[0]


# --- the failures' job filter ----------------------------------------------------------------


def test_failure_job_filter_reads_the_names_from_an_index_for_each_audience(operator, clerk):
    bulk_failures(3, job="scale.b_job")
    bulk_failures(2, job="scale.a_job")
    bulk_failures(2, schema="t2", job="scale.c_only_t2")
    bulk_failures(1, schema="t2", job="scale.a_job")
    expected = list(
        JobFailure.objects.order_by("job_name").values_list("job_name", flat=True).distinct()
    )
    assert filters.failure_job_names() == expected
    assert expected == ["scale.a_job", "scale.b_job", "scale.c_only_t2"]
    with CaptureQueriesContext(connection) as captured:
        response = operator.get(FAILURES)
    assert filter_choices(response, "job") == expected
    # The names come from the walk, not from reading the whole table.
    assert not [q for q in captured.captured_queries if "DISTINCT" in q["sql"].upper()]
    # A tenant sees its own jobs only, never another tenant's.
    assert filters.failure_job_names("t1") == ["scale.a_job", "scale.b_job"]
    assert filters.failure_job_names("t3") == []
    assert filter_choices(clerk.get(FAILURES), "job") == ["scale.a_job", "scale.b_job"]


def explain_without_seq_scans(statement: str, params: Any = ()) -> str:
    """The plan PostgreSQL makes when it may not read the (tiny) table whole: an index that can
    answer the statement shows up in it, or a Sort/Seq Scan if there is none."""
    with connection.cursor() as cursor:
        cursor.execute("SET enable_seqscan = off")
        try:
            cursor.execute("EXPLAIN " + statement, params)
            return "\n".join(row[0] for row in cursor.fetchall())
        finally:
            cursor.execute("RESET enable_seqscan")


def test_failures_list_and_its_job_names_are_read_from_indexes(operator):
    bulk_failures(3)
    # The operators' walk over the job names: each probe a step in a job_name-led index.
    walk = explain_without_seq_scans(
        "SELECT job_name FROM kumiko_jobs_jobfailure WHERE job_name > 'a' ORDER BY job_name LIMIT 1"
    )
    assert "kj_failure_job_recent" in walk and "Sort" not in walk
    # A tenant's walk stays in its own rows through the unique (schema, job, subject) index.
    tenant_walk = explain_without_seq_scans(
        "SELECT job_name FROM kumiko_jobs_jobfailure WHERE schema_name = 't1'"
        " AND job_name > 'a' ORDER BY job_name LIMIT 1"
    )
    assert "kj_failure_one_per_subject" in tenant_walk and "Sort" not in tenant_walk
    # The list's pages, plain and by job, in the list's order without sorting the table.
    with CaptureQueriesContext(connection) as captured:
        operator.get(FAILURES)
        operator.get(FAILURES, {"job": "scale.job_a"})
    pages = [
        q["sql"]
        for q in captured.captured_queries
        if 'ORDER BY "kumiko_jobs_jobfailure"."failed_at" DESC' in q["sql"]
        and "COUNT(" not in q["sql"].upper()
    ]
    assert len(pages) == 2
    plain, by_job = (explain_without_seq_scans(sql) for sql in pages)
    assert "kj_failure_recent" in plain and "Sort" not in plain
    assert "kj_failure_job_recent" in by_job and "Sort" not in by_job


# --- the run-job form's tenant ----------------------------------------------------------------


def test_run_job_form_offers_a_select_for_few_tenants_and_an_input_for_many(operator, monkeypatch):
    few = text(operator.get(RUN_JOB))
    assert '<select name="tenant"' in few
    assert '<option value="t1">' in few and '<option value="t3">' in few
    assert '<option value="public">' not in few

    monkeypatch.setattr(RunJobForm, "MAX_TENANT_CHOICES", 2)
    with CaptureQueriesContext(connection) as captured:
        many = text(operator.get(RUN_JOB))
    assert '<select name="tenant"' not in many
    assert '<input type="text" name="tenant"' in many
    assert '<option value="t1">' not in many
    # The tenants are read once, only as many as tell that the select would overflow.
    listing = [q["sql"] for q in captured.captured_queries if "customers_client" in q["sql"]]
    listing = [sql for sql in listing if "ORDER BY" in sql]
    assert len(listing) == 1 and "LIMIT 3" in listing[0]


@pytest.mark.parametrize(
    ("tenant", "error"),
    [
        ("no_such_tenant", "No tenant has the schema name “no_such_tenant”."),
        ("public", "“public” is the public schema, not a tenant&#x27;s."),
        ("", "Choose the tenant"),
    ],
)
def test_typed_tenant_must_be_a_tenant_and_nothing_is_enqueued_otherwise(
    operator, monkeypatch, tenant, error
):
    monkeypatch.setattr(RunJobForm, "MAX_TENANT_CHOICES", 2)
    data = {"job": "billing.sync_invoice", "tenant": tenant, "arguments": '{"invoice_id": 7}'}
    response = operator.post(RUN_JOB, data)
    assert response.status_code == 200
    assert error in text(response)
    assert not JobRun.objects.exists()
    assert transport.queue_length("default") == 0


def test_typed_tenant_enqueues_the_job_in_that_tenant(operator, monkeypatch):
    monkeypatch.setattr(RunJobForm, "MAX_TENANT_CHOICES", 2)
    data = {"job": "billing.sync_invoice", "tenant": " t2 ", "arguments": '{"invoice_id": 7}'}
    response = operator.post(RUN_JOB, data)
    run = JobRun.objects.get()
    assert response.status_code == 302 and response["Location"] == f"{RUNS}{run.run_id}/change/"
    assert (run.job_name, run.schema_name, run.payload) == (
        "billing.sync_invoice",
        "t2",
        {"invoice_id": 7},
    )
    assert transport.queue_length("default") == 1


# --- search ----------------------------------------------------------------------------------


def test_operator_search_matches_subject_job_name_and_correlation_id(operator):
    [a] = bulk_runs(1, job="scale.alpha_sync")
    [b] = bulk_runs(1, job="scale.beta")
    JobRun.objects.filter(pk=b.pk).update(subject="order=77")

    def found(q: str) -> set[uuid.UUID]:
        return set(on_page(operator.get(RUNS, {"q": q})))

    assert found("ALPHA_s") == {a.run_id}  # part of a job name, any case
    assert found("ORDER=77") == {b.run_id}  # a whole field=value, any case
    assert found("order=777") == set()
    assert found("other=77") == set()  # the value alone is not enough
    assert found("der=7") == {b.run_id}  # part of a subject
    assert found(b.correlation_id) == {b.run_id}  # a correlation id, exactly
    assert found(b.correlation_id[:10]) == set()
    assert found("scale. order") == {b.run_id}  # every word must match somewhere
    assert found("no-such-thing") == set()


def test_tenant_search_still_looks_at_subjects_only(clerk):
    [mine] = bulk_runs(1, job="scale.alpha")
    bulk_runs(1, schema="t2")
    assert set(on_page(clerk.get(RUNS, {"q": "invoice_id=0"}))) == {mine.run_id}
    assert on_page(clerk.get(RUNS, {"q": "alpha"})) == []
    assert on_page(clerk.get(RUNS, {"q": mine.correlation_id})) == []


def test_search_plans_use_the_indexes(operator):
    """The SQL the admin sends for a search can be answered from indexes (no Seq Scan on the
    run table), once the planner knows the table is not tiny."""
    bulk_runs(3)
    with CaptureQueriesContext(connection) as captured:
        operator.get(RUNS, {"q": "invoice_id=123"})
    # The rows' query (one page, so no separate keys query); the count is the other one.
    [rows] = [
        q["sql"]
        for q in captured.captured_queries
        if "UPPER(" in q["sql"] and "COUNT(" not in q["sql"].upper()
    ]
    with connection.cursor() as cursor:
        # A 3-row table is best read whole or in order: leave the planner only bitmap index
        # scans, which exist only if every branch of the search condition has an index.
        cursor.execute("SET enable_seqscan = off")
        cursor.execute("SET enable_indexscan = off")
        try:
            cursor.execute("EXPLAIN " + rows)
            plan = "\n".join(row[0] for row in cursor.fetchall())
        finally:
            cursor.execute("RESET enable_seqscan")
            cursor.execute("RESET enable_indexscan")
    assert "kj_run_subject_trgm" in plan
    assert "Seq Scan on kumiko_jobs_jobrun" not in plan
    # The index is asked for the value only (the field name is in every row); the whole
    # word is checked on the rows it finds.
    assert "~~ '%123%'::text" in plan
    assert "lower((subject)::text) ~~ '%invoice\\_id=123%'::text" in plan  # _ escaped
