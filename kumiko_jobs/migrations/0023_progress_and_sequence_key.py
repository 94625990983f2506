"""A run's progress (ctx.progress: the fraction and the text the job last reported), and a
sequential workflow's key (workflow(sequential_key=...): turns per tenant, name and key)."""

from __future__ import annotations

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("kumiko_jobs", "0022_bulk_operations"),
    ]

    operations = [
        migrations.AddField(
            model_name="jobrun",
            name="progress",
            field=models.FloatField(blank=True, null=True, verbose_name="progress"),
        ),
        migrations.AddField(
            model_name="jobrun",
            name="progress_message",
            field=models.CharField(
                blank=True,
                db_default="",
                default="",
                max_length=200,
                verbose_name="progress message",
            ),
        ),
        migrations.AddField(
            model_name="workflow",
            name="sequence_key",
            field=models.CharField(
                blank=True, db_default="", default="", max_length=200, verbose_name="sequence key"
            ),
        ),
    ]
