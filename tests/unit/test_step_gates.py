"""Unit tests for the gates step (run/steps/gates.py): no database.

The gates step looks a tenant up only when the records step did not (``state.tenancy.lookup``
is None); every test here hands it the records step's answer (``Found`` / ``Missing``) or runs
a system job, so no query is made. Pinned: the job kind must match the message's schema (a
per-tenant job's schema-less message is its fan-out); the subject and the arguments are
checked before the tenant is entered; a missing tenant fails closed; an inactive tenant is
dropped or deferred (by the gate, not the job) as ``INACTIVE_TENANT`` says; a gate that refuses
never calls the rest of the pipeline, and one that admits sets the run's tenant and subject.
"""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings

from kumiko_jobs.core.exceptions import Unrecoverable
from kumiko_jobs.core.outcome import DeferralKind, Outcome
from kumiko_jobs.run.state import Found, Missing, RunState
from kumiko_jobs.run.steps.gates import gates
from tests.unit.states import make_state


class Rest:
    """The rest of the pipeline: records whether (and with which tenant) it was called."""

    def __init__(self) -> None:
        self.calls: list[Any] = []

    def __call__(self, state: RunState) -> None:
        self.calls.append(state.tenant)

    @property
    def called(self) -> bool:
        return bool(self.calls)


def refused(state: RunState, rest: Rest, reason: str) -> None:
    """The gate failed the run for good with ``reason`` and entered nothing."""
    assert not rest.called
    assert state.ending.outcome is Outcome.FAILED
    assert isinstance(state.ending.error, Unrecoverable)
    assert reason in str(state.ending.error)
    assert state.ending.reschedule is None
    assert state.tenant is None


@pytest.fixture
def active_field() -> Iterator[None]:
    """Tenants have an ``is_active`` flag (TENANT_ACTIVE_FIELD)."""
    with override_settings(
        KUMIKO_JOBS={**settings.KUMIKO_JOBS, "TENANT_ACTIVE_FIELD": "is_active"}
    ):
        yield


# --- job kind vs schema --------------------------------------------------------------------------


def test_a_system_jobs_message_naming_a_schema_is_refused() -> None:
    state, rest = make_state("t1", system=True, kwargs={}), Rest()
    gates(state, rest)
    refused(state, rest, "message for a system job names schema 't1'")


def test_a_tenant_jobs_message_without_a_schema_is_refused() -> None:
    state, rest = make_state(None), Rest()
    gates(state, rest)
    refused(state, rest, "message for a tenant job names schema None")


def test_a_system_job_runs_for_no_tenant() -> None:
    state, rest = make_state(None, system=True, kwargs={}), Rest()
    gates(state, rest)
    assert rest.calls == [None]
    assert state.ending.outcome is None  # the gate decides nothing for an admitted run


def test_a_per_tenant_jobs_message_without_a_schema_is_its_fan_out() -> None:
    state, rest = make_state(None, per_tenant=True), Rest()
    gates(state, rest)
    assert rest.calls == [None]


# --- subject and arguments -----------------------------------------------------------------------


def test_an_admitted_run_gets_its_tenant_and_subject() -> None:
    tenant = SimpleNamespace(schema_name="t1")
    state = make_state("t1", lookup=Found(tenant), tenant_visible_run=["invoice_id"])
    rest = Rest()
    gates(state, rest)
    assert rest.calls == [tenant]
    assert state.tenant is tenant
    assert state.watch.tenant is tenant  # what the guard reads
    assert state.tenancy.subject == "invoice_id=4"


def test_a_subject_field_that_is_not_a_primitive_is_refused() -> None:
    state = make_state(
        "t1",
        kwargs={"invoice_id": 4, "note": {"nested": 1}},
        lookup=Found(object()),
        tenant_visible_run=["note"],
    )
    rest = Rest()
    gates(state, rest)
    refused(state, rest, "subject field 'note' is a dict")


def test_arguments_that_do_not_fit_the_function_are_refused() -> None:
    state, rest = (
        make_state("t1", kwargs={"invoice_id": 4, "typo": 1}, lookup=Found(object())),
        Rest(),
    )
    gates(state, rest)
    refused(state, rest, "unexpected keyword argument 'typo'")


# --- the tenant ----------------------------------------------------------------------------------


def test_a_missing_tenant_fails_closed() -> None:
    state, rest = make_state("t9", lookup=Missing()), Rest()
    gates(state, rest)
    refused(state, rest, "tenant not found: no tenant has schema 't9'")


def test_without_an_active_field_every_found_tenant_runs() -> None:
    tenant = SimpleNamespace(is_active=False)
    state, rest = make_state("t1", lookup=Found(tenant)), Rest()
    gates(state, rest)  # TENANT_ACTIVE_FIELD is None in the test settings
    assert rest.calls == [tenant]


@pytest.mark.usefixtures("active_field")
def test_an_active_tenant_runs() -> None:
    tenant = SimpleNamespace(is_active=True)
    state, rest = make_state("t1", lookup=Found(tenant)), Rest()
    gates(state, rest)
    assert rest.calls == [tenant]


@pytest.mark.usefixtures("active_field")
def test_an_inactive_tenants_run_is_dropped_by_default() -> None:
    state, rest = make_state("t1", lookup=Found(SimpleNamespace(is_active=False))), Rest()
    gates(state, rest)
    assert not rest.called
    assert state.ending.outcome is Outcome.DROPPED
    assert state.ending.drop_reason == "tenant 't1' is inactive"
    assert state.tenant is None


def test_an_inactive_tenants_run_is_deferred_by_the_gate_when_configured() -> None:
    overrides = {
        **settings.KUMIKO_JOBS,
        "TENANT_ACTIVE_FIELD": "is_active",
        "INACTIVE_TENANT": "defer",
        "INACTIVE_TENANT_DEFER_SECONDS": 120,
    }
    state, rest = make_state("t1", lookup=Found(SimpleNamespace(is_active=False))), Rest()
    with override_settings(KUMIKO_JOBS=overrides):
        gates(state, rest)
    assert not rest.called
    assert state.ending.outcome is Outcome.DEFERRED
    assert state.ending.deferral_kind is DeferralKind.GATE
    assert state.ending.deferral_seconds == 120.0
