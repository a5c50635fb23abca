"""jobcap in Django's admin: dead jobs per queue, their failures, requeue and purge; the
storage of Django-Q's cluster statistics for jobcap's Django-Q broker; Django-Q's Resubmit as a
requeue of the task's job.

Add "jobcap.contrib.admin" to INSTALLED_APPS and run migrate: its first migration creates the
extension where it is missing (when the database role may; otherwise it says what the DBA
runs), its second the statistics table. The page is linked from the admin index ("jobcap",
"Dead jobs"); nothing is added to urls.py.
"""
