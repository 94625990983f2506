"""Every text input refuses what PostgreSQL cannot store, with the same words as NUL (issue 22).

A lone surrogate in a job's argument or the "Run a job" form gave a 500 or a traceback (the
driver raised while writing the run), and so did a 5,000-digit integer in the form (Python's
4,300-digit limit, raised by ``json.loads`` as a ValueError). NUL was refused cleanly; now one
function (``core.text.text_problem``) serves every input: enqueue's arguments, names and
``tenant=``, the admin's forms and query strings, the command line (test_cli_input.py) and the
search and autocomplete (test_bounded_admin.py).

Real PostgreSQL and Redis; the form through the real admin. Seen failing with core/text.py's
surrogate check and the form's checks reverted: InvalidJob was not raised (the write raised
UnicodeEncodeError), and the form answered 500.
"""

from __future__ import annotations

from typing import Any

import pytest

from kumiko_jobs import InvalidJob, transport
from kumiko_jobs.models import JobRun
from tests.integration.test_admin import RUN_JOB, client_for, make_user, text
from tests.testapp import jobs

pytestmark = pytest.mark.usefixtures("live_db")


def assert_nothing_enqueued() -> None:
    assert not JobRun.objects.exists()
    assert transport.queue_length("default") == 0


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"tag": "a\ud800b"}, ("argument 'tag'", "lone surrogate (U+D800)")),
        ({"tag": "\udcff"}, ("argument 'tag'", "lone surrogate (U+DCFF)")),
        ({"tag": "x", "payload": {"deep": ["\udfff"]}}, ("['deep'][0]", "lone surrogate")),
        ({"tag": "x", "payload": {"\ud800": 1}}, ("a key of argument 'payload'", "surrogate")),
        ({"tag": "a\x00b"}, ("argument 'tag'", "NUL character")),
        ({"tag": "x", "payload": {"n": 10**5000}}, ("more than 4300 digits", "as a string")),
        ({"tag": "x", "payload": {"n": -(10**4300)}}, ("more than 4300 digits",)),
    ],
    ids=["high", "low", "nested", "key", "nul", "5000-digits", "4301-digits"],
)
def test_enqueue_refuses_arguments_postgresql_cannot_store(tenants, kwargs, words):
    with pytest.raises(InvalidJob) as refused:
        jobs.probe.enqueue(tenant="t1", **kwargs)
    for word in words:
        assert word in str(refused.value)
    assert_nothing_enqueued()


def test_the_largest_integer_json_readers_take_is_still_accepted(tenants):
    """Calibration: 4,300 digits are fine (the bound is the reader's, not an arbitrary one)."""
    jobs.probe.enqueue(tenant="t1", tag="x", payload={"n": 10**4299})
    assert JobRun.objects.get().payload["payload"] == {"n": 10**4299}


def test_enqueue_refuses_an_argument_name_postgresql_cannot_store(tenants):
    """A job taking ``**payload`` accepts any name: the name is a jsonb key too."""
    with pytest.raises(InvalidJob, match=r"name of argument .* lone surrogate"):
        jobs.on_any_invoice_event.enqueue(tenant="t1", **{"a\ud800": 1})
    assert_nothing_enqueued()


@pytest.mark.parametrize("tenant", ["t\ud8001", "t1\x00"], ids=["surrogate", "nul"])
def test_enqueue_refuses_a_tenant_name_postgresql_cannot_store(tenants, tenant):
    with pytest.raises(InvalidJob, match="tenant="):
        jobs.probe.enqueue(tenant=tenant, tag="x")
    assert_nothing_enqueued()


@pytest.fixture
def operator(tenants: dict[str, Any]) -> Any:
    client = client_for("localhost", "public", make_user("public", "operator", superuser=True))
    client.raise_request_exception = True  # a 500 fails the test with its traceback
    return client


@pytest.mark.parametrize(
    ("arguments", "words"),
    [
        ('{"invoice_id": "\\ud800"}', ("lone surrogate (U+D800)",)),
        ('{"invoice_id": 7, "fail_times": "\\udc00"}', ("lone surrogate",)),
        ('{"invoice_id": "\\u0000"}', ("NUL character",)),
        ('{"invoice_id": ' + "7" * 5000 + "}", ("more than 4300 digits", "as a string")),
        ('{"invoice_id": ' + "7" * 4301 + "}", ("more than 4300 digits",)),
    ],
    ids=["surrogate", "surrogate-second-field", "nul-escape", "5000-digits", "4301-digits"],
)
def test_run_a_job_form_refuses_what_postgresql_cannot_store(operator, arguments, words):
    response = operator.post(
        RUN_JOB, {"job": "billing.sync_invoice", "tenant": "t1", "arguments": arguments}
    )
    assert response.status_code == 200
    page = text(response)
    assert "nothing was queued" in page
    for word in words:
        assert word in page
    assert_nothing_enqueued()


def test_a_nul_in_the_run_a_job_form_is_refused_by_the_form(operator):
    """Calibration: the raw field with a NUL was already refused (Django's own validator)."""
    response = operator.post(
        RUN_JOB, {"job": "billing.sync_invoice", "tenant": "t1", "arguments": '{"a": "\x00"}'}
    )
    assert response.status_code == 200
    assert_nothing_enqueued()
