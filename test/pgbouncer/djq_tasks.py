"""The Django-Q task of the pooler matrix: its effect through Django's connection (autocommit).
With hang set it hangs the first time it starts (table starts counts the starts: the matrix
SIGKILLs the cluster then)."""
import time

from django.db import connection


def effect(n, hang=False):
    with connection.cursor() as cursor:
        if hang:
            cursor.execute("INSERT INTO starts (client, n) VALUES ('djq', %s)", [n])
            cursor.execute("SELECT count(*) FROM starts WHERE client = 'djq' AND n = %s", [n])
            if cursor.fetchone()[0] == 1:
                time.sleep(600)
        cursor.execute("INSERT INTO effects (client, n) VALUES ('djq', %s)", [n])
    return n
