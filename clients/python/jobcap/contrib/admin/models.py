"""The app's two models: Django-Q's cluster statistics on jobcap, and the admin index's entry.

ClusterStat is the table where jobcap's Django-Q broker keeps what Django-Q's Redis broker keeps
in Redis: each cluster's status (Broker.set_stat, read by qinfo, qmonitor and Django-Q's
Cluster.stat). A row per key, a few hundred bytes, rewritten every guard cycle (half a second)
while its cluster runs, and dead once ``expires_at`` has passed: the table is UNLOGGED (its
migration), as nothing in it is worth a WAL record or outlives a crash.

DeadJob has no table of its own (managed = False): it puts "Dead jobs" under "jobcap" on
Django's admin index, and its permissions (view; change for requeue and purge) are what staff
users are given to use the page (see admin.py).
"""
from django.db import models


class ClusterStat(models.Model):
    key = models.CharField(max_length=255, primary_key=True)
    value = models.TextField()
    expires_at = models.DateTimeField()

    class Meta:
        db_table = "jobcap_django_q_stat"
        verbose_name = "Django-Q cluster statistic"


class DeadJob(models.Model):
    class Meta:
        managed = False
        db_table = "jobcap_dead_jobs_page"   # never queried: the page reads jobcap's views
        verbose_name = "dead job"
        verbose_name_plural = "dead jobs"
