"""The dashboard's rollup of worker time (history/rollup.py): per UTC day, queue and tenant, the
summed duration of the runs that finished then, so the tenants' share of a week's worker time
reads a few thousand rows instead of the week's runs. A plain table (no model), written only
by the workers' maintenance round; its rolled-up end is the mark table's row of grain 86400."""

from __future__ import annotations

from django.db import migrations

CREATE = """
CREATE TABLE kumiko_jobs_workertimerollup (
    bucket timestamptz NOT NULL,
    queue text NOT NULL,
    schema_name text NOT NULL,
    worker_ms numeric NOT NULL,
    runs integer NOT NULL,
    PRIMARY KEY (bucket, queue, schema_name)
);
"""

DROP = (
    "DROP TABLE kumiko_jobs_workertimerollup; "
    "DELETE FROM kumiko_jobs_runrollupmark WHERE grain = 86400;"
)


class Migration(migrations.Migration):
    dependencies = [
        ("kumiko_jobs", "0024_run_rollup"),
    ]

    operations = [migrations.RunSQL(CREATE, DROP, elidable=False)]
