from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/jobcap/", include("jobcap.contrib.admin.urls")),
    path("admin/", admin.site.urls),
]
