"""Who sees what in the admin, asked of every kumiko page: shared by both settings layouts' suites
(auth per tenant: test_admin_audiences.py; auth shared: tests/shared_auth/), which differ only
in how their users are made and signed in.

Each check walks the same pages: the admin's index, the run list and every run's page and
history, the failure list and every failure's page, the rejected messages' and escape-hatch
uses' lists and pages, "Run a job…" (GET and a valid POST), both actions (a POST that would
retry a failed run and cancel a waiting one, of each tenant, from the list and from the run's
page), and the bulk retry and cancel (their confirmation pages, a confirmed POST each, the bulk
operations' list). "Sees nothing" means no kumiko page answers 200 and no row's data is in any
answer, and nothing changes: no run is added, none is cancelled, no message is pushed, no bulk
operation is started. A member holding ``operate_tenant_runs`` (``may_act``) changes exactly
its own tenant's failed run (retried once) and waiting run (cancelled), never the other's.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from django.test import Client
from django.utils import timezone

from kumiko_jobs import transport
from kumiko_jobs.models import (
    BulkOperation,
    EscapeHatchUse,
    JobFailure,
    JobRun,
    RejectedMessage,
    RunStatus,
)
from tests.conftest import work
from tests.testapp import jobs

ADMIN = "/admin/"
RUNS = "/admin/kumiko_jobs/jobrun/"
FAILURES = "/admin/kumiko_jobs/jobfailure/"
REJECTED = "/admin/kumiko_jobs/rejectedmessage/"
HATCHES = "/admin/kumiko_jobs/escapehatchuse/"
RUN_JOB = "/admin/kumiko_jobs/jobrun/run-job/"
BULK_RETRY, BULK_CANCEL = f"{RUNS}bulk/retry/", f"{RUNS}bulk/cancel/"
BULK_OPERATIONS = "/admin/kumiko_jobs/bulkoperation/"
SECRETS = {"t1": "s3cr3t-of-t1", "t2": "s3cr3t-of-t2"}
HATCH_REASONS = {"t1": "reason-of-t1", "t2": "reason-of-t2"}
REJECTED_REASON = "rejected-for-a-test"
# A manual job (billing.sync_invoice is declared manual=True) and valid arguments for it.
MANUAL = {"job": "billing.sync_invoice", "tenant": "t1", "arguments": '{"invoice_id": 7}'}


@dataclass
class History:
    """A succeeded, a failed (each failure tenant-visible) and a waiting run in t1 and t2, a
    rejected message and an escape-hatch use per tenant."""

    runs: dict[str, JobRun] = field(default_factory=dict)
    failures: dict[str, JobFailure] = field(default_factory=dict)
    hatches: dict[str, EscapeHatchUse] = field(default_factory=dict)
    rejected: RejectedMessage | None = None

    def of(self, schema: str) -> set[str]:
        return {hexed(r.pk) for r in self.runs.values() if r.schema_name == schema}

    def everything(self) -> set[str]:
        return {hexed(r.pk) for r in self.runs.values()}


def hexed(pk: Any) -> str:
    return uuid.UUID(str(pk)).hex


def make_history() -> History:
    handles = {
        "t1_ok": jobs.probe.enqueue(tenant="t1", tag="t1-ok", payload={"secret": SECRETS["t1"]}),
        "t2_ok": jobs.probe.enqueue(tenant="t2", tag="t2-ok", payload={"secret": SECRETS["t2"]}),
        "t1_bad": jobs.flaky.enqueue(tenant="t1", tag="t1-bad", fail_times=99),
        "t2_bad": jobs.flaky.enqueue(tenant="t2", tag="t2-bad", fail_times=99),
    }
    work()
    for schema in ("t1", "t2"):
        handles[f"{schema}_waiting"] = jobs.probe.enqueue(
            tenant=schema, tag=f"{schema}-waiting", payload={"secret": SECRETS[schema]}
        )
    history = History(runs={name: JobRun.objects.get(pk=h.run_id) for name, h in handles.items()})
    for schema in ("t1", "t2"):
        assert history.runs[f"{schema}_bad"].status == RunStatus.FAILED
        assert history.runs[f"{schema}_waiting"].status == RunStatus.QUEUED
    history.failures = {s: JobFailure.objects.get(schema_name=s) for s in ("t1", "t2")}
    now = timezone.now()
    for schema in ("t1", "t2"):
        history.hatches[schema], _ = EscapeHatchUse.objects.update_or_create(
            job_name="billing.rebuild_prices",
            grant="global_writes",
            schema_name=schema,
            actor="audience-test",
            defaults={"reason": HATCH_REASONS[schema], "first_seen": now, "last_seen": now},
        )
    history.rejected = RejectedMessage.objects.create(
        rq_job_id="kj-audience", queue="default", reason=REJECTED_REASON, excerpt="{}"
    )
    return history


def _pages(history: History) -> list[str]:
    """Every kumiko GET page of the history's rows."""
    pages = [RUNS, FAILURES, REJECTED, HATCHES, RUN_JOB, BULK_OPERATIONS]
    pages += [BULK_RETRY, BULK_CANCEL, f"{BULK_RETRY}?status__exact=failed"]
    for run in history.runs.values():
        pages += [f"{RUNS}{run.pk}/change/", f"{RUNS}{run.pk}/history/"]
    pages += [f"{FAILURES}{f.pk}/change/" for f in history.failures.values()]
    pages += [f"{HATCHES}{h.pk}/change/" for h in history.hatches.values()]
    assert history.rejected is not None
    pages.append(f"{REJECTED}{history.rejected.pk}/change/")
    return pages


def _data_of(history: History, schemas: tuple[str, ...]) -> list[str]:
    """Strings that only a reader of those tenants' rows could have seen."""
    found = []
    for schema in schemas:
        # Not the run ids: a refused page's login link carries its own URL back (?next=).
        found += [SECRETS[schema], HATCH_REASONS[schema], f"tag={schema}-"]
    return [*found, REJECTED_REASON, "boom on attempt", "Traceback"]


def snapshot() -> tuple[Any, ...]:
    rows = tuple(JobRun.objects.order_by("pk").values_list("pk", "status", "cancel_requested_at"))
    return rows, transport.queue_length("default"), BulkOperation.objects.count()


def act_url(run: JobRun, kind: str) -> str:
    """A run page's retry or cancel button (a POST)."""
    return f"{RUNS}{run.pk}/act/{kind}/"


def try_to_act(client: Client, history: History) -> None:
    """Every state-changing request the admin has: both actions, on the list and on a run's page,
    on both tenants' runs (whatever the domain), both tenants' runs in one action, and "Run a
    job…"."""
    for schema in ("t1", "t2"):
        bad, waiting = history.runs[f"{schema}_bad"], history.runs[f"{schema}_waiting"]
        for action, run in (("retry_selected", bad), ("cancel_selected", waiting)):
            client.post(RUNS, {"action": action, "index": 0, "_selected_action": [str(run.pk)]})
        client.post(act_url(bad, "retry"))
        client.post(act_url(waiting, "cancel"))
    for action, name in (("retry_selected", "bad"), ("cancel_selected", "waiting")):
        both = [str(history.runs[f"{schema}_{name}"].pk) for schema in ("t2", "t1")]
        client.post(RUNS, {"action": action, "index": 0, "_selected_action": both})
    client.post(RUN_JOB, MANUAL)
    # A bulk retry of every failed run and a bulk cancel of every run, confirmed.
    as_of = timezone.now().isoformat()
    client.post(BULK_RETRY, {"query": "status__exact=failed", "confirmed": "10", "as_of": as_of})
    client.post(BULK_CANCEL, {"query": "", "confirmed": "10", "as_of": as_of})


def assert_sees_nothing(client: Client, history: History) -> None:
    """No kumiko page answers 200, none shows any tenant's data, no request changes anything."""
    before = snapshot()
    index = client.get(ADMIN)
    assert index.status_code in (200, 302), index.status_code
    assert "/admin/kumiko_jobs/" not in index.content.decode()  # no section on the index
    secrets = _data_of(history, ("t1", "t2"))
    for page in _pages(history):
        response = client.get(page)
        # Refused (403), sent to the login page (a user unknown to this domain), or, for a row
        # this audience cannot find, to the admin's index: never a kumiko page.
        assert response.status_code in (302, 403), (page, response.status_code)
        html = response.content.decode()
        if response.status_code == 302:
            assert "/kumiko_jobs/" not in response["Location"].split("?")[0], page
            html += client.get(response["Location"]).content.decode()
        leaked = [s for s in secrets if s in html]
        assert not leaked, (page, leaked)
    try_to_act(client, history)
    assert snapshot() == before


def _listed(response: Any) -> set[str]:
    assert response.status_code == 200, response.content[:300]
    return {hexed(obj.pk) for obj in response.context["cl"].result_list}


def assert_member_sees_only(
    client: Client, history: History, schema: str, *, may_act: bool = False
) -> None:
    """The tenant's view of ``schema`` only: its runs and failures, in tenant fields; the other
    tenant's rows are not found; operators' pages refused; nothing changes, or with ``may_act``
    (``operate_tenant_runs``) its own runs only (``assert_acts_only_on``)."""
    other = "t2" if schema == "t1" else "t1"
    before = snapshot()
    runs = client.get(RUNS).content.decode()
    assert ('value="retry_selected"' in runs) is may_act
    assert ('value="cancel_selected"' in runs) is may_act
    for name, kind in (("bad", "retry"), ("waiting", "cancel")):
        page = client.get(f"{RUNS}{history.runs[f'{schema}_{name}'].pk}/change/")
        assert (act_url(history.runs[f"{schema}_{name}"], kind) in page.content.decode()) is may_act
    assert _listed(client.get(RUNS)) == history.of(schema)
    assert [f.pk for f in _rows(client.get(FAILURES))] == [history.failures[schema].pk]
    hidden = _data_of(history, (other,))
    for run in history.runs.values():
        response = client.get(f"{RUNS}{run.pk}/change/")
        if run.schema_name == schema:
            assert response.status_code == 200
            html = response.content.decode()
            assert SECRETS[schema] not in html and "Traceback" not in html  # tenant fields only
        else:
            assert response.status_code == 302  # "does not exist" for this audience
        assert not [s for s in hidden if s in response.content.decode()]
    for failure in history.failures.values():
        response = client.get(f"{FAILURES}{failure.pk}/change/")
        assert response.status_code == (200 if failure.schema_name == schema else 302)
    for page in (REJECTED, HATCHES, RUN_JOB, BULK_RETRY, BULK_CANCEL, BULK_OPERATIONS):
        assert client.get(page).status_code == 403, page
    if may_act:
        assert_acts_only_on(client, history, schema)
        return
    try_to_act(client, history)
    assert snapshot() == before


def assert_acts_only_on(client: Client, history: History, schema: str) -> None:
    """Every request of ``try_to_act`` (both tenants' runs, on the list and the run pages, the
    operators' tools): ``schema``'s failed run is retried once, its waiting run cancelled, both
    recorded as acted by a member of ``schema``; nothing else changes, no bulk operation starts,
    and the one message pushed is the retry's."""
    rows, queued, operations = snapshot()
    try_to_act(client, history)
    after, queued_after, operations_after = snapshot()
    bad, waiting = history.runs[f"{schema}_bad"], history.runs[f"{schema}_waiting"]
    added = list(JobRun.objects.exclude(pk__in=[row[0] for row in rows]))
    retried = [(r.schema_name, r.trigger.split(" by ")[0]) for r in added]
    assert retried == [(schema, f"retry:{bad.run_id}")], retried
    retry = added[0]
    assert retry.trigger.endswith(f" (tenant {schema})"), retry.trigger
    changed = {row[0] for row in set(after) - set(rows) if row[0] != retry.pk}
    assert changed == {waiting.pk}, changed
    cancelled = JobRun.objects.get(pk=waiting.pk)
    assert cancelled.status == RunStatus.CANCELLED
    assert cancelled.cancel_requested_by.endswith(f" (tenant {schema})")
    assert (queued_after, operations_after) == (queued + 1, operations)


def _rows(response: Any) -> list[Any]:
    assert response.status_code == 200, response.content[:300]
    return list(response.context["cl"].result_list)


def assert_operator_sees_all(client: Client, history: History) -> None:
    """Every tenant's runs with their payloads and errors, every failure, rejected message and
    escape-hatch use; "Run a job…" and both actions work."""
    assert _listed(client.get(RUNS)) == history.everything()
    t1_ok = client.get(f"{RUNS}{history.runs['t1_ok'].pk}/change/")
    assert SECRETS["t1"] in t1_ok.content.decode()
    t2_bad = client.get(f"{RUNS}{history.runs['t2_bad'].pk}/change/").content.decode()
    assert "boom on attempt" in t2_bad and "Traceback" in t2_bad  # the attempts' errors
    assert len(_rows(client.get(FAILURES))) == 2
    assert REJECTED_REASON in client.get(REJECTED).content.decode()
    hatches = client.get(HATCHES).content.decode()
    assert HATCH_REASONS["t1"] in hatches and HATCH_REASONS["t2"] in hatches
    assert client.get(RUN_JOB).status_code == 200
    assert (
        'name="confirmed" value="2"'
        in client.get(f"{BULK_RETRY}?status__exact=failed").content.decode()
    )
    assert client.get(BULK_OPERATIONS).status_code == 200

    runs_before = JobRun.objects.count()
    response = client.post(RUN_JOB, MANUAL)
    assert response.status_code == 302, response.content[:500]
    client.post(
        RUNS,
        {"action": "retry_selected", "index": 0, "_selected_action": [history.runs["t2_bad"].pk]},
    )
    client.post(
        RUNS,
        {
            "action": "cancel_selected",
            "index": 0,
            "_selected_action": [history.runs["t2_waiting"].pk],
        },
    )
    assert JobRun.objects.count() == runs_before + 2  # the manual run and the retry
    assert JobRun.objects.get(pk=history.runs["t2_waiting"].pk).status == RunStatus.CANCELLED


# The permissions of each role in these suites (codenames of kumiko_jobs' models).
TENANT_STAFF_PERMS = ("view_jobrun", "view_jobfailure", "change_jobrun", "add_jobrun")
# A tenant's member who may retry and cancel its runs (issue 26).
TENANT_OPERATOR_PERMS = (*TENANT_STAFF_PERMS, "operate_tenant_runs")
OPERATOR_MODEL_PERMS = (
    "view_jobrun",
    "change_jobrun",
    "add_jobrun",
    "view_jobattempt",
    "view_jobfailure",
    "view_rejectedmessage",
    "view_escapehatchuse",
    "view_bulkoperation",
)
OPERATOR_PERMS = ("view_all_tenants", *OPERATOR_MODEL_PERMS)
