# Statistics on LOWER(subject) for the run search (issue 15; docs/observability.md, "History at
# scale"). A search word like ``invoice_id=12`` (a value shorter than a trigram) is checked
# with LOWER(subject) LIKE '%invoice\_id=12%' alone, and without statistics on that expression
# PostgreSQL guesses from the pattern's length that almost no row matches (26 of a busy
# tenant's 316,000 runs, where 3,574 do): it then reads the whole table rather than the
# tenant's runs newest first, 1-6 s at 10 million runs. With the expression's histogram it
# estimates the matches from a sample (3,203) and walks the tenant's time index (0.1 s).
#
# Not an index: CREATE STATISTICS only writes the catalog (SHARE UPDATE EXCLUSIVE lock, which
# lets inserts and updates go on). The statistics are gathered by the next ANALYZE of the
# table, which this migration runs (a sample of 30,000 rows, seconds at any size; the same
# lock) rather than waiting for autovacuum. Non-atomic so that the ANALYZE is not held in the
# migration's transaction. Expression statistics need PostgreSQL 14 (Django 6 needs 15).

from django.db import migrations

STATISTICS = "kj_run_subject_lower"


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("kumiko_jobs", "0012_jobrun_waiting_for"),
    ]

    operations = [
        migrations.RunSQL(
            f"CREATE STATISTICS IF NOT EXISTS {STATISTICS} ON (LOWER(subject::text))"
            " FROM kumiko_jobs_jobrun",
            f"DROP STATISTICS IF EXISTS {STATISTICS}",
            elidable=False,
        ),
        migrations.RunSQL("ANALYZE kumiko_jobs_jobrun", migrations.RunSQL.noop, elidable=False),
    ]
