"""The tenants' permission ``kumiko_jobs.operate_tenant_runs`` (issue 26).

A tenant's members holding it retry and cancel that tenant's runs on its domain's admin
(core/audience.py). Only the model's options change: no table is touched.
"""

from __future__ import annotations

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("kumiko_jobs", "0027_hot_path_indexes"),
    ]

    operations = [
        migrations.AlterModelOptions(
            name="jobrun",
            options={
                "ordering": ("-queued_at",),
                "permissions": (
                    ("manage_queues", "Can use django-rq's queue pages"),
                    ("view_all_tenants", "Can view every tenant's runs (the operators' admin)"),
                    ("operate_tenant_runs", "Can retry and cancel its tenant's runs"),
                ),
                "verbose_name": "job run",
                "verbose_name_plural": "job runs",
            },
        ),
    ]
