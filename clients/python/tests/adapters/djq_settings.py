"""Django settings for running Django-Q's own test suite, and the admin page's test, on jobcap.

The database is the throwaway server of the test run ($JOBCAP_TEST_HOST/_PORT); Django-Q's
broker is jobcap's, or with JOBCAP_TEST_BROKER=redis Django-Q's own Redis broker on the server
at $JOBCAP_TEST_REDIS_PORT (to run Django-Q's suite on both with the same settings). CACHES is
left at Django's default (a local-memory cache per process), as a new project has it: the
cluster's statistics are the broker's to share.
"""
import os

SECRET_KEY = "jobcap-tests-only"
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
INSTALLED_APPS = (
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_q",
    "jobcap.contrib.admin",
)
MIDDLEWARE = (
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
)
ROOT_URLCONF = os.environ.get("JOBCAP_TEST_URLCONF", "django_q.tests.urls")
TEMPLATES = [{
    "BACKEND": "django.template.backends.django.DjangoTemplates",
    "DIRS": [],
    "APP_DIRS": True,
    "OPTIONS": {"context_processors": [
        "django.template.context_processors.debug",
        "django.template.context_processors.request",
        "django.contrib.auth.context_processors.auth",
        "django.contrib.messages.context_processors.messages",
    ]},
}]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": os.environ.get("JOBCAP_TEST_DBNAME", "postgres"),
        "USER": os.environ.get("JOBCAP_TEST_USER", "postgres"),
        "HOST": os.environ.get("JOBCAP_TEST_HOST", ""),
        "PORT": os.environ.get("JOBCAP_TEST_PORT", "5432"),
        # Django-Q's suite: a test database per broker (run_django_q_suite.py)
        "TEST": {"NAME": os.environ.get("JOBCAP_TEST_DATABASE")},
    }
}
if os.environ.get("JOBCAP_TEST_SQLITE"):
    # djq_recycle_probe.py: Django-Q's own settings' database, for Django-Q's Redis broker only
    DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3",
                             "NAME": os.environ["JOBCAP_TEST_SQLITE"]}}
    INSTALLED_APPS = tuple(a for a in INSTALLED_APPS if a != "jobcap.contrib.admin")

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "/static/"
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"
LOGGING = {"version": 1, "disable_existing_loggers": False,
           "handlers": {"console": {"class": "logging.StreamHandler"}},
           "loggers": {"django_q": {"handlers": ["console"], "level": "WARNING"}}}

Q_CLUSTER = {
    "name": "django_q_test",
    "cpu_affinity": 1,
    "testing": True,
    "log_level": "WARNING",
    "broker_class": "jobcap.contrib.django_q.Broker",
    "retry": 60,
    "timeout": 30,
    "ack_failures": True,
    "max_attempts": 0,
    "poll": 0.1,
    "jobcap": {"max_attempts": 5, "backoff_base": 0, "backoff_max": 0},
}

if os.environ.get("JOBCAP_TEST_BROKER") == "redis":
    del Q_CLUSTER["broker_class"], Q_CLUSTER["jobcap"]
    Q_CLUSTER["redis"] = {"host": "127.0.0.1", "port": int(os.environ["JOBCAP_TEST_REDIS_PORT"]),
                          "db": 0}

if os.environ.get("JOBCAP_TEST_Q_CLUSTER") == "cluster":
    # The cluster test: short leases. Django-Q's guard kills a task after 2 s, its lease (retry)
    # lapses after 4 s; Django-Q's own max_attempts is set, to show it cannot turn a failure
    # into a success.
    Q_CLUSTER.update(timeout=2, retry=4, workers=2, max_attempts=2,
                     jobcap={"max_attempts": 3, "backoff_base": 0, "backoff_max": 0})
