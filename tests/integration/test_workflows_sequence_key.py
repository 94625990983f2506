"""Per-key sequencing: ``workflow(..., sequential_key=...)`` runs one workflow of a name per
tenant *and key* at a time; other keys, and the same key in another tenant, have their own
turns; the key is checked at build time."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection

import kumiko_jobs
from kumiko_jobs import InvalidJob
from kumiko_jobs.models import JobRun, RunStatus
from tests.conftest import probes, work
from tests.testapp import workflow_jobs as wf

pytestmark = pytest.mark.usefixtures("live_db", "clean_workflows")


@pytest.fixture
def clean_workflows(live_db: None) -> None:
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE kumiko_jobs_workflowstep, kumiko_jobs_workflow")


def _sync(schema: str, account: str, n: int) -> Any:
    flow = kumiko_jobs.chain(
        wf.record.step(tag=f"{account}-{n}-a", key="a"),
        wf.record.step(tag=f"{account}-{n}-b", key="b"),
    )
    return kumiko_jobs.workflow(flow, name="sync", sequential_key=account).enqueue(tenant=schema)


def test_one_workflow_per_tenant_and_key_at_a_time(tenants: Any) -> None:
    first, second = _sync("t1", "acct-1", 1), _sync("t1", "acct-1", 2)
    other_key = _sync("t1", "acct-2", 1)
    other_tenant = _sync("t2", "acct-1", 1)
    assert [h.status for h in (first, second, other_key, other_tenant)] == [
        RunStatus.RUNNING,
        RunStatus.QUEUED,  # waits for acct-1's first in t1
        RunStatus.RUNNING,  # another key: its own turn
        RunStatus.RUNNING,  # the same key in another tenant: its own turn
    ]
    assert not JobRun.objects.filter(workflow_id=second.workflow_id).exists()
    work()
    t1 = [p.tag for p in probes("t1")]
    acct1 = [t for t in t1 if t.startswith("acct-1")]
    assert acct1 == ["acct-1-1-a", "acct-1-1-b", "acct-1-2-a", "acct-1-2-b"]  # in turn
    assert sorted(t for t in t1 if t.startswith("acct-2")) == ["acct-2-1-a", "acct-2-1-b"]
    assert {h.status for h in (first, second, other_key, other_tenant)} == {RunStatus.SUCCEEDED}


def test_a_keyed_turn_is_apart_from_the_names_own_turn(tenants: Any) -> None:
    """``sequential=True`` without a key is the name's turn in the tenant; keyed turns do not
    wait for it, nor it for them."""
    keyed = _sync("t1", "acct-1", 1)
    plain = kumiko_jobs.workflow(wf.record.step(tag="plain"), name="sync", sequential=True).enqueue(
        tenant="t1"
    )
    assert (keyed.status, plain.status) == (RunStatus.RUNNING, RunStatus.RUNNING)


@pytest.mark.parametrize(
    ("key", "says"),
    [
        ("", "1 to 200 characters"),
        ("x" * 201, "1 to 200 characters"),
        (7, "1 to 200"),
        ("a\x00b", "contains a NUL character"),
    ],
)
def test_a_bad_key_is_refused_when_the_workflow_is_built(key: Any, says: str) -> None:
    with pytest.raises(InvalidJob, match=says):
        kumiko_jobs.workflow(wf.record.step(tag="x"), name="sync", sequential_key=key)
