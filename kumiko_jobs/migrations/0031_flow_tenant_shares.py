# The dashboard counts a system run a tenant's run started (JobRun.flow_schema, migration 0030)
# for that tenant, as the fair dequeue does (docs/observability.md, "Whose runs"):
#
# - the worker-time rollup keeps flow_schema beside schema_name (in its key), so its days read
#   such a run's time as the tenant's. Rows written before this keep '' there: their flow runs
#   stay the system's (only days rolled up by a release with 0030 and without this one hold
#   any). Added with its default and the key changed in one ALTER TABLE (atomic by itself; the
#   table holds a few thousand rows). Backwards: the rows are dropped with the mark of grain
#   86400, so the previous release rolls the days up again from the history.
# - kj_run_flow_recent, partial (flow_schema <> ''): the tenant filter's second arm, the system
#   runs a tenant's runs started, read by index as kj_run_tenant_recent reads its own. No
#   entry for any other run, so a run's writes cost what they cost. Built CONCURRENTLY
#   (atomic = False, as 0027); an interrupted build leaves an INVALID index: drop it
#   (DROP INDEX CONCURRENTLY kj_run_flow_recent) and migrate again.

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models

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
    atomic = False

    dependencies = [
        ("kumiko_jobs", "0030_jobrun_flow_schema"),
    ]

    operations = [
        migrations.RunSQL(FORWARD, BACKWARD, elidable=False),
        AddIndexConcurrently(
            model_name="jobrun",
            index=models.Index(
                condition=models.Q(("flow_schema", ""), _negated=True),
                fields=["flow_schema", "-queued_at"],
                name="kj_run_flow_recent",
            ),
        ),
    ]
