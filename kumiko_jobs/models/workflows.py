"""Workflows (docs/workflows.md): the unit a set of steps is enqueued as, and its steps."""

from __future__ import annotations

import uuid

from django.db import models
from django.utils.translation import gettext_lazy as _

from .runs import RunStatus


class Workflow(models.Model):
    """Steps enqueued as one unit in one tenant (docs/workflows.md), with the counters that
    tell when it is done without reading its steps.

    ``status`` uses the runs' vocabulary: ``queued`` while a sequential workflow waits for the
    previous one of its name and tenant, ``running`` until every step has reached a final
    state, then ``succeeded`` (every step succeeded), ``failed`` (some failed or were skipped)
    or ``cancelled`` (cancelled from the API or the admin, or by ``stop_on_failure``).
    """

    workflow_id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.CharField(_("workflow"), max_length=200)
    schema_name = models.CharField(
        _("tenant"), max_length=63, blank=True, help_text=_("Empty for system workflows.")
    )
    status = models.CharField(
        _("status"), max_length=16, choices=RunStatus.choices, default=RunStatus.RUNNING
    )
    stop_on_failure = models.BooleanField(default=False)
    # One active workflow of this name per tenant: a later one waits ``queued`` (its first
    # steps without runs) until the previous one has finished (docs/workflows.md).
    sequential = models.BooleanField(default=False)
    # With ``sequential``: the turns are per (tenant, name, this key) instead of per (tenant,
    # name): one active "sync" workflow per account, say (``workflow(sequential_key=...)``).
    sequence_key = models.CharField(
        _("sequence key"), max_length=200, default="", db_default="", blank=True
    )
    created_at = models.DateTimeField(_("created"))
    finished_at = models.DateTimeField(_("finished"), null=True, blank=True)
    correlation_id = models.CharField(max_length=64, blank=True)
    # Counters, changed only under this row's lock (history/workflows.py): the steps in all,
    # those not final yet (0: the workflow is finished), and those that did not succeed.
    steps_total = models.PositiveIntegerField(default=0)
    steps_pending = models.IntegerField(default=0)
    steps_failed = models.IntegerField(default=0)
    reason = models.TextField(blank=True)

    class Meta:
        """Newest first; a tenant's and a status's lists are index range reads."""

        ordering = ("-created_at",)
        verbose_name = _("workflow")
        verbose_name_plural = _("workflows")
        indexes = (
            models.Index(fields=("schema_name", "-created_at"), name="kj_wf_tenant_recent"),
            models.Index(fields=("status", "created_at"), name="kj_wf_status"),
            models.Index(
                fields=("name", "schema_name", "created_at"),
                condition=models.Q(sequential=True, status__in=("queued", "running")),
                name="kj_wf_sequential_active",
            ),
        )

    def __str__(self) -> str:
        return f"{self.name}: {self.get_status_display()}"


class StepState(models.TextChoices):
    """Where a workflow step stands: ``waiting`` for its predecessors, ``released`` (its run
    exists and goes its way), then its run's final status. A skipped step is ``cancelled``,
    its reason says why."""

    WAITING = "waiting", _("waiting")
    RELEASED = "released", _("released")
    SUCCEEDED = "succeeded", _("succeeded")
    FAILED = "failed", _("failed")
    CANCELLED = "cancelled", _("cancelled")


class WorkflowStep(models.Model):
    """One step of a workflow: the job call it makes, and its place in the graph.

    The graph is stored forwards (``dependents``: the keys of the steps that wait for this one)
    with a counter on each waiting step (``waiting_on``): a finishing step decrements its
    dependents' counters, and the one that reaches 0 releases it. A group callback of 10,000
    members is one row with a counter, never 10,000 keys to read.
    """

    id = models.BigAutoField(primary_key=True)
    workflow = models.ForeignKey(Workflow, on_delete=models.CASCADE, related_name="steps")
    key = models.CharField(_("step"), max_length=200)
    job_name = models.CharField(_("job"), max_length=200)
    kwargs = models.JSONField(default=dict, blank=True)
    dependents = models.JSONField(default=list, blank=True)
    state = models.CharField(
        _("state"), max_length=16, choices=StepState.choices, default=StepState.WAITING
    )
    # A group's callback runs whatever its members' outcomes; any other step is skipped
    # (cancelled) when a predecessor did not succeed.
    always = models.BooleanField(default=False)
    waiting_on = models.IntegerField(default=0)
    preds_total = models.IntegerField(default=0)
    preds_succeeded = models.IntegerField(default=0)
    preds_failed = models.IntegerField(default=0)
    preds_cancelled = models.IntegerField(default=0)
    run_id = models.UUIDField(null=True, blank=True, unique=True)
    reason = models.TextField(blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        """A workflow's steps by key; the released ones found by the reconciler's index."""

        ordering = ("workflow", "id")
        verbose_name = _("workflow step")
        verbose_name_plural = _("workflow steps")
        constraints = (models.UniqueConstraint(fields=("workflow", "key"), name="kj_wfstep_key"),)
        indexes = (
            models.Index(
                fields=("id",),
                condition=models.Q(state="released"),
                name="kj_wfstep_released",
            ),
            models.Index(fields=("workflow", "state"), name="kj_wfstep_state"),
        )

    def __str__(self) -> str:
        return f"{self.key} ({self.job_name}): {self.get_state_display()}"
