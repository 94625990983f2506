# Unique jobs (issue 24; @job(unique=...), docs/settings.md): JobRun.unique_key and two partial
# indexes over the rows that have one. The column is nullable without a default, so adding it
# rewrites nothing; the indexes are built CONCURRENTLY, outside a transaction (atomic = False),
# as in 0010 and 0014, so the runner goes on writing history meanwhile. They hold no row of a
# job without unique=, so they cost other jobs' runs nothing.
#
# The unique one is SQL (AddIndexConcurrently builds no unique partial index) and a constraint
# in the model's state. If a build is interrupted it leaves an INVALID index behind: drop it
# (DROP INDEX CONCURRENTLY <name>) and migrate again.

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models

_ACTIVE = ("queued", "running", "deferred")


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("kumiko_jobs", "0014_failure_indexes"),
    ]

    operations = [
        migrations.AddField(
            model_name="jobrun",
            name="unique_key",
            field=models.CharField(
                blank=True, max_length=64, null=True, verbose_name="unique key"
            ),
        ),
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunSQL(
                    "CREATE UNIQUE INDEX CONCURRENTLY kj_run_unique_active "
                    'ON "kumiko_jobs_jobrun" ("unique_key") '
                    "WHERE unique_key IS NOT NULL "
                    "AND status IN ('queued', 'running', 'deferred')",
                    "DROP INDEX CONCURRENTLY IF EXISTS kj_run_unique_active",
                ),
            ],
            state_operations=[
                migrations.AddConstraint(
                    model_name="jobrun",
                    constraint=models.UniqueConstraint(
                        condition=models.Q(unique_key__isnull=False, status__in=_ACTIVE),
                        fields=("unique_key",),
                        name="kj_run_unique_active",
                    ),
                ),
            ],
        ),
        AddIndexConcurrently(
            model_name="jobrun",
            index=models.Index(
                condition=models.Q(unique_key__isnull=False),
                fields=["unique_key", "finished_at"],
                name="kj_run_unique_recent",
            ),
        ),
    ]
