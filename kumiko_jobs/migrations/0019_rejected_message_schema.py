# RejectedMessage.schema_name: the tenant a refused queue message names (issue 22), so that a
# deleted tenant's refused messages, whose excerpts can hold its arguments, are deleted or
# scrubbed with the rest of its history (history/retention.py, TENANT_DELETION). Empty when the
# message names none or cannot be read. Rows written before this migration have it empty; the
# tenant's deletion also finds those by the schema field in their excerpt.
#
# A constant DEFAULT on PostgreSQL 11+ is stored in the catalog: adding the column rewrites
# nothing. The index (rows that name a tenant only) is built CONCURRENTLY, outside a
# transaction (atomic = False), as in 0010: workers go on recording refusals meanwhile. If the
# build is interrupted it leaves an INVALID index: drop it (DROP INDEX CONCURRENTLY
# kj_rejected_schema) and migrate again.

from __future__ import annotations

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("kumiko_jobs", "0018_boot_marker"),
    ]

    operations = [
        migrations.AddField(
            model_name="rejectedmessage",
            name="schema_name",
            field=models.CharField(
                blank=True,
                default="",
                help_text="The tenant the message names (unverified when it did not decode).",
                max_length=63,
            ),
        ),
        AddIndexConcurrently(
            model_name="rejectedmessage",
            index=models.Index(
                condition=models.Q(("schema_name", ""), _negated=True),
                fields=["schema_name"],
                name="kj_rejected_schema",
            ),
        ),
    ]
