# Cancellation requests of running runs, the "cancelled" attempt outcome, and the "skipped" and
# "capped" statuses (issue 14). Labels are the statuses' own words, as in 0007.

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("kumiko_jobs", "0008_job_results"),
    ]

    operations = [
        migrations.AddField(
            model_name="jobrun",
            name="cancel_requested_at",
            field=models.DateTimeField(blank=True, null=True, verbose_name="cancel requested"),
        ),
        migrations.AddField(
            model_name="jobrun",
            name="cancel_requested_by",
            field=models.CharField(blank=True, max_length=150, verbose_name="cancel requested by"),
        ),
        migrations.AlterField(
            model_name="jobattempt",
            name="outcome",
            field=models.CharField(
                choices=[
                    ("succeeded", "Succeeded"),
                    ("failed", "Failed"),
                    ("retrying", "Retrying"),
                    ("deferred", "Deferred"),
                    ("dropped", "Dropped"),
                    ("cancelled", "Cancelled"),
                ],
                max_length=16,
            ),
        ),
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
                    ("skipped", "skipped"),
                    ("capped", "capped"),
                ],
                default="queued",
                max_length=16,
                verbose_name="status",
            ),
        ),
    ]
