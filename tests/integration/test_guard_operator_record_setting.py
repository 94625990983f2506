"""``KUMIKO_JOBS["OPERATOR_RECORD_TABLES"]``: a shared table the project names (an API key
table of its own, say) is refused to tenant runs as the sessions shared by every tenant are
(guard/tables.py, ``operator_record_tables``), by the classifier in both DB_ROLES modes and by
PostgreSQL's privileges alone (the roles command revokes the group's SELECT).

Calibration: without the setting the same tenant job reads the same shared table (it is an
ordinary shared table, readable with no grant), so the refusals are the setting's. The table is
``GuardShared_Notice`` (tests/guardapp/shared, SHARED_APPS only), mixed case on purpose: the
setting names relations as PostgreSQL stores them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings

from kumiko_jobs.guard.roles import sync as role_sync
from kumiko_jobs.guard.tables import operator_record_tables
from kumiko_jobs.models import JobRun, RunStatus
from tests.conftest import work

JOB_PREFIX = "records"
TABLE = "GuardShared_Notice"
pytestmark = pytest.mark.usefixtures("live_db")

MODES = {
    "classifier, roles off": ({"DB_GUARD": "enforce", "DB_ROLES": False}, "operators' records"),
    "classifier, roles on": ({"DB_GUARD": "enforce", "DB_ROLES": True}, "operators' records"),
    "roles alone": ({"DB_GUARD": "log", "DB_ROLES": True}, "permission denied for table"),
}


def read_notices(ctx: Any) -> int:
    from tests.guardapp.shared.models import Notice

    return len(list(Notice.objects.values_list("pk", flat=True)))


@pytest.fixture
def named(tenants: Any) -> Iterator[dict[str, Any]]:
    """The setting naming the table, its caches read anew, the roles synced to it; all undone."""
    recorded = {**settings.KUMIKO_JOBS, "OPERATOR_RECORD_TABLES": [TABLE]}
    try:
        with override_settings(KUMIKO_JOBS=recorded):
            operator_record_tables.cache_clear()
            role_sync.sync_all()
            yield recorded
    finally:
        operator_record_tables.cache_clear()
        role_sync.sync_all()  # the group's SELECT on the table back
    assert TABLE not in operator_record_tables()


def _run(declare: Any, mode: dict[str, Any]) -> JobRun:
    with override_settings(KUMIKO_JOBS={**settings.KUMIKO_JOBS, **mode}):
        handle = declare(read_notices).enqueue(tenant="t1")
        work()
    return JobRun.objects.get(pk=handle.run_id)


@pytest.mark.parametrize("mode", list(MODES))
def test_a_table_the_project_names_is_refused_to_tenant_runs(
    mode: str, declare: Any, named: dict[str, Any]
) -> None:
    overrides, refused = MODES[mode]
    run = _run(declare, overrides)
    assert run.status == RunStatus.FAILED, run.result
    assert refused in run.error_message and TABLE in run.error_message, run.error_message


@pytest.mark.parametrize("mode", list(MODES))
def test_calibration_without_the_setting_the_table_is_read(
    mode: str, declare: Any, tenants: Any
) -> None:
    run = _run(declare, MODES[mode][0])
    assert run.status == RunStatus.SUCCEEDED, run.error_message
