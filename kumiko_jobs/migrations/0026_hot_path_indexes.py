# The run's hot path (issues 24, 25; bench/README.md, "2026-12-06: the run row's indexes"):
# three of the run table's indexes become partial, so that the start and finish of a run write
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
# * kj_run_subject_trgm (the trigram index of 0010) holds runs with a subject only (WHERE
#   subject <> ''): a run without one wrote an empty GIN item with each of its three versions.
#   The search asks for subject <> '' with every word (admin/search.py), which it cannot match
#   otherwise, so the planner may use the partial index.
#
# Each new index is built CONCURRENTLY under a temporary name (the runner goes on writing
# history meanwhile: SHARE UPDATE EXCLUSIVE, as in 0010), then the old one is dropped
# CONCURRENTLY and the new one takes its name (ALTER INDEX RENAME: SHARE UPDATE EXCLUSIVE, a
# moment): readers always have one of the two. atomic = False, since CONCURRENTLY cannot run in
# a transaction. At 10 M runs the builds read the table three times (about a minute each on
# the benchmark's machine, the trigram one longer when most runs have a subject); an operator
# may build the new indexes ahead of the deploy with the statements `manage.py sqlmigrate
# kumiko_jobs 0026` prints. If a build is interrupted it leaves an INVALID index behind, and
# running migrate again says it already exists: drop it (DROP INDEX CONCURRENTLY
# kj_run_..._new) and migrate again.

from typing import Any

from django.contrib.postgres.operations import AddIndexConcurrently, RemoveIndexConcurrently
from django.db import migrations, models

_ACTIVE = ("queued", "running", "deferred")
TRIGRAM_INDEX = "kj_run_subject_trgm"


def _trigram_index(apps: Any, schema_editor: Any, *, partial: bool) -> None:
    """Rebuild 0010's trigram index with (``partial``) or without the ``subject <> ''``
    predicate, under its name; nothing when 0010 could not make it (no pg_trgm)."""
    connection = schema_editor.connection
    qn = connection.ops.quote_name
    table = apps.get_model("kumiko_jobs", "JobRun")._meta.db_table
    new = f"{TRIGRAM_INDEX}_new"
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT n.nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace"
            " WHERE e.extname = 'pg_trgm'"
        )
        row = cursor.fetchone()
        cursor.execute("SELECT to_regclass(%s) IS NOT NULL", [TRIGRAM_INDEX])
        exists = cursor.fetchone()[0]
        if row is None or not exists:
            return
        opclass = f"{qn(row[0])}.gin_trgm_ops"
        where = " WHERE subject <> ''" if partial else ""
        cursor.execute(
            f"CREATE INDEX CONCURRENTLY {qn(new)} ON {qn(table)}"
            f" USING gin (UPPER(subject) {opclass}){where}"
        )
        cursor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {qn(TRIGRAM_INDEX)}")
        cursor.execute(f"ALTER INDEX {qn(new)} RENAME TO {qn(TRIGRAM_INDEX)}")


def partial_trigram_index(apps: Any, schema_editor: Any) -> None:
    _trigram_index(apps, schema_editor, partial=True)


def whole_trigram_index(apps: Any, schema_editor: Any) -> None:
    _trigram_index(apps, schema_editor, partial=False)


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
        migrations.RunPython(partial_trigram_index, whole_trigram_index, elidable=False),
    ]
