# The bucket figures in the unique index (live/models.py says why).

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('live', '0001_initial'),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name='snapshotbucket',
            name='snapshotbucket_run_name_bucket',
        ),
        migrations.AddConstraint(
            model_name='snapshotbucket',
            constraint=models.UniqueConstraint(fields=('run', 'name', 'bucket'), include=('min_value', 'max_value', 'last_step', 'last_t', 'last_value'), name='snapshotbucket_run_name_bucket'),
        ),
    ]
