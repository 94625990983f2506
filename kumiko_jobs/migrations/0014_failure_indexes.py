# Indexes for the failures list at hundreds of thousands of rows (issue 15; docs/observability.md,
# "History at scale"): at 10 M runs there are ~400,000 failures, and without these the operators'
# list sorted the whole table for each page and its job filter read it whole (SELECT DISTINCT).
# Built CONCURRENTLY, outside a transaction (atomic = False), as in 0010: the runner goes on
# writing failures while the indexes are built (a plain CREATE INDEX would block those writes).
#
# If a build is interrupted it leaves an INVALID index behind, and running migrate again says
# it already exists: drop it (DROP INDEX CONCURRENTLY <name>) and migrate again.

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("kumiko_jobs", "0013_jobrun_subject_statistics"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="jobfailure",
            index=models.Index(fields=["failed_at", "id"], name="kj_failure_recent"),
        ),
        AddIndexConcurrently(
            model_name="jobfailure",
            index=models.Index(
                fields=["job_name", "failed_at", "id"], name="kj_failure_job_recent"
            ),
        ),
    ]
