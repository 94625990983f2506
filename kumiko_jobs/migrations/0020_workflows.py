"""Workflows (issue 27): the workflow and step tables, and JobRun.workflow_id (nullable: an
instant ALTER, and rows of a previous release's process insert NULL, a plain run).
"""

from __future__ import annotations

import uuid

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("kumiko_jobs", "0019_rejected_message_schema"),
    ]

    operations = [
        migrations.AddField(
            model_name="jobrun",
            name="workflow_id",
            field=models.UUIDField(blank=True, null=True, verbose_name="workflow"),
        ),
        migrations.CreateModel(
            name="Workflow",
            fields=[
                (
                    "workflow_id",
                    models.UUIDField(
                        default=uuid.uuid4, editable=False, primary_key=True, serialize=False
                    ),
                ),
                ("name", models.CharField(max_length=200, verbose_name="workflow")),
                (
                    "schema_name",
                    models.CharField(
                        blank=True,
                        help_text="Empty for system workflows.",
                        max_length=63,
                        verbose_name="tenant",
                    ),
                ),
                (
                    "status",
                    models.CharField(
                        choices=[
                            ("queued", "queued"),
                            ("running", "running"),
                            ("deferred", "deferred"),
                            ("succeeded", "succeeded"),
                            ("failed", "failed"),
                            ("cancelled", "cancelled"),
                            ("skipped", "skipped"),
                            ("capped", "capped"),
                        ],
                        default="running",
                        max_length=16,
                        verbose_name="status",
                    ),
                ),
                ("stop_on_failure", models.BooleanField(default=False)),
                ("sequential", models.BooleanField(default=False)),
                ("created_at", models.DateTimeField(verbose_name="created")),
                (
                    "finished_at",
                    models.DateTimeField(blank=True, null=True, verbose_name="finished"),
                ),
                ("correlation_id", models.CharField(blank=True, max_length=64)),
                ("steps_total", models.PositiveIntegerField(default=0)),
                ("steps_pending", models.IntegerField(default=0)),
                ("steps_failed", models.IntegerField(default=0)),
                ("reason", models.TextField(blank=True)),
            ],
            options={
                "verbose_name": "workflow",
                "verbose_name_plural": "workflows",
                "ordering": ("-created_at",),
                "indexes": [
                    models.Index(fields=["schema_name", "-created_at"], name="kj_wf_tenant_recent"),
                    models.Index(fields=["status", "created_at"], name="kj_wf_status"),
                    models.Index(
                        condition=models.Q(
                            ("sequential", True), ("status__in", ("queued", "running"))
                        ),
                        fields=["name", "schema_name", "created_at"],
                        name="kj_wf_sequential_active",
                    ),
                ],
            },
        ),
        migrations.CreateModel(
            name="WorkflowStep",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("key", models.CharField(max_length=200, verbose_name="step")),
                ("job_name", models.CharField(max_length=200, verbose_name="job")),
                ("kwargs", models.JSONField(blank=True, default=dict)),
                ("dependents", models.JSONField(blank=True, default=list)),
                (
                    "state",
                    models.CharField(
                        choices=[
                            ("waiting", "waiting"),
                            ("released", "released"),
                            ("succeeded", "succeeded"),
                            ("failed", "failed"),
                            ("cancelled", "cancelled"),
                        ],
                        default="waiting",
                        max_length=16,
                        verbose_name="state",
                    ),
                ),
                ("always", models.BooleanField(default=False)),
                ("waiting_on", models.IntegerField(default=0)),
                ("preds_total", models.IntegerField(default=0)),
                ("preds_succeeded", models.IntegerField(default=0)),
                ("preds_failed", models.IntegerField(default=0)),
                ("preds_cancelled", models.IntegerField(default=0)),
                ("run_id", models.UUIDField(blank=True, null=True, unique=True)),
                ("reason", models.TextField(blank=True)),
                ("finished_at", models.DateTimeField(blank=True, null=True)),
                (
                    "workflow",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="steps",
                        to="kumiko_jobs.workflow",
                    ),
                ),
            ],
            options={
                "verbose_name": "workflow step",
                "verbose_name_plural": "workflow steps",
                "ordering": ("workflow", "id"),
                "indexes": [
                    models.Index(
                        condition=models.Q(("state", "released")),
                        fields=["id"],
                        name="kj_wfstep_released",
                    ),
                    models.Index(fields=["workflow", "state"], name="kj_wfstep_state"),
                ],
                "constraints": [
                    models.UniqueConstraint(fields=("workflow", "key"), name="kj_wfstep_key")
                ],
            },
        ),
    ]
