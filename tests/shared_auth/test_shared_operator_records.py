"""A tenant run never reads the sessions or the admin's log shared by every tenant (layout (b):
``django.contrib.sessions`` and ``admin`` in SHARED_APPS only), with either wall alone.

An attacker's pass (2026-12-07) read ``public.django_session`` from a tenant job through the
ORM, in both DB_ROLES modes, and signed in to the operators' admin with the key it found: every
tenant's runs. The tables are now the operators' records (guard/tables.py,
``operator_record_tables``): the classifier refuses them to a tenant run whatever its grants,
and the tenant roles hold no privilege on them (the second wall, seen here with the classifier
only logging). The calibration: the same body as a system job reads the operators' session key,
and a tenant run still reads the shared user table.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.test import Client, override_settings

from kumiko_jobs.models import JobRun, RunStatus
from tests.conftest import work

JOB_PREFIX = "records"
pytestmark = pytest.mark.usefixtures("live_db")

MODES = {
    "classifier, roles off": {"DB_GUARD": "enforce", "DB_ROLES": False},
    "classifier, roles on": {"DB_GUARD": "enforce", "DB_ROLES": True},
    "roles alone": {"DB_GUARD": "log", "DB_ROLES": True},
}
REFUSED = {
    "classifier, roles off": "the operators' records of every user",
    "classifier, roles on": "the operators' records of every user",
    "roles alone": "permission denied for table",
}


def read_sessions(ctx: Any) -> list[str]:
    from django.contrib.sessions.models import Session

    return list(Session.objects.values_list("session_key", flat=True))


def read_admin_log(ctx: Any) -> list[str]:
    from django.contrib.admin.models import LogEntry

    return list(LogEntry.objects.values_list("object_repr", flat=True))


def read_usernames(ctx: Any) -> list[str]:
    return sorted(get_user_model().objects.values_list("username", flat=True))


def operator_session() -> tuple[Any, str]:
    user, _ = get_user_model().objects.get_or_create(username="root-operator", is_staff=True)
    client = Client(HTTP_HOST="localhost")
    client.force_login(user)
    return user, client.cookies[settings.SESSION_COOKIE_NAME].value


def _run(definition: Any, **enqueue: Any) -> JobRun:
    handle = definition.enqueue(**enqueue)
    work()
    return JobRun.objects.get(pk=handle.run_id)


@pytest.mark.parametrize("mode", list(MODES))
def test_a_tenant_run_never_reads_the_shared_sessions_or_admin_log(
    mode: str, declare: Any, tenants: dict[str, Any]
) -> None:
    from django.contrib.admin.models import CHANGE, LogEntry

    user, key = operator_session()
    LogEntry.objects.create(user=user, action_flag=CHANGE, object_repr="t2's invoice 7")
    with override_settings(KUMIKO_JOBS={**settings.KUMIKO_JOBS, **MODES[mode]}):
        for body in (read_sessions, read_admin_log):
            run = _run(declare(body), tenant="t1")
            assert run.status == RunStatus.FAILED, (body.__name__, run.result)
            assert REFUSED[mode] in run.error_message, run.error_message
            assert run.result is None
            assert key not in repr(JobRun.objects.values_list("result", "error_message"))

        users = _run(declare(read_usernames), tenant="t1")
        assert users.status == RunStatus.SUCCEEDED, users.error_message
        assert "root-operator" in users.result  # the shared user table stays readable

        # Calibration: the same reads, as a system job, see the operators' key and the log.
        system = _run(declare(read_sessions, system=True))
        assert system.status == RunStatus.SUCCEEDED and key in system.result
        log = _run(declare(read_admin_log, system=True))
        assert log.status == RunStatus.SUCCEEDED and "t2's invoice 7" in log.result
