"""The dashboard's rollup of the run history (history/rollup.py): per bucket of each chart's
step, queue and job, the runs by outcome and log-scale histograms of wait and duration. Plain
tables (no model): only history/rollup.py and history/stats.py read or write them."""

from __future__ import annotations

from django.db import migrations

CREATE = """
CREATE TABLE kumiko_jobs_runrollup (
    grain integer NOT NULL,
    bucket timestamptz NOT NULL,
    queue text NOT NULL,
    job_name text NOT NULL,
    started integer NOT NULL,
    retried integer NOT NULL,
    deferred integer NOT NULL,
    succeeded integer NOT NULL,
    failed integer NOT NULL,
    cancelled integer NOT NULL,
    wait_hist jsonb,
    duration_hist jsonb,
    failures jsonb,
    PRIMARY KEY (grain, bucket, queue, job_name)
);
CREATE TABLE kumiko_jobs_runrollupmark (
    grain integer PRIMARY KEY,
    rolled_until timestamptz NOT NULL
);
"""

DROP = "DROP TABLE kumiko_jobs_runrollup; DROP TABLE kumiko_jobs_runrollupmark;"


class Migration(migrations.Migration):
    dependencies = [
        ("kumiko_jobs", "0023_progress_and_sequence_key"),
    ]

    operations = [migrations.RunSQL(CREATE, DROP, elidable=False)]
