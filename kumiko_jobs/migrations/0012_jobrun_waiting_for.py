# JobRun.waiting_for: which kind of deferral a deferred run waits for (issue 16), so the relay
# rebuilds its next message from the row instead of guessing from the tenant's state today.
#
# A constant DEFAULT on PostgreSQL 11+ is stored in the catalog: adding this column rewrites
# nothing and holds the table's ACCESS EXCLUSIVE lock only for the catalog change, at any size.
# The DEFAULT stays on the column (db_default) so that processes still running the previous
# release during a rolling deploy, which insert rows without this column, keep working.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('kumiko_jobs', '0011_atomic_success'),
    ]

    operations = [
        migrations.AddField(
            model_name='jobrun',
            name='waiting_for',
            field=models.CharField(blank=True, choices=[('job', 'the delay its job asked for (ctx.defer)'), ('gate', 'its tenant to be active again')], db_default='', default='', max_length=8, verbose_name='waiting for'),
        ),
    ]
