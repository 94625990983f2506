"""Jobs of the workflow tests (test_workflows*.py), declared at start-up so that subprocess
workers know them too. Each writes a Probe row in the schema it ran in."""

from __future__ import annotations

import json
import os
import time
from typing import Any

from django.db import connection

from kumiko_jobs import EscapeHatch, Unrecoverable, job

from .models import Probe


def _probe(ctx: Any, tag: str, note: str = "") -> None:
    Probe.objects.create(
        tag=tag, schema_seen=connection.schema_name, attempt=ctx.attempt, note=note
    )


@job(name="wf.record")
def record(ctx: Any, *, tag: str, workflow_results: dict[str, Any] | None = None) -> dict[str, Any]:
    """Succeeds; returns its tag and keeps the results it was given in the probe's note."""
    _probe(ctx, tag, json.dumps(workflow_results, sort_keys=True) if workflow_results else "")
    return {"tag": tag, "schema": connection.schema_name}


@job(name="wf.fail", retries=1, backoff={"type": "fixed", "delay": 0})
def fail(ctx: Any, *, tag: str) -> None:
    """Fails every attempt (two): its retries are exhausted."""
    _probe(ctx, tag)
    raise RuntimeError(f"{tag} fails on purpose")


@job(name="wf.flaky", retries=2, backoff={"type": "fixed", "delay": 0})
def flaky(ctx: Any, *, tag: str, fail_times: int) -> str:
    """Fails its first ``fail_times`` attempts, then succeeds."""
    _probe(ctx, tag)
    if ctx.attempt <= fail_times:
        raise RuntimeError(f"{tag} attempt {ctx.attempt} fails on purpose")
    return f"{tag} ok"


@job(name="wf.summary")
def summary(
    ctx: Any,
    *,
    tag: str,
    workflow_outcomes: dict[str, int] | None = None,
    workflow_results: dict[str, Any] | None = None,
) -> None:
    """A group's callback: writes the outcomes and results it was given."""
    note = {"outcomes": workflow_outcomes, "results": workflow_results}
    _probe(ctx, tag, json.dumps(note, sort_keys=True))


@job(name="wf.unrecoverable")
def unrecoverable(ctx: Any, *, tag: str) -> None:
    """Fails at once, without retries."""
    _probe(ctx, tag)
    raise Unrecoverable(f"{tag} cannot succeed")


@job(name="wf.system", system=True)
def system_step(ctx: Any, *, tag: str) -> None:
    """A system job, refused as a step of a tenant's workflow."""


@job(name="wf.peek")
def peek(ctx: Any, *, tag: str) -> int:
    """Tries to read every workflow's steps (other tenants' arguments): the guard refuses."""
    from kumiko_jobs.models import WorkflowStep

    return WorkflowStep.objects.count()


@job(name="wf.tamper")
def tamper(ctx: Any, *, tag: str) -> int:
    """Tries to release every waiting step of every workflow by hand: the guard refuses."""
    from kumiko_jobs.models import WorkflowStep

    return WorkflowStep.objects.filter(state="waiting").update(waiting_on=0, state="released")


@job(name="wf.progressing")
def progressing(
    ctx: Any, *, tag: str, reports: int, hold: str = "", fraction: Any = None, message: Any = None
) -> None:
    """Reports its progress ``reports`` times ("row i of n"); with ``hold``, waits after the
    first report until that file exists (a test reads the row meanwhile); with ``fraction``,
    reports that (and ``message``) once instead: a bad value fails the run."""
    if fraction is not None or message is not None:
        # "<NUL>" stands for a NUL character, which no argument may hold.
        text = message.replace("<NUL>", "\x00") if isinstance(message, str) else message
        ctx.progress(fraction, text)
        return
    for i in range(1, reports + 1):
        ctx.progress(i / reports, f"row {i} of {reports}")
        if hold and i == 1:
            deadline = time.monotonic() + 20
            while not os.path.exists(hold) and time.monotonic() < deadline:
                time.sleep(0.05)
    _probe(ctx, tag)


_FAN_IN = EscapeHatch(
    reason="tests: a system step fans in tenants' workflow results",
    grants=["cross_tenant_reads"],
)


def _fan_in(ctx: Any, workflow_ids: list[str]) -> dict[str, Any]:
    return {wid: ctx.workflow_results(wid) for wid in workflow_ids}


@job(name="wf.fan_in", system=True, escape_hatch=_FAN_IN)
def fan_in(ctx: Any, *, workflow_ids: list[str]) -> dict[str, Any]:
    """A system step that reads tenants' workflows' results, with the grant declared."""
    return _fan_in(ctx, workflow_ids)


@job(name="wf.fan_in_undeclared", system=True)
def fan_in_undeclared(ctx: Any, *, workflow_ids: list[str]) -> dict[str, Any]:
    """The same without the grant: refused."""
    return _fan_in(ctx, workflow_ids)


@job(name="wf.fan_in_tenant", escape_hatch=_FAN_IN)
def fan_in_tenant(ctx: Any, *, workflow_ids: list[str]) -> dict[str, Any]:
    """A tenant job with the grant: refused too (a system job's fan-in only)."""
    return _fan_in(ctx, workflow_ids)
