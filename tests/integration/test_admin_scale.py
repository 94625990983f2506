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
from django.db import connection, transaction
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


# Django's action form reads any value but "", "0" and "false" as "select all": each is refused.
@pytest.mark.parametrize("across", ["1", "2", "true", "on"])
def test_select_all_is_refused_beyond_what_the_list_counts(operator, monkeypatch, across):
    monkeypatch.setattr(pagination, "MAX_PAGES", 1)
    runs = bulk_runs(60, status=RunStatus.QUEUED)
    data = {
        "action": "cancel_selected",
        "index": 0,
        "select_across": across,
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


def test_escape_hatch_uses_filter_by_tenant_through_the_same_input(operator, monkeypatch):
    from django.utils import timezone

    from kumiko_jobs.models import EscapeHatchUse

    now = timezone.now()
    for schema in ("t1", "t2", "t3"):
        EscapeHatchUse.objects.create(
            job_name="billing.rebuild_prices",
            grant="global_writes",
            reason="rebuilds the index",
            schema_name=schema,
            first_seen=now,
            last_seen=now,
        )
    uses = "/admin/kumiko_jobs/escapehatchuse/"
    monkeypatch.setattr(filters.TenantFilter, "MAX_CHOICES", 2)
    many = operator.get(uses)
    html = text(many)
    assert 'id="kj-tenant-filter"' in html
    assert "?tenant=t3" not in html and "?schema_name=" not in html
    chosen = operator.get(uses, {"tenant": "t2"})
    assert [u.schema_name for u in chosen.context["cl"].result_list] == ["t2"]
    assert filter_choices(operator.get(uses), "job") == ["billing.rebuild_prices"]


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


def mixed_history(count: int, *, schema: str = "t1") -> list[JobRun]:
    """``count`` runs in three jobs, three to a timestamp (ties, broken by the run id), whose
    subjects and correlation ids make a search for ``alpha`` match some by job name, some by
    subject, some by correlation id and some by two of them at once."""
    now = timezone.now()
    jobs = ("scale.alpha_sync", "scale.beta", "scale.gamma")
    subjects = ("order=alpha", "order=beta", "order=1")
    return JobRun.objects.bulk_create(
        JobRun(
            run_id=uuid.uuid4(),
            job_name=jobs[i % 3],
            schema_name=schema,
            subject=subjects[(i // 3) % 3] if i % 7 else f"invoice_id={i}",
            status="succeeded",
            queue="default",
            queued_at=now - timedelta(minutes=i // 3),
            correlation_id="alpha" if i % 11 == 0 else uuid.uuid4().hex,
        )
        for i in range(count)
    )


def listed_in_order(runs: list[JobRun], match: Any, *, ascending: bool = False) -> list[uuid.UUID]:
    """The runs ``match`` accepts, in the list's order: queued_at (newest first, or oldest
    first when ``ascending``), then the run id descending (the tie-break Django adds)."""
    chosen = [r for r in runs if match(r)]
    chosen.sort(key=lambda r: r.run_id, reverse=True)
    chosen.sort(key=lambda r: r.queued_at, reverse=not ascending)
    return [r.run_id for r in chosen]


def alpha(run: JobRun) -> bool:
    return (
        "alpha" in run.job_name.casefold()
        or "alpha" in run.subject.casefold()
        or run.correlation_id == "alpha"
    )


def test_operator_search_lists_the_same_runs_in_the_same_order_as_one_condition(
    operator, monkeypatch
):
    """The search reads the first rows of each branch (job name, subject, correlation id) and
    merges them: each page, the count and the "more than" notice are those of the one
    condition, with runs that match two branches listed once and ties kept in order."""
    monkeypatch.setattr(pagination, "MAX_PAGES", 2)  # the list reads 101 rows at most
    runs = mixed_history(400)
    expected = listed_in_order(runs, alpha)
    assert len(expected) > 150  # more than the list reads, so the limit decides
    assert any("alpha" in r.job_name and "alpha" in r.subject for r in runs)  # both branches

    first = operator.get(RUNS, {"q": "alpha"})
    assert on_page(first) == expected[:50]
    assert "More than 100 job runs" in text(first)
    assert on_page(operator.get(RUNS, {"q": "alpha", "p": 2})) == expected[50:100]

    # Oldest first (the queued column sorted by hand): the branches read in that order.
    cl = first.context["cl"]
    queued = cl.list_display.index("queued")
    oldest = operator.get(RUNS, {"q": "alpha", "o": str(queued)})
    assert on_page(oldest) == listed_in_order(runs, alpha, ascending=True)[:50]


def test_operator_search_for_a_job_name_still_finds_subjects_and_correlation_ids(operator):
    [by_job] = bulk_runs(1, job="scale.alpha_sync")
    [by_subject] = bulk_runs(1, job="scale.beta")
    [by_correlation] = bulk_runs(1, job="scale.gamma")
    JobRun.objects.filter(pk=by_subject.pk).update(subject="note=scale.alpha_sync")
    JobRun.objects.filter(pk=by_correlation.pk).update(correlation_id="scale.alpha_sync")
    bulk_runs(3, job="scale.delta")

    assert set(on_page(operator.get(RUNS, {"q": "scale.alpha_sync"}))) == {
        by_job.run_id,
        by_subject.run_id,
        by_correlation.run_id,
    }
    # Two words: each run must match both, the second checked on the first one's branches.
    assert on_page(operator.get(RUNS, {"q": "scale.alpha_sync note=scale"})) == [by_subject.run_id]


def test_operator_search_over_many_job_names_reads_them_as_one_branch(operator, monkeypatch):
    from kumiko_jobs.admin import search

    monkeypatch.setattr(search, "MAX_NAME_BRANCHES", 1)
    runs = mixed_history(60)
    expected = listed_in_order(runs, lambda r: "scale." in r.job_name)
    assert on_page(operator.get(RUNS, {"q": "scale."})) == expected[:50]


def test_tenant_search_for_a_short_value_lists_the_same_runs_in_order(clerk, monkeypatch):
    monkeypatch.setattr(pagination, "MAX_PAGES", 2)
    runs = mixed_history(400)
    mixed_history(30, schema="t2")  # another tenant's matches never count
    expected = listed_in_order(runs, lambda r: "order=1" in r.subject)
    assert len(expected) > 101
    first = clerk.get(RUNS, {"q": "order=1"})
    assert on_page(first) == expected[:50]
    assert "More than 100 job runs" in text(first)
    assert on_page(clerk.get(RUNS, {"q": "order=1", "p": 2})) == expected[50:100]


def test_a_search_within_filters_that_match_nothing_matches_nothing():
    from kumiko_jobs.admin.search import operator_search, tenant_search

    mixed_history(30)
    order = ("-queued_at", "-pk")
    assert list(operator_search(JobRun.objects.none(), "alpha", order, 51)) == []
    assert list(tenant_search(JobRun.objects.filter(status__in=[]), "order=1", order, 51)) == []
    # Calibration: the same searches without the empty filters find runs.
    assert list(operator_search(JobRun.objects.all(), "alpha", order, 51))
    assert list(tenant_search(JobRun.objects.all(), "order=1", order, 51))


def test_the_planner_estimates_a_short_value_search_from_statistics():
    """Migration 0013's statistics on LOWER(subject) match the expression the search writes:
    after ANALYZE the planner estimates how many subjects a value too short for the trigram
    index matches (about a third here) instead of guessing almost none, which at 10 million
    runs made it read the whole table rather than the tenant's runs newest first."""
    from kumiko_jobs.admin.search import tenant_search

    runs = mixed_history(600)
    matching = sum("order=1" in r.subject for r in runs)

    def estimate(queryset: Any) -> float:
        statement, params = queryset.query.sql_with_params()
        with connection.cursor() as cursor:
            cursor.execute("EXPLAIN (FORMAT JSON) " + statement, params)
            plan = cursor.fetchone()[0]
        return float(plan[0]["Plan"]["Plan Rows"])

    with connection.cursor() as cursor:
        cursor.execute("ANALYZE kumiko_jobs_jobrun")
    searched = tenant_search(JobRun.objects.filter(schema_name="t1"), "order=1")
    assert matching / 3 < estimate(searched) < matching * 3
    # Calibration: without the statistics (dropped in a transaction rolled back after), the
    # same query is guessed from the pattern's length: a handful of rows.
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("DROP STATISTICS kj_run_subject_lower")
        guessed = estimate(searched)
        transaction.set_rollback(True)
    assert guessed < matching / 10


def test_select_all_on_a_search_acts_on_every_match_the_list_may_act_on(operator, monkeypatch):
    """A page's search reads only what the page counts (here 301 rows); an action's "select
    all" reads as many as it may act on (350), so it cancels all 320 matches, not 301."""
    monkeypatch.setattr(pagination, "MAX_PAGES", 7)
    bulk_runs(320, job="scale.alpha", status=RunStatus.QUEUED)
    bulk_runs(5, job="scale.beta", status=RunStatus.QUEUED)
    first = JobRun.objects.filter(job_name="scale.alpha").first()
    assert first is not None
    data = {
        "action": "cancel_selected",
        "index": 0,
        "select_across": "1",
        "_selected_action": [str(first.run_id)],
    }
    operator.post(f"{RUNS}?q=alpha", data, follow=True)
    assert JobRun.objects.filter(status=RunStatus.CANCELLED).count() == 320
    assert not JobRun.objects.filter(job_name="scale.beta", status=RunStatus.CANCELLED).exists()


def test_tenant_search_still_looks_at_subjects_only(clerk):
    [mine] = bulk_runs(1, job="scale.alpha")
    bulk_runs(1, schema="t2")
    assert set(on_page(clerk.get(RUNS, {"q": "invoice_id=0"}))) == {mine.run_id}
    assert on_page(clerk.get(RUNS, {"q": "alpha"})) == []
    assert on_page(clerk.get(RUNS, {"q": mine.correlation_id})) == []


def test_a_short_value_asks_the_index_for_its_field_name():
    """``nosuch=1``: the value is too short for a trigram, the field name is not. The index is
    asked for the field name, so a field no run has costs nothing; at 10 million runs the same
    search, filtered in the list's order, read the whole table to find no match (3 s for an
    operator, a 0.7 s Seq Scan for a busy tenant; 0.6 ms with the field name)."""
    from kumiko_jobs.admin.search import operator_search, tenant_search

    bulk_runs(3)
    # The search's condition (without an ordering: the keys' query itself would find none).
    searched = operator_search(JobRun.objects.all(), "nosuch=1")
    plan = bitmap_only_plan(*searched.query.sql_with_params())
    assert "kj_run_subject_trgm" in plan and "'%NOSUCH%'" in plan
    assert DISABLED not in plan
    # A tenant's search asks the same (here the planner may prefer the tenant's own index).
    _, params = tenant_search(
        JobRun.objects.filter(schema_name="t1"), "nosuch=1"
    ).query.sql_with_params()
    assert "%nosuch%" in params
    # Calibration: a field name too short for a trigram leaves only the filter, which no index
    # answers: the planner has to use a node it was told not to.
    short = operator_search(JobRun.objects.all(), "id=1")
    assert DISABLED in bitmap_only_plan(*short.query.sql_with_params())


# The cost PostgreSQL gives a node it was told not to use (enable_* = off) but had to.
DISABLED = "cost=10000000000"


def bitmap_only_plan(statement: str, params: Any) -> str:
    """The plan of ``statement`` when the planner may use only bitmap index scans (a tiny table is
    otherwise best read whole): a ``DISABLED`` cost in it means some condition has no index."""
    with connection.cursor() as cursor:
        cursor.execute("SET enable_seqscan = off")
        cursor.execute("SET enable_indexscan = off")
        try:
            cursor.execute("EXPLAIN " + statement, params)
            return "\n".join(row[0] for row in cursor.fetchall())
        finally:
            cursor.execute("RESET enable_seqscan")
            cursor.execute("RESET enable_indexscan")


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
