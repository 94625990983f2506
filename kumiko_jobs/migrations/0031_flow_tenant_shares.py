# The dashboard counts a system run a tenant's run started (JobRun.flow_schema, migration 0030)
# for that tenant, as the fair dequeue does (docs/observability.md, "Whose runs"):
#
# - the worker-time rollup keeps flow_schema beside schema_name (in its key), so its days read
#   such a run's time as the tenant's. Rows written before this keep '' there: their flow runs
#   stay the system's (only days rolled up by a release with 0030 and without this one hold
#   any). Added with its default and the key changed in one ALTER TABLE (atomic by itself; the
#   table holds a few thousand rows). Backwards: the rows are dropped with the mark of grain
#   86400, so the previous release rolls the days up again from the history.
# - the index the tenant filter reads for those runs is 0032's, built CONCURRENTLY in a
#   migration of its own: this one stays atomic, so an interrupted index build never leaves
#   this ALTER applied and unrecorded (migrating again would fail on the column it added).

from django.db import migrations

TABLE = "kumiko_jobs_workertimerollup"

FORWARD = (
    f"ALTER TABLE {TABLE} ADD COLUMN flow_schema text NOT NULL DEFAULT '', "
    f"DROP CONSTRAINT {TABLE}_pkey, ADD PRIMARY KEY (bucket, queue, schema_name, flow_schema)"
)
BACKWARD = (
    f"DELETE FROM {TABLE}; DELETE FROM kumiko_jobs_runrollupmark WHERE grain = 86400; "
    f"ALTER TABLE {TABLE} DROP CONSTRAINT {TABLE}_pkey, DROP COLUMN flow_schema, "
    f"ADD PRIMARY KEY (bucket, queue, schema_name)"
)


class Migration(migrations.Migration):
    dependencies = [
        ("kumiko_jobs", "0030_jobrun_flow_schema"),
    ]

    operations = [
        migrations.RunSQL(FORWARD, BACKWARD, elidable=False),
    ]
