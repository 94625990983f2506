"""An atomic run's BEGIN and COMMIT ride on the statements beside them (run_sql.atomic_begin,
run_sql.atomic_success): read from libpq's own trace of the tenant login, every message it sent.

Before: ``BEGIN``, ``SELECT pg_current_xact_id()``, the body, the success, ``COMMIT``, the reset:
one round trip each. Now the ``BEGIN`` goes in the query that reads the transaction's id and the
``COMMIT`` in the success's, and the effect and the success still commit together.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from psycopg.pq import Trace

from kumiko_jobs.guard.roles import connections as tenant_connections
from kumiko_jobs.guard.roles import names as role_names
from kumiko_jobs.models import RunStatus
from tests.guardapp import role_jobs, support

pytestmark = pytest.mark.usefixtures("cold_pool", "live_db")

ROLES = {**settings.KUMIKO_JOBS, "DB_GUARD": "enforce", "DB_ROLES": True}


def _pooled(tenant: Any) -> Any:
    role = role_names.role_name(tenant.pk, "default")
    return tenant_connections._wrappers()[("default", role)]


def _sent_queries(tenant: Any, job: Any, trace: Path) -> list[str]:
    """Run ``job`` on the tenant's warm login, traced: the text of every query message it sent
    (simple ``Query`` and extended ``Parse``), in order."""
    run = support.run_for(tenant, job, ROLES)  # warm: the login is pooled and connected
    assert run.status == RunStatus.SUCCEEDED, run.error_message
    raw = _pooled(tenant).connection
    with open(trace, "w") as sink:
        raw.pgconn.trace(sink.fileno())
        raw.pgconn.set_trace_flags(Trace.SUPPRESS_TIMESTAMPS)
        try:
            run = support.run_for(tenant, job, ROLES)
        finally:
            raw.pgconn.untrace()
    assert run.status == RunStatus.SUCCEEDED, run.error_message
    sent = []
    for line in trace.read_text().splitlines():
        fields = line.split("\t")
        # "F", length, message type, its contents (the query's text)
        if len(fields) >= 4 and fields[0] == "F" and fields[2] in ("Query", "Parse"):
            sent.append(fields[3])
    return sent


@pytest.mark.one_slot
def test_an_atomic_runs_begin_and_commit_cost_no_round_trip_of_their_own(
    tenants, guard_data, tmp_path
):
    sent = _sent_queries(tenants["t1"], role_jobs.role_whoami_atomic, tmp_path / "trace")
    begins = [q for q in sent if "BEGIN" in q]
    commits = [q for q in sent if "COMMIT" in q]
    assert len(begins) == 1 and "pg_current_xact_id()" in begins[0], sent
    assert len(commits) == 1 and "kumiko_jobs_atomic_success" in commits[0], sent
    # Both in one transaction: the effect (the body's notes) and the success committed.
    assert support.findings("t1")["identity"]


@pytest.mark.one_slot
def test_calibration_a_plain_runs_login_sends_no_begin_or_commit(tenants, guard_data, tmp_path):
    """The trace sees the login's queries: a plain run's body and reset, no transaction."""
    sent = _sent_queries(tenants["t1"], role_jobs.role_whoami, tmp_path / "trace")
    assert any("CLOSE ALL" in q for q in sent), sent
    assert not [q for q in sent if "BEGIN" in q or "COMMIT" in q], sent
