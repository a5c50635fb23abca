"""Django-Q's cluster statistics (an UNLOGGED table: see models.py) and the admin index entry
(no table)."""
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("jobcap_admin", "0001_extension"),
    ]

    operations = [
        migrations.CreateModel(
            name="DeadJob",
            fields=[
                ("id", models.AutoField(auto_created=True, primary_key=True, serialize=False,
                                        verbose_name="ID")),
            ],
            options={
                "verbose_name": "dead job",
                "verbose_name_plural": "dead jobs",
                "db_table": "jobcap_dead_jobs_page",
                "managed": False,
            },
        ),
        migrations.CreateModel(
            name="ClusterStat",
            fields=[
                ("key", models.CharField(max_length=255, primary_key=True, serialize=False)),
                ("value", models.TextField()),
                ("expires_at", models.DateTimeField()),
            ],
            options={
                "verbose_name": "Django-Q cluster statistic",
                "db_table": "jobcap_django_q_stat",
            },
        ),
        migrations.RunSQL("ALTER TABLE jobcap_django_q_stat SET UNLOGGED",
                          reverse_sql="ALTER TABLE jobcap_django_q_stat SET LOGGED"),
    ]
