# The run's hot path (issues 24, 25; bench/README.md, "2026-12-06: the run row's indexes"):
# two of the run table's indexes become partial, so that the start and finish of a run write
# fewer index entries. Neither update is HOT (its status is indexed, as the admin's lists need),
# so PostgreSQL adds an entry to every index whose predicate the new row version satisfies:
#
# * kj_run_finished (finished_at) holds finished runs only (WHERE finished_at IS NOT NULL): the
#   enqueue's and the start's row versions have none. Every reader asks for a range of
#   finished_at (the dashboard, the rollup, retention, unique_for), which implies NOT NULL.
# * kj_run_job_tenant (job_name, schema_name, status) holds active runs only (queued, running,
#   deferred): its readers (admission of concurrency="skip"/max_per_tenant, "replace", a retry's
#   check for a pending retry) ask for those statuses only; a finish (succeeded, failed, ...)
#   no longer writes to it, and at 10 M runs it is a few thousand entries instead of 10 M.
#
# Each new index is built CONCURRENTLY under a temporary name (the runner goes on writing
# history meanwhile: SHARE UPDATE EXCLUSIVE, as in 0010), then the old one is dropped
# CONCURRENTLY and the new one takes its name (ALTER INDEX RENAME: SHARE UPDATE EXCLUSIVE, a
# moment): readers always have one of the two. atomic = False, since CONCURRENTLY cannot run in
# a transaction. Each build scans the table twice; at 1 M runs on the benchmark's shared
# 2-CPU machine the whole migration took TIME_1M while the runner went on (bench/README.md). If
# a build is interrupted it leaves an INVALID index behind, and
# running migrate again says it already exists: drop it (DROP INDEX CONCURRENTLY
# kj_run_..._new) and migrate again.

from django.contrib.postgres.operations import AddIndexConcurrently, RemoveIndexConcurrently
from django.db import migrations, models

_ACTIVE = ("queued", "running", "deferred")


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("kumiko_jobs", "0025_worker_time_rollup"),
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
        AddIndexConcurrently(
            model_name="jobrun",
            index=models.Index(
                condition=models.Q(status__in=_ACTIVE),
                fields=["job_name", "schema_name", "status"],
                name="kj_run_job_tenant_new",
            ),
        ),
        RemoveIndexConcurrently(model_name="jobrun", name="kj_run_job_tenant"),
        migrations.RenameIndex(
            model_name="jobrun", new_name="kj_run_job_tenant", old_name="kj_run_job_tenant_new"
        ),
    ]
