# Indexes for the run history at millions of rows (issue 15; docs/observability.md, "History
# at scale"). Built CONCURRENTLY, outside a transaction (atomic = False): CREATE INDEX
# CONCURRENTLY takes a SHARE UPDATE EXCLUSIVE lock, which lets the workers go on inserting and
# updating runs while the index is built, where a plain CREATE INDEX (SHARE lock) would stop
# every write to the table until it is done (minutes at tens of millions of rows).
#
# If a build is interrupted it leaves an INVALID index behind, and running migrate again says
# it already exists: drop it (DROP INDEX CONCURRENTLY <name>) and migrate again.

from typing import Any

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import DatabaseError, migrations, models

TRIGRAM_INDEX = "kj_run_subject_trgm"


def add_subject_trigram_index(apps: Any, schema_editor: Any) -> None:
    """A trigram index on UPPER(subject), the expression the admin's search (icontains) uses.

    pg_trgm ships with PostgreSQL and is a trusted extension (PostgreSQL 13+): the database's
    owner, or any user with CREATE on the database, may create it. When the project's user may
    not, the index is skipped with a warning (search then reads the table; the SQL to add the
    index later is in docs/observability.md) rather than failing the upgrade.
    """
    connection = schema_editor.connection
    qn = connection.ops.quote_name
    table = apps.get_model("kumiko_jobs", "JobRun")._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT n.nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace"
            " WHERE e.extname = 'pg_trgm'"
        )
        row = cursor.fetchone()
        if row is None:
            try:
                cursor.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
            except DatabaseError as exc:
                print(
                    f"\n  kumiko_jobs: no trigram index for run search ({exc}); "
                    "see docs/observability.md, 'History at scale'"
                )
                return
            cursor.execute(
                "SELECT n.nspname FROM pg_extension e JOIN pg_namespace n"
                " ON n.oid = e.extnamespace WHERE e.extname = 'pg_trgm'"
            )
            row = cursor.fetchone()
        opclass = f"{qn(row[0])}.gin_trgm_ops"
        cursor.execute(
            f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {qn(TRIGRAM_INDEX)} ON {qn(table)}"
            f" USING gin (UPPER(subject) {opclass})"
        )


def drop_subject_trigram_index(apps: Any, schema_editor: Any) -> None:
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {TRIGRAM_INDEX}")


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("kumiko_jobs", "0009_semantics"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="jobrun",
            index=models.Index(fields=["queued_at", "run_id"], name="kj_run_recent"),
        ),
        AddIndexConcurrently(
            model_name="jobrun",
            index=models.Index(
                fields=["status", "queued_at", "run_id"], name="kj_run_status_recent"
            ),
        ),
        AddIndexConcurrently(
            model_name="jobrun",
            index=models.Index(fields=["job_name", "queued_at"], name="kj_run_job_recent"),
        ),
        AddIndexConcurrently(
            model_name="jobrun",
            index=models.Index(
                fields=["schema_name", "status", "queued_at"], name="kj_run_tenant_status"
            ),
        ),
        AddIndexConcurrently(
            model_name="jobrun",
            index=models.Index(fields=["correlation_id"], name="kj_run_correlation"),
        ),
        migrations.RunPython(add_subject_trigram_index, drop_subject_trigram_index, elidable=False),
    ]
