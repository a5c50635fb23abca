"""The built wheel is whole, and Celery runs on jobcap from it alone (test/run install).

The wheel of clients/python is installed into a virtualenv outside the repository (installed.py
says how). From there, with no PYTHONPATH and no path into the checkout: every module of the
package imports (the Celery and Django-Q adapters, the admin app with its migrations and
templates), each from the venv; and a real `celery worker` (prefork, the documented settings,
broker_transport naming the transport) runs tasks published by an application, each task
recording where its jobcap modules came from and its sys.path.
"""
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import unittest
import zipfile

from installed import ROOT, Server, app_env, build_wheel, make_venv, run, source_files

server = None

IMPORT_ALL = r'''
import importlib, json, os, pkgutil, sys
import django
from django.conf import settings
settings.configure(
    SECRET_KEY="install-check", USE_TZ=True, DATABASES={},
    INSTALLED_APPS=["django.contrib.admin", "django.contrib.auth", "django.contrib.contenttypes",
                    "django.contrib.sessions", "django.contrib.messages", "django_q",
                    "jobcap.contrib.admin"],
    TEMPLATES=[{"BACKEND": "django.template.backends.django.DjangoTemplates", "APP_DIRS": True,
                "OPTIONS": {}}],
    Q_CLUSTER={"name": "install-check", "broker_class": "jobcap.contrib.django_q.Broker"})
django.setup()
import jobcap
names = sorted(m.name for m in pkgutil.walk_packages(jobcap.__path__, "jobcap."))
for name in names:
    importlib.import_module(name)
from django.template.loader import get_template
from importlib import resources
print(json.dumps({
    "names": names,
    "files": {m: getattr(sys.modules[m], "__file__", None) for m in sorted(sys.modules)
              if m == "jobcap" or m.startswith("jobcap.")},
    "template": get_template("jobcap_admin/dead_jobs.html").origin.name,
    "py_typed": resources.files("jobcap").joinpath("py.typed").is_file(),
    "path": sys.path}))
'''

CELERY_APP = r'''
"""An application's Celery app, as the docs write it."""
import json
import os
import sys

import psycopg
from celery import Celery

import jobcap

CONNINFO = os.environ["SHOP_DB"]

app = Celery("shop", broker_url="jobcap://",
             broker_transport="jobcap.contrib.kombu:Transport",
             broker_transport_options={"conninfo": CONNINFO, "visibility_timeout": 30,
                                       "polling_interval": 0.1})
app.conf.update(task_acks_late=True, task_reject_on_worker_lost=True,
                task_acks_on_failure_or_timeout=False, worker_prefetch_multiplier=1,
                worker_enable_remote_control=False, task_default_queue="shop")


@app.task(bind=True)
def where(self, n):
    from jobcap.contrib.kombu import fence_of
    job_id, fence = fence_of(self.request)
    modules = {m: getattr(sys.modules[m], "__file__", None) for m in sys.modules
               if m == "jobcap" or m.startswith("jobcap.")}
    with psycopg.connect(CONNINFO) as conn:
        jobcap.assert_fence(conn, job_id, fence)
        conn.execute("INSERT INTO seen VALUES (%s, %s, %s, %s)",
                     (n, os.getpid(), json.dumps(modules), json.dumps(sys.path)))
'''

PUBLISH = r'''
import sys
import shop
ids = [shop.where.delay(i).id for i in range(int(sys.argv[1]))]
print(len(ids))
'''


def setUpModule():
    global server
    server = Server().start()


def tearDownModule():
    if server is not None:
        server.stop()


def sql(query):
    return server.psql(query)


class CeleryFromTheWheel(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.work = tempfile.mkdtemp(prefix="jobcap-celery-app-")   # outside the repository
        cls.wheel = build_wheel()
        cls.python = make_venv(os.path.join(cls.work, "venv"), cls.wheel)
        cls.prefix = os.path.join(cls.work, "venv")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.work, True)

    def assert_from_the_venv(self, files, path):
        self.assertIn("jobcap.contrib.kombu", files)
        for module, file in files.items():
            self.assertTrue(file and file.startswith(self.prefix + os.sep),
                            f"{module} imported from {file}, not from the venv")
        self.assertFalse([p for p in path if p.startswith(ROOT)],
                         f"a path into the checkout: {path}")

    def test_the_wheel_holds_every_file_of_the_package(self):
        with zipfile.ZipFile(self.wheel) as whl:
            held = {n for n in whl.namelist() if not n.split("/")[0].endswith(".dist-info")}
        want = source_files()
        for needed in ("jobcap/contrib/kombu.py", "jobcap/contrib/django_q.py",
                       "jobcap/contrib/admin/templates/jobcap_admin/dead_jobs.html",
                       "jobcap/contrib/admin/migrations/0001_extension.py", "jobcap/py.typed"):
            self.assertIn(needed, want)   # the checkout has it, so the wheel must
        self.assertEqual(sorted(want - held), [], "in the checkout, missing from the wheel")
        self.assertEqual(sorted(held - want), [], "in the wheel, not in the checkout")

    def test_every_module_imports_from_the_venv(self):
        app = os.path.join(self.work, "imports")
        os.mkdir(app)
        with open(os.path.join(app, "import_all.py"), "w") as f:
            f.write(IMPORT_ALL)
        seen = json.loads(run([self.python, "import_all.py"], app, env=app_env()))
        for name in ("jobcap.contrib", "jobcap.contrib.kombu", "jobcap.contrib.django_q",
                     "jobcap.contrib.admin", "jobcap.contrib.admin.migrations",
                     "jobcap.contrib.admin.migrations.0001_extension",
                     "jobcap.contrib.admin.views"):
            self.assertIn(name, seen["names"])
        self.assert_from_the_venv(seen["files"], seen["path"])
        self.assertTrue(seen["template"].startswith(self.prefix + os.sep), seen["template"])
        self.assertTrue(seen["py_typed"])

    def test_a_celery_worker_from_the_venv_runs_tasks(self):
        app = os.path.join(self.work, "shop")
        os.mkdir(app)
        with open(os.path.join(app, "shop.py"), "w") as f:
            f.write(CELERY_APP)
        with open(os.path.join(app, "publish.py"), "w") as f:
            f.write(PUBLISH)
        sql("CREATE TABLE seen (n int, pid int, modules jsonb, path jsonb)")
        env = app_env(SHOP_DB=server.conninfo)
        log = open(os.path.join(self.work, "worker.log"), "w+")
        self.addCleanup(log.close)
        # `python -m celery` of the venv: Debian's /usr/bin/celery would run the system python,
        # which does not see the venv.
        worker = subprocess.Popen(
            [self.python, "-m", "celery", "-A", "shop", "worker", "-P", "prefork", "-c", "2",
             "-l", "info"], cwd=app, env=env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True)

        def stop():
            if worker.poll() is None:
                os.killpg(worker.pid, signal.SIGKILL)
                worker.wait()
        self.addCleanup(stop)
        self.assertEqual(run([self.python, "publish.py", "10"], app, env=env).strip(), "10")
        end = time.monotonic() + 60
        while sql("SELECT count(*) FROM seen") != "10":
            if time.monotonic() > end or worker.poll() is not None:
                log.seek(0)
                self.fail(f"10 tasks not run within 60 s:\n{log.read()[-4000:]}")
            time.sleep(0.2)
        worker.send_signal(signal.SIGTERM)
        self.assertEqual(worker.wait(30), 0)
        log.seek(0)
        out = log.read()
        self.assertIn("Connected to jobcap", out)
        self.assertNotIn("No hostname was supplied", out)
        self.assertEqual(sql("SELECT state || ' ' || count(*) FROM jobcap.jobs WHERE queue ="
                             " 'shop' GROUP BY state"), "succeeded 10")
        pids = sql("SELECT count(DISTINCT pid) FROM seen")
        self.assertGreaterEqual(int(pids), 1)
        for row in sql("SELECT json_build_object('m', modules, 'p', path) FROM seen"
                       ).splitlines():
            seen = json.loads(row)
            self.assert_from_the_venv(seen["m"], seen["p"])


if __name__ == "__main__":
    unittest.main()
