"""The operators' permission ``kumiko_jobs.view_all_tenants`` (issue 23).

Every tenant's runs on the public schema's domain need it; ``view_jobrun`` alone no longer
opens the operators' view, since with shared users a tenant's staff user may hold that too.
Only the model's options change: no table is touched.
"""

from __future__ import annotations

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("kumiko_jobs", "0015_jobrun_unique_key"),
    ]

    operations = [
        migrations.AlterModelOptions(
            name="jobrun",
            options={
                "ordering": ("-queued_at",),
                "permissions": (
                    ("manage_queues", "Can use django-rq's queue pages"),
                    ("view_all_tenants", "Can view every tenant's runs (the operators' admin)"),
                ),
                "verbose_name": "job run",
                "verbose_name_plural": "job runs",
            },
        ),
    ]
