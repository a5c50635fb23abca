"""The jobcap extension in Django's database.

Where a DBA created it already, this asks nothing of the application's role (CREATE EXTENSION
is not even tried). Where it is missing, it is created if the role may (jobcap's install
needs a superuser); otherwise migrate stops with what the DBA runs.
"""
from django.core.management.base import CommandError
from django.db import migrations

WHAT_THE_DBA_RUNS = """\
jobcap is not installed in database "{db}", and role "{role}" may not install it ({error}).
A DBA runs, in that database (psql -d {db}):

    CREATE EXTENSION jobcap;
    GRANT jobcap_worker TO {role};                     -- enqueue, and run a Django-Q cluster
    -- Django-Q's queue (Q_CLUSTER name), created unless it exists, and granted:
    SELECT jobcap.grant_queue('{queue}', '{role}', create_missing => true);
    GRANT jobcap_operator TO {role};                   -- only for the admin's jobcap page

then runs migrate again."""


def create_extension(apps, schema_editor):
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("SELECT EXISTS (SELECT FROM pg_catalog.pg_extension"
                       "               WHERE extname = 'jobcap'), current_user,"
                       "       current_database()")
        exists, role, db = cursor.fetchone()
        if exists:
            return
        try:
            cursor.execute("CREATE EXTENSION jobcap")
        except Exception as error:
            cause = error.__cause__ or error
            code = getattr(cause, "pgcode", None) or getattr(cause, "sqlstate", None)
            text = str(cause).strip().splitlines()[0] if str(cause).strip() else repr(cause)
            if code != "42501":     # not a privilege: the package is missing, say
                raise CommandError(f"could not create the jobcap extension in database "
                                   f'"{db}": {text}') from error
            raise CommandError(WHAT_THE_DBA_RUNS.format(db=db, role=role, queue=_queue_name(),
                                                        error=text)) from error


def _queue_name() -> str:
    from django.conf import settings
    return getattr(settings, "Q_CLUSTER", {}).get("name", "default")


class Migration(migrations.Migration):
    initial = True
    dependencies = []
    operations = [
        migrations.RunPython(create_extension, migrations.RunPython.noop, elidable=False),
    ]
