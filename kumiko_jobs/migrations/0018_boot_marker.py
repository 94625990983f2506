# Boot markers (issue 23): a run_on_boot job is enqueued once per Redis dataset even after
# retention deleted its run row, which was the only marker before. Retention never deletes
# these rows (one per boot job and Redis dataset).

from __future__ import annotations

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("kumiko_jobs", "0017_outlive_run"),
    ]

    operations = [
        migrations.CreateModel(
            name="BootMarker",
            fields=[
                ("run_id", models.UUIDField(primary_key=True, serialize=False)),
                ("job_name", models.CharField(max_length=200)),
                ("dataset", models.CharField(max_length=100)),
                ("enqueued_at", models.DateTimeField()),
            ],
            options={
                "ordering": ("-enqueued_at",),
            },
        ),
    ]
