"""A rollback Django never saw does not move a run's queries out of its tenant, in both DB_ROLES
modes; and the id sequences of the shared and protected tables are judged as their tables.

django-tenants sends ``SET search_path`` once per switch (``TENANT_LIMIT_SET_CALLS``), and a
``SET`` inside a transaction is undone with it: a raw ``ROLLBACK`` (or ``ROLLBACK TO SAVEPOINT``,
or ``COMMIT`` of a failed transaction) put the server back on the last path committed, public
(the operators' sessions) or another tenant's, while the guard went on judging names as the
tenant's (guard/search_path_resync.py). Found by an attacker's pass; every test here was red
before the fix (roles off: the operators' session read, a forged one written to public, t2's
secret overwritten with only ``cross_tenant_reads``, public's sequences rewound with no grant).
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest
from django.conf import settings
from django.db import connection, transaction

from kumiko_jobs import EscapeHatch
from kumiko_jobs.definition.registry import registry
from kumiko_jobs.enqueueing.api import define
from kumiko_jobs.models import JobRun, RunStatus
from kumiko_jobs.run.context import JobContext
from tests.guardapp import support
from tests.guardapp.attacks_base import CANARY
from tests.guardapp.models import Finding, Secret

pytestmark = pytest.mark.usefixtures("live_db", "guard_data")

ROLES_OFF = {**settings.KUMIKO_JOBS, "DB_GUARD": "enforce", "DB_ROLES": False}
ROLES_ON = {**settings.KUMIKO_JOBS, "DB_GUARD": "enforce", "DB_ROLES": True}
MODES = {"roles_off": ROLES_OFF, "roles_on": ROLES_ON}
READS = EscapeHatch(reason="compares with another tenant", grants=["cross_tenant_reads"])


def _rollback_inside_atomic() -> None:
    """django-tenants' SET runs inside the transaction (the block's first cursor), then a raw
    ROLLBACK, allowed without a grant, undoes it on the server."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("ROLLBACK")


def rollback_then_sessions(ctx: JobContext) -> None:
    from django.contrib.sessions.models import Session

    _rollback_inside_atomic()
    keys = sorted(Session.objects.values_list("session_key", flat=True))
    Session.objects.create(
        session_key="forged0by0t1",
        session_data="x",
        expire_date=dt.datetime(2100, 1, 1, tzinfo=dt.UTC),
    )
    Finding.objects.create(key="sessions", value=json.dumps(keys))


def reads_then_rollback(ctx: JobContext, *, other: str) -> None:
    from example_project.customers.models import Client

    with ctx.cross_tenant_reads(Client.objects.get(schema_name=other)):
        list(Secret.objects.values_list("value", flat=True))
    _rollback_inside_atomic()
    Secret.objects.update(value="overwritten after a rollback")


def reads_then_savepoint_rollback(ctx: JobContext, *, other: str) -> None:
    """The same with a savepoint (which even an atomic job may roll back to), inside the job's
    own ``atomic()`` block."""
    from example_project.customers.models import Client

    with transaction.atomic():
        with ctx.cross_tenant_reads(Client.objects.get(schema_name=other)):
            list(Secret.objects.values_list("value", flat=True))
            with connection.cursor() as cursor:
                cursor.execute("SAVEPOINT kj_attack")  # after SET search_path = t2
        with connection.cursor() as cursor:  # SET search_path = t1, after the savepoint
            cursor.execute("ROLLBACK TO SAVEPOINT kj_attack")
            # The same cursor, kept: judged as t1's table, and it must be t1's.
            cursor.execute("UPDATE guardapp_secret SET value = 'overwritten on the kept cursor'")


def rewinds_shared_sequences(ctx: JobContext) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT setval('customers_client_id_seq', 1, false)")


JOBS = {
    "sessions": define(rollback_then_sessions, {"name": "rollback_path.sessions"}),
    "reads": define(reads_then_rollback, {"name": "rollback_path.reads", "escape_hatch": READS}),
    "savepoint": define(
        reads_then_savepoint_rollback,
        {"name": "rollback_path.savepoint", "escape_hatch": READS},
    ),
    "sequences": define(rewinds_shared_sequences, {"name": "rollback_path.sequences"}),
}


@pytest.fixture(autouse=True)
def _registered() -> Any:
    with registry.override(*JOBS.values()):
        yield


def _secret(observer: support.Observer, schema: str) -> list[Any]:
    return [row[0] for row in observer.rows(f'SELECT value FROM "{schema}".guardapp_secret')]


@pytest.mark.parametrize("mode", sorted(MODES))
def test_a_raw_rollback_does_not_reach_the_operators_sessions(
    tenants: Any, observer: support.Observer, mode: str
) -> None:
    support.plant_operators_copies(observer)
    try:
        run = support.run_for(tenants["t1"], JOBS["sessions"], MODES[mode])
        assert run.status == RunStatus.SUCCEEDED, (run.error_type, run.error_message)
        seen = json.loads(
            observer.value("SELECT value FROM t1.guardapp_finding WHERE key = 'sessions'")
        )
        assert not any(CANARY in key for key in seen)  # t1's own sessions, never public's
        forged = "SELECT count(*) FROM {}.django_session WHERE session_key = 'forged0by0t1'"
        assert observer.value(forged.format("public")) == 0
        assert observer.value(forged.format("t1")) == 1
    finally:
        for schema in ("public", "t1"):
            observer.rows(f"DELETE FROM {schema}.django_session WHERE session_key = 'forged0by0t1'")
        support.unplant_operators_copies(observer)


@pytest.mark.parametrize(
    ("mode", "kind"),
    # With DB_ROLES the block reads on the other tenant's reader login: its savepoint is not
    # on the run's connection, so the savepoint variant exists with roles off only.
    [("roles_off", "reads"), ("roles_on", "reads"), ("roles_off", "savepoint")],
)
def test_a_rollback_after_reading_another_tenant_writes_only_ones_own(
    tenants: Any, observer: support.Observer, mode: str, kind: str
) -> None:
    before = _secret(observer, "t2")
    run = support.run_for(tenants["t1"], JOBS[kind], MODES[mode], other="t2")
    assert run.status == RunStatus.SUCCEEDED, (run.error_type, run.error_message)
    assert _secret(observer, "t2") == before  # t2's row untouched
    assert all(value.startswith("overwritten") for value in _secret(observer, "t1"))


@pytest.mark.parametrize("mode", sorted(MODES))
def test_a_shared_tables_sequence_is_refused(
    tenants: Any, observer: support.Observer, mode: str
) -> None:
    before = observer.rows("SELECT last_value, is_called FROM public.customers_client_id_seq")
    run = support.run_for(tenants["t1"], JOBS["sequences"], MODES[mode])
    assert run.status == RunStatus.FAILED and run.error_type == "DatabaseAccessDenied", (
        run.status,
        run.error_message,
    )
    after = observer.rows("SELECT last_value, is_called FROM public.customers_client_id_seq")
    assert after == before
    connection.set_schema_to_public()
    assert JobRun.objects.filter(pk=run.pk).exists()
