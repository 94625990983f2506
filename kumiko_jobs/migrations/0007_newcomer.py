# The status labels are the statuses' own words (issue 13: one vocabulary): "deferred" and
# "succeeded" instead of "waiting" and "done". Only the choices' labels change; no data moves.
from __future__ import annotations

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("kumiko_jobs", "0006_web_surfaces"),
    ]

    operations = [
        migrations.AlterField(
            model_name="jobrun",
            name="status",
            field=models.CharField(
                choices=[
                    ("queued", "queued"),
                    ("running", "running"),
                    ("deferred", "deferred"),
                    ("succeeded", "succeeded"),
                    ("failed", "failed"),
                    ("cancelled", "cancelled"),
                ],
                default="queued",
                max_length=16,
                verbose_name="status",
            ),
        ),
    ]
