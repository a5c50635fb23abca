from django.urls import path

from . import views

app_name = "jobcap_admin"
urlpatterns = [
    path("", views.dead_jobs, name="dead_jobs"),
    path("requeue/", views.requeue, name="requeue"),
    path("purge/", views.purge, name="purge"),
]
