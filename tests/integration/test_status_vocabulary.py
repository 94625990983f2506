"""One status vocabulary: the admin's badges and filters use RunStatus' own words (issue 13)."""

from __future__ import annotations

import re

import pytest
from django.utils import translation

from kumiko_jobs.models import RunStatus
from tests.conftest import work
from tests.integration.test_admin import RUNS, client_for, make_user
from tests.testapp import jobs


def test_labels_are_the_values_words() -> None:
    with translation.override("en"):
        assert {value: str(label) for value, label in RunStatus.choices} == {
            value: value for value in RunStatus.values
        }


def test_german_labels_translate_the_same_words() -> None:
    with translation.override("de"):
        labels = {value: str(label) for value, label in RunStatus.choices}
    assert labels["succeeded"] == "erfolgreich" and labels["deferred"] == "zurückgestellt"
    assert labels["queued"] == "eingereiht"


@pytest.mark.usefixtures("live_db")
def test_operator_list_and_filter_say_succeeded_and_queued_until(tenants) -> None:
    jobs.probe.enqueue(tenant="t1", tag="vocab-ok")
    jobs.probe.enqueue_in(3600, tenant="t1", tag="vocab-later")
    work()
    operator = client_for("localhost", "public", make_user("public", "operator", superuser=True))
    page = operator.get(RUNS).content.decode()
    badges = set(re.findall(r'class="kj-status kj-status-(\w+)"[^>]*>([^<]+)<', page))
    assert badges == {("succeeded", "succeeded"), ("queued", "queued")}
    assert 'class="kj-until"' in page  # the queued run is not due for an hour
    # The status filter offers the same words, and never the old "done" / "waiting".
    filter_links = set(re.findall(r'href="\?status__exact=(\w+)"[^>]*>([^<]+)<', page))
    assert ("succeeded", "succeeded") in filter_links and ("deferred", "deferred") in filter_links
    assert not re.search(r">\s*(done|waiting)\s*<", page)
