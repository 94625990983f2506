"""Flow control (round 3): a run's priority level, and the operators' pauses."""

from __future__ import annotations


from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("kumiko_jobs", "0020_workflows"),
    ]

    operations = [
        migrations.AddField(
            model_name="jobrun",
            name="priority",
            field=models.SmallIntegerField(db_default=0, default=0, verbose_name="priority"),
        ),
        migrations.CreateModel(
            name="FlowPause",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                (
                    "queue",
                    models.CharField(blank=True, default="", max_length=100, verbose_name="queue"),
                ),
                (
                    "job_name",
                    models.CharField(blank=True, default="", max_length=200, verbose_name="job"),
                ),
                (
                    "schema_name",
                    models.CharField(blank=True, default="", max_length=63, verbose_name="tenant"),
                ),
                ("paused_at", models.DateTimeField(auto_now_add=True, verbose_name="paused")),
                (
                    "paused_by",
                    models.CharField(
                        blank=True, default="", max_length=150, verbose_name="paused by"
                    ),
                ),
            ],
            options={
                "verbose_name": "pause",
                "verbose_name_plural": "pauses",
                "constraints": [
                    models.UniqueConstraint(
                        fields=("queue", "job_name", "schema_name"), name="kj_pause_unique"
                    ),
                    models.CheckConstraint(
                        condition=models.Q(
                            models.Q(
                                models.Q(("queue", ""), _negated=True),
                                ("job_name", ""),
                                ("schema_name", ""),
                            ),
                            models.Q(
                                ("queue", ""),
                                models.Q(
                                    models.Q(("job_name", ""), _negated=True),
                                    models.Q(("schema_name", ""), _negated=True),
                                    _connector="OR",
                                ),
                            ),
                            _connector="OR",
                        ),
                        name="kj_pause_one_kind",
                    ),
                ],
            },
        ),
    ]
