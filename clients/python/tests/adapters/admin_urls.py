from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/jobcap/", include("jobcap.contrib.admin.urls")),   # the page's old address
    path("admin/", admin.site.urls),
]
