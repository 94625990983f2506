# A system run that a tenant's run started counts against that tenant's flow control (its
# pause, caps, rate limits and fair share): the run row keeps that tenant's schema, so that a
# message rebuilt from the row (the relay, the sweep) is filed where the first one was.
# db_default "": a process of the previous release, still running during a rolling deploy,
# inserts rows without this column.

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("kumiko_jobs", "0029_atomic_finish_in_transaction"),
    ]

    operations = [
        migrations.AddField(
            model_name="jobrun",
            name="flow_schema",
            field=models.CharField(
                blank=True,
                db_default="",
                default="",
                max_length=63,
                verbose_name="counts against tenant",
            ),
        ),
    ]
