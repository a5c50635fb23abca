"""Creates the jobcap extension in Django's database (a no-op where it exists)."""
from django.db import migrations


class Migration(migrations.Migration):
    initial = True
    dependencies = []
    operations = [
        migrations.RunSQL("CREATE EXTENSION IF NOT EXISTS jobcap",
                          reverse_sql=migrations.RunSQL.noop),
    ]
