"""Django settings for a Django-Q cluster on the jobcap broker, its database (and so the
broker's) through the pooler: $PGB_HOST, $PGB_PORT, database $PGB_DBNAME; cluster $PGB_QUEUE."""
import os

SECRET_KEY = "jobcap-tests-only"
INSTALLED_APPS = ("django.contrib.contenttypes", "django.contrib.auth", "django_q")
DATABASES = {"default": {
    "ENGINE": "django.db.backends.postgresql", "NAME": os.environ["PGB_DBNAME"],
    "USER": "postgres", "HOST": os.environ["PGB_HOST"], "PORT": os.environ["PGB_PORT"],
    # PgBouncer in transaction pooling: no server-side cursors (Django's documentation)
    "DISABLE_SERVER_SIDE_CURSORS": True}}
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"
Q_CLUSTER = {"name": os.environ["PGB_QUEUE"], "workers": 2, "timeout": 3, "retry": 5,
             "poll": 0.5, "log_level": "INFO", "ack_failures": True, "max_attempts": 0,
             "broker_class": "jobcap.contrib.django_q.Broker",
             "jobcap": {"max_attempts": 3, "backoff_base": 0, "backoff_max": 0}}
