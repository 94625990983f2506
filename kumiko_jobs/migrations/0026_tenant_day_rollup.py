"""The tenant console's rollup (history/tenant_rollup.py): per UTC day of enqueue, tenant and
job (and per day and tenant for all of its jobs, ``job_name`` ``''``), the runs by outcome, the
runs not finished when the day was rolled up, and log-scale histograms of wait and duration. A
plain table (no model), written only by the workers' maintenance round; its rolled-up end is
the mark table's row of grain -86400."""

from __future__ import annotations

from django.db import migrations

CREATE = """
CREATE TABLE kumiko_jobs_tenantdayrollup (
    schema_name text NOT NULL,
    job_name text NOT NULL,
    day timestamptz NOT NULL,
    runs integer NOT NULL,
    succeeded integer NOT NULL,
    failed integer NOT NULL,
    unfinished integer NOT NULL,
    wait_hist jsonb,
    duration_hist jsonb,
    rolled_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (schema_name, day, job_name)
);
CREATE INDEX kj_tenantday_day ON kumiko_jobs_tenantdayrollup (day);
CREATE INDEX kj_tenantday_unfinished ON kumiko_jobs_tenantdayrollup (rolled_at)
    WHERE unfinished > 0 AND job_name = '';
"""

DROP = (
    "DROP TABLE kumiko_jobs_tenantdayrollup; "
    "DELETE FROM kumiko_jobs_runrollupmark WHERE grain = -86400;"
)


class Migration(migrations.Migration):
    dependencies = [
        ("kumiko_jobs", "0025_worker_time_rollup"),
    ]

    operations = [migrations.RunSQL(CREATE, DROP, elidable=False)]
