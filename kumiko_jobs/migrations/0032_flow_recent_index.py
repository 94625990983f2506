# kj_run_flow_recent, partial (flow_schema <> ''): the dashboard's tenant filter's second arm,
# the system runs a tenant's runs started (0030's flow_schema), read by index as
# kj_run_tenant_recent reads the tenant's own. No entry for any other run, so a run's writes
# cost what they cost. Built CONCURRENTLY (atomic = False, as 0027), alone in its migration:
# an interrupted build leaves an INVALID index and this migration unrecorded; drop the index
# (DROP INDEX CONCURRENTLY kj_run_flow_recent) and migrate again.

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("kumiko_jobs", "0031_flow_tenant_shares"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="jobrun",
            index=models.Index(
                condition=models.Q(("flow_schema", ""), _negated=True),
                fields=["flow_schema", "-queued_at"],
                name="kj_run_flow_recent",
            ),
        ),
    ]
