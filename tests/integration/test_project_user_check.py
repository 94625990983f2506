"""Check ``kumiko_jobs.W007``: with ``DB_ROLES`` on, the project's database user must not be a
superuser (docs/guard.md, "Two walls", set-up).

The suite connects as a superuser unless ``KUMIKO_TEST_PROJECT_USER=1`` (a ``LOGIN CREATEDB
CREATEROLE`` user): the first test holds in both modes, against what the server says of the
user; the others take the other side with ``SET LOCAL ROLE`` inside the test's transaction.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.conf import settings
from django.db import connection
from django.test import override_settings

from kumiko_jobs.checks import check_project_user_not_superuser

pytestmark = pytest.mark.django_db
ROLES_ON = {**settings.KUMIKO_JOBS, "DB_ROLES": True}  # whatever KUMIKO_TEST_DB_ROLES says


def w007(**kwargs: Any) -> list[Any]:
    with override_settings(KUMIKO_JOBS=ROLES_ON):
        found = check_project_user_not_superuser(**kwargs)
    return [m for m in found if m.id == "kumiko_jobs.W007"]


def current_user() -> tuple[str, bool]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT rolname, rolsuper FROM pg_roles WHERE rolname = current_user")
        name, superuser = cursor.fetchone()
    return name, superuser


def set_local_role(role: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute(f'SET LOCAL ROLE "{role}"')


def test_the_warning_follows_what_the_server_says_of_the_project_user() -> None:
    name, superuser = current_user()
    found = w007(databases=["default"])
    if superuser:  # the suite's default: the configured superuser
        assert len(found) == 1
        assert repr(name) in found[0].msg and "superuser" in found[0].msg
        assert "Two walls" in found[0].hint
    else:  # KUMIKO_TEST_PROJECT_USER=1
        assert found == []


def test_a_project_user_that_is_not_a_superuser_draws_no_warning() -> None:
    if current_user()[1]:
        # A superuser may become any role: one made for the test, in its transaction.
        with connection.cursor() as cursor:
            cursor.execute('CREATE ROLE "kj_test_w007_not_a_superuser" NOLOGIN NOSUPERUSER')
        set_local_role("kj_test_w007_not_a_superuser")
    assert not current_user()[1]
    assert w007(databases=["default"]) == []


def test_a_superuser_draws_the_warning_only_with_db_roles_on_and_only_when_asked() -> None:
    if not current_user()[1]:
        pytest.skip("the project user is not a superuser here (KUMIKO_TEST_PROJECT_USER=1)")
    assert len(w007(databases=["default"])) == 1
    # A plain `manage.py check` does not connect: database checks run with --database only.
    assert w007() == [] and w007(databases=None) == []
    with override_settings(KUMIKO_JOBS={**settings.KUMIKO_JOBS, "DB_ROLES": False}):
        found = check_project_user_not_superuser(databases=["default"])
    assert [m for m in found if m.id == "kumiko_jobs.W007"] == []
