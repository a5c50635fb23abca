from django.apps import AppConfig


class JobcapAdminConfig(AppConfig):
    name = "jobcap.contrib.admin"
    label = "jobcap_admin"
    verbose_name = "jobcap"
    default_auto_field = "django.db.models.AutoField"
