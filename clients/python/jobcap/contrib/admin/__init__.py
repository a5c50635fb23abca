"""jobcap in Django's admin: dead jobs per queue, their failures, requeue and purge.

Add "jobcap.contrib.admin" to INSTALLED_APPS (its migration creates the extension when the
database role may) and include ``jobcap.contrib.admin.urls`` before the admin's own URLs:

    path("admin/jobcap/", include("jobcap.contrib.admin.urls")),
    path("admin/", admin.site.urls),
"""

