from __future__ import annotations

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("kumiko_jobs", "0007_newcomer"),
    ]

    operations = [
        migrations.AddField(
            model_name="jobrun",
            name="result",
            field=models.JSONField(blank=True, null=True, verbose_name="result"),
        ),
    ]
