"""The admin's search is bounded wherever it runs (issue 22, "around the runs").

Tenant staff with ``view_jobrun`` kept the shared database busy for minutes through
``/admin/autocomplete/``: Django's autocomplete calls the run admin's ``get_search_results``
without the changelist's query-string checks and without its per-branch limit (2,000 one-letter
words: 90 s against 150,000 runs); the operators' search had the same shape (300 words: 25-42 s).

Real PostgreSQL and the real middleware stack (``localhost``: operators, ``t1.localhost``:
tenant t1), through Django's test client against the real admin. Nothing here is timed: the
tests assert on the refusal (400 and no search statement sent), on the bounded query (its
``LIMIT``) and on the statement timeout PostgreSQL applies (a list blocked by a lock another
connection holds is cancelled and answered with a sentence).

Each was seen failing with the fix reverted (``git stash`` of kumiko_jobs/admin): the
autocomplete answered 200 after running the unbounded search (and a NUL in ``term`` was a 500),
the search carried no ``LIMIT``, 11 words were searched, and the locked list waited for the
lock and answered 200.
"""

from __future__ import annotations

import re
import threading
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, connections
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from kumiko_jobs.admin import pagination, query_strings
from kumiko_jobs.models import JobRun
from tests.integration.test_admin import FAILURES, RUNS, client_for, make_user

pytestmark = pytest.mark.usefixtures("live_db")

AUTOCOMPLETE = "/admin/autocomplete/"
# JobAttempt.run is a foreign key to JobRun: Django's autocomplete then searches with the run
# admin (its search fields are set for both audiences), for anyone with view_jobrun.
RUN_FIELD = {"app_label": "kumiko_jobs", "model_name": "jobattempt", "field_name": "run"}
MANY_WORDS = " ".join(["a"] * 2000)
# The caps (admin/query_strings.py), written out so that this module still imports, and its
# tests fail rather than error, with the fix reverted.
MAX_SEARCH_WORDS = getattr(query_strings, "MAX_SEARCH_WORDS", 10)
MAX_SEARCH_WORD_CHARS = getattr(query_strings, "MAX_SEARCH_WORD_CHARS", 100)


@pytest.fixture
def operator() -> Any:
    return client_for("localhost", "public", make_user("public", "operator", superuser=True))


@pytest.fixture
def clerk() -> Any:
    user = make_user("t1", "clerk", perms=("view_jobrun", "view_jobfailure"))
    return client_for("t1.localhost", "t1", user)


@pytest.fixture(params=["operator", "clerk"])
def staff(request: pytest.FixtureRequest, operator: Any, clerk: Any) -> Any:
    """Both audiences: every bound holds for the operators and for a tenant's staff."""
    return operator if request.param == "operator" else clerk


@pytest.fixture
def runs(tenants: dict[str, Any]) -> list[JobRun]:
    now = timezone.now()
    return JobRun.objects.bulk_create(
        JobRun(
            run_id=uuid.uuid4(),
            job_name="scale.job_a",
            schema_name=schema,
            subject=f"invoice_id={i}",
            status="succeeded",
            queue="default",
            queued_at=now - timedelta(minutes=i),
            correlation_id=uuid.uuid4().hex,
        )
        for schema in ("t1", "t2")
        for i in range(30)
    )


def run_statements(captured: CaptureQueriesContext) -> list[str]:
    """The statements that read the run table (the session and user lookups left out)."""
    return [q["sql"] for q in captured.captured_queries if "kumiko_jobs_jobrun" in q["sql"]]


def autocomplete(client: Any, term: str) -> tuple[Any, list[str]]:
    client.raise_request_exception = True
    with CaptureQueriesContext(connection) as captured:
        response = client.get(AUTOCOMPLETE, {**RUN_FIELD, "term": term})
    return response, run_statements(captured)


def test_calibration_the_autocomplete_searches_runs_for_both_audiences(staff, runs):
    """The route the attack takes is open to anyone who may view runs: it answers with runs."""
    response, _ = autocomplete(staff, "invoice_id=1")
    assert response.status_code == 200
    assert response.json()["results"]


def test_the_autocomplete_refuses_thousands_of_words_before_any_search(staff, runs):
    """2,000 one-letter words: refused with 400 and not one statement on the run table (it ran a
    condition per word on every run, unbounded, for 90 s at 150,000 runs)."""
    response, statements = autocomplete(staff, MANY_WORDS)
    assert response.status_code == 400
    assert statements == []


@pytest.mark.parametrize(
    "term",
    ["\x00", "ab\x00cd", "x" * 2000, "y" * (MAX_SEARCH_WORD_CHARS + 1)],
    ids=["nul", "inner-nul", "over-long", "long-word"],
)
def test_the_autocomplete_applies_the_changelists_query_string_checks(staff, runs, term):
    """A NUL in ``term`` was a 500 from the driver; an over-long term or word ran as LIKE
    patterns over every row. Refused, as on the changelist, before any statement."""
    response, statements = autocomplete(staff, term)
    assert response.status_code == 400
    assert statements == []


def test_the_autocomplete_search_reads_a_pages_worth_of_runs(staff, runs):
    """The search the autocomplete runs is narrowed like a list's: each branch reads at most the
    rows the first pages count (``rows_read``), never every match in the history."""
    response, statements = autocomplete(staff, "invoice_id")
    assert response.status_code == 200
    limit = pagination.rows_read(1, 50, acting=False)
    searches = [s for s in statements if "LIKE" in s.upper()]
    assert searches, statements
    assert all(re.search(rf"\bLIMIT {limit}\b", s) for s in searches), searches
    # The list's own reads then ask for the keys found, not the search again.
    assert all("LIKE" not in s.upper() for s in statements if s not in searches)


@pytest.mark.parametrize("path", [RUNS, FAILURES])
def test_lists_cap_the_words_of_a_search(staff, runs, path):
    """More than MAX_SEARCH_WORDS words, or a word over MAX_SEARCH_WORD_CHARS: 400 with the
    limit named, for both audiences and every list with a search; at the cap, served."""
    staff.raise_request_exception = True
    words = " ".join(f"w{i}" for i in range(MAX_SEARCH_WORDS))
    assert staff.get(path, {"q": words}).status_code == 200
    with CaptureQueriesContext(connection) as captured:
        too_many = staff.get(path, {"q": f"{words} one-more"})
    assert too_many.status_code == 400
    assert f"at most {MAX_SEARCH_WORDS} words" in too_many.content.decode()
    assert run_statements(captured) == []
    long_word = staff.get(path, {"q": "z" * (MAX_SEARCH_WORD_CHARS + 1)})
    assert long_word.status_code == 400
    assert f"longer than {MAX_SEARCH_WORD_CHARS} characters" in long_word.content.decode()


def test_the_operators_search_with_hundreds_of_words_is_refused(operator, runs):
    """The operators' search had the same shape (300 words: 25-42 s): a branch per index for
    the first word, each word a condition on every branch."""
    operator.raise_request_exception = True
    with CaptureQueriesContext(connection) as captured:
        response = operator.get(RUNS, {"q": " ".join(["ab"] * 300)})
    assert response.status_code == 400
    assert run_statements(captured) == []


def test_a_search_in_an_actions_post_is_bounded_too(operator, runs):
    """An action's POST runs the search with the same checks (it would act on what it finds)."""
    operator.raise_request_exception = True
    response = operator.post(
        f"{RUNS}?q={'+'.join(['a'] * 50)}",
        {"action": "cancel_selected", "select_across": "1", "_selected_action": []},
    )
    assert response.status_code == 400


def test_the_list_runs_under_the_statement_timeout(staff, runs, settings):
    """Every statement of the list is sent inside one transaction that set the timeout first
    (SET LOCAL: it ends with the transaction, nothing is left on the kept connection)."""
    settings.KUMIKO_JOBS = {**settings.KUMIKO_JOBS, "ADMIN_STATEMENT_TIMEOUT_MS": 4321}
    staff.raise_request_exception = True
    with CaptureQueriesContext(connection) as captured:
        assert staff.get(RUNS, {"q": "invoice_id"}).status_code == 200
    sql = [q["sql"] for q in captured.captured_queries]
    first = next(i for i, s in enumerate(sql) if "set_config('statement_timeout'" in s)
    assert "4321ms" in sql[first]
    reads = [i for i, s in enumerate(sql) if "kumiko_jobs_jobrun" in s]
    assert reads and all(i > first for i in reads)
    with connection.cursor() as cursor:
        cursor.execute("SHOW statement_timeout")
        assert cursor.fetchone()[0] == "0"  # nothing outlived the request


@pytest.fixture
def locked_runs() -> Iterator[None]:
    """The run table locked by another connection, as a long statement would hold it; released
    after a while so that a list without a timeout ends (and its test fails) instead of hanging."""
    holder = connections.create_connection("default")
    holder.connect()
    raw = holder.connection  # psycopg's own: the release below comes from the timer's thread
    raw.execute("BEGIN")
    raw.execute("LOCK TABLE kumiko_jobs_jobrun IN ACCESS EXCLUSIVE MODE")
    release = threading.Timer(15, raw.rollback)
    release.start()
    try:
        yield
    finally:
        release.cancel()
        raw.rollback()
        holder.close()


def test_a_list_that_hits_the_statement_timeout_says_so(staff, runs, settings, locked_runs):
    """PostgreSQL cancels the list's statement after ADMIN_STATEMENT_TIMEOUT_MS; the list answers
    503 with a sentence naming the way out, not a 500 (and does not wait for the lock)."""
    settings.KUMIKO_JOBS = {**settings.KUMIKO_JOBS, "ADMIN_STATEMENT_TIMEOUT_MS": 200}
    staff.raise_request_exception = True
    response = staff.get(RUNS, {"q": "invoice_id"})
    assert response.status_code == 503
    assert "Narrow it with a filter or fewer search words" in response.content.decode()


def test_an_autocomplete_that_hits_the_statement_timeout_is_refused(
    staff, runs, settings, locked_runs
):
    settings.KUMIKO_JOBS = {**settings.KUMIKO_JOBS, "ADMIN_STATEMENT_TIMEOUT_MS": 200}
    response, _ = autocomplete(staff, "invoice_id")
    assert response.status_code == 400
