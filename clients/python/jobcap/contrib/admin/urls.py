"""The page's first address, kept: it now lives in the admin (admin.py), with no URLs to add.
A project that included these URLs (path("admin/jobcap/", include(...))) is redirected."""
from django.urls import path
from django.views.generic import RedirectView

app_name = "jobcap_admin"
urlpatterns = [
    path("", RedirectView.as_view(pattern_name="admin:jobcap_admin_deadjob_changelist",
                                  query_string=True), name="dead_jobs"),
]
