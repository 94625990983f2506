# The run's hot path (issues 24, 25; bench/README.md, "2026-12-06: the run row's indexes"):
# kj_run_finished (finished_at) becomes partial, WHERE finished_at IS NOT NULL. A run's row
# updates are never HOT (its status is indexed, as the admin's lists need), so PostgreSQL adds
# an entry to every index whose predicate the new row version satisfies; the enqueue's and the
# start's versions have no finished_at, so each now writes one index entry less. Every reader
# asks for a range of finished_at (the dashboard, the rollup, retention, the relay,
# unique_for), which implies NOT NULL, so each can still use it.
#
# Not made partial, though its hot-path readers would allow it: kj_run_job_tenant (active runs
# only would spare the finish an entry), because the tenants' job filter (admin/filters.py,
# run_job_names) probes it once per job name for a run of the tenant in any status; without it
# that filter reads the tenant's runs or the job's (75-175 ms instead of 3 ms at 1 M runs).
#
# The new index is built CONCURRENTLY under a temporary name (the runner goes on writing
# history meanwhile: SHARE UPDATE EXCLUSIVE, as in 0010), then the old one is dropped
# CONCURRENTLY and the new one takes its name (ALTER INDEX RENAME: SHARE UPDATE EXCLUSIVE, a
# moment): readers always have one of the two. atomic = False, since CONCURRENTLY cannot run in
# a transaction. The build scans the table twice: at 1 M runs on the benchmark's shared 2-CPU
# machine (load 29) the migration took 32 s, backwards 115 s (bench/README.md). If the build is
# interrupted it leaves an INVALID index behind, and running migrate again says it already
# exists: drop it (DROP INDEX CONCURRENTLY kj_run_finished_new) and migrate again.

from django.contrib.postgres.operations import AddIndexConcurrently, RemoveIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("kumiko_jobs", "0026_tenant_day_rollup"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="jobrun",
            index=models.Index(
                condition=models.Q(finished_at__isnull=False),
                fields=["finished_at"],
                name="kj_run_finished_new",
            ),
        ),
        RemoveIndexConcurrently(model_name="jobrun", name="kj_run_finished"),
        migrations.RenameIndex(
            model_name="jobrun", new_name="kj_run_finished", old_name="kj_run_finished_new"
        ),
    ]
