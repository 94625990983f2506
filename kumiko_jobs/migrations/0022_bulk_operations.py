"""Bulk operations (issue 26): an operator's retry or cancel of every run a filter matches,
and the list of runs each may act on."""

from __future__ import annotations

import uuid

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("kumiko_jobs", "0021_flow_control"),
    ]

    operations = [
        migrations.CreateModel(
            name="BulkOperation",
            fields=[
                (
                    "operation_id",
                    models.UUIDField(
                        default=uuid.uuid4, editable=False, primary_key=True, serialize=False
                    ),
                ),
                (
                    "kind",
                    models.CharField(
                        choices=[("retry", "retry"), ("cancel", "cancel")],
                        max_length=16,
                        verbose_name="operation",
                    ),
                ),
                (
                    "state",
                    models.CharField(
                        choices=[("running", "running"), ("done", "done"), ("stopped", "stopped")],
                        default="running",
                        max_length=16,
                        verbose_name="state",
                    ),
                ),
                (
                    "requested_by",
                    models.CharField(blank=True, max_length=150, verbose_name="requested by"),
                ),
                ("requested_at", models.DateTimeField(verbose_name="requested")),
                ("filter_query", models.TextField(blank=True, verbose_name="filter")),
                ("as_of", models.DateTimeField(verbose_name="runs queued up to")),
                ("confirmed", models.PositiveIntegerField(verbose_name="confirmed count")),
                ("listed", models.PositiveIntegerField(default=0, verbose_name="runs listed")),
                ("done", models.PositiveIntegerField(default=0, verbose_name="done")),
                ("skipped", models.PositiveIntegerField(default=0, verbose_name="skipped")),
                ("failed", models.PositiveIntegerField(default=0, verbose_name="failed")),
                ("reasons", models.JSONField(blank=True, default=dict, verbose_name="reasons")),
                ("batches", models.PositiveIntegerField(default=0, verbose_name="batches")),
                (
                    "progressed_at",
                    models.DateTimeField(blank=True, null=True, verbose_name="last progress"),
                ),
                (
                    "finished_at",
                    models.DateTimeField(blank=True, null=True, verbose_name="finished"),
                ),
                (
                    "stopped_by",
                    models.CharField(blank=True, max_length=150, verbose_name="stopped by"),
                ),
            ],
            options={
                "verbose_name": "bulk operation",
                "verbose_name_plural": "bulk operations",
                "ordering": ("-requested_at",),
            },
        ),
        migrations.CreateModel(
            name="BulkItem",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("run_id", models.UUIDField()),
                ("outcome", models.CharField(blank=True, default="", max_length=16)),
                ("note", models.CharField(blank=True, default="", max_length=200)),
                (
                    "operation",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="items",
                        to="kumiko_jobs.bulkoperation",
                    ),
                ),
            ],
            options={
                "verbose_name": "bulk operation run",
                "verbose_name_plural": "bulk operation runs",
                "indexes": [
                    models.Index(
                        condition=models.Q(("outcome", "")),
                        fields=["operation", "id"],
                        name="kj_bulk_item_pending",
                    )
                ],
                "constraints": [
                    models.UniqueConstraint(
                        fields=("operation", "run_id"), name="kj_bulk_item_unique"
                    )
                ],
            },
        ),
    ]
