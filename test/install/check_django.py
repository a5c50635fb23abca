"""A Django project outside the repository runs a Django-Q cluster on jobcap, with the admin
page, from the installed wheel alone, as an application role with exactly the privileges the
documentation names (test/run install).

The wheel of clients/python goes into a virtualenv outside the repository (installed.py says
how); `django-admin startproject` makes a project beside it, whose settings add only what the
documentation says (INSTALLED_APPS, Q_CLUSTER; CACHES and urls.py left as Django makes them).
The DBA (the server's superuser) creates the database, the extension, the application's role,
Django-Q's queue, and grants:

    CREATE ROLE shop_app LOGIN;
    GRANT CREATE ON SCHEMA public TO shop_app;        -- Django's own tables (PostgreSQL 15+)
    CREATE EXTENSION jobcap;
    GRANT jobcap_worker TO shop_app;
    SELECT jobcap.create_queue('shop', ...);           -- the Q_CLUSTER name
    SELECT jobcap.grant_queue('shop', 'shop_app');

With those and nothing else, shop_app runs migrate (jobcap's migrations: the extension is the
DBA's, the statistics table its own), a qcluster whose tasks succeed or fail until their cap,
and qinfo sees the cluster from another process. The admin page is linked from the admin index
and, without jobcap_operator, says what the DBA grants; after GRANT jobcap_operator TO shop_app
it lists the dead task decoded, and Django-Q's Resubmit requeues its job.
"""
import json
import os
import shutil
import signal
import subprocess
import tempfile
import textwrap
import time
import unittest

from installed import ROOT, Server, app_env, build_wheel, make_venv, run

server = None
ROLE = "shop_app"

SETTINGS = '''

# --- jobcap, as docs/adapters.md says ---------------------------------------------------------
INSTALLED_APPS += ["django_q", "jobcap.contrib.admin"]
DATABASES = {{"default": {{"ENGINE": "django.db.backends.postgresql", "NAME": "shop",
                          "USER": "{role}", "HOST": "{host}", "PORT": "{port}"}}}}
Q_CLUSTER = {{
    "name": "shop",
    "broker_class": "jobcap.contrib.django_q.Broker",
    "workers": 2,
    "timeout": 20,
    "retry": 30,
    "ack_failures": True,
    "max_attempts": 0,
    "poll": 0.2,
}}
'''

TASKS = '''
def double(x):
    return 2 * x


def boom(invoice):
    raise ValueError(f"card declined for {invoice}")
'''


def wait_for(predicate, timeout, what):
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError(f"{what}: not within {timeout} s")
        time.sleep(0.2)


def setUpModule():
    global server
    server = Server(settings={"shared_preload_libraries": "'jobcap'",
                              "jobcap.database": "'*'", "jobcap.reap_interval": "200"}
                    ).start()


def tearDownModule():
    if server is not None:
        server.stop()


class DjangoProjectTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.work = tempfile.mkdtemp(prefix="jobcap-django-")
        assert not cls.work.startswith(ROOT)
        cls.python = make_venv(os.path.join(cls.work, "venv"), build_wheel())
        cls.project = os.path.join(cls.work, "shop")
        run([cls.python, "-m", "django", "startproject", "shop"], cls.work, env=app_env())
        with open(os.path.join(cls.project, "shop", "settings.py"), "a") as f:
            f.write(SETTINGS.format(role=ROLE, host=server.dir, port=server.port))
        with open(os.path.join(cls.project, "shop", "tasks.py"), "w") as f:
            f.write(TASKS)
        cls.env = app_env(DJANGO_SUPERUSER_PASSWORD="pw-ops-1")
        # The DBA's part.
        cls.dba("CREATE DATABASE shop")
        cls.dba(f"CREATE ROLE {ROLE} LOGIN")
        cls.dba(f"GRANT CREATE ON SCHEMA public TO {ROLE}", "shop")
        cls.dba("CREATE EXTENSION jobcap", "shop")
        cls.dba(f"GRANT jobcap_worker TO {ROLE}", "shop")
        cls.dba("SELECT jobcap.create_queue('shop', max_attempts => 3, backoff_base => '0',"
                " backoff_max => '0')", "shop")
        cls.dba(f"SELECT jobcap.grant_queue('shop', '{ROLE}')", "shop")
        cls.cluster = None

    @classmethod
    def tearDownClass(cls):
        cls.stop_cluster()
        shutil.rmtree(cls.work, ignore_errors=True)

    @classmethod
    def dba(cls, statement, db="postgres"):
        return subprocess.run(
            [os.path.join(server.bindir, "psql"), "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1",
             "-d", f"host={server.dir} port={server.port} user=postgres dbname={db}",
             "-c", statement], check=True, capture_output=True, text=True).stdout.strip()

    def manage(self, *args, check=True):
        result = subprocess.run([self.python, "manage.py", *args], cwd=self.project,
                                env=self.env, capture_output=True, text=True, timeout=300)
        if check and result.returncode != 0:
            raise AssertionError(f"manage.py {' '.join(args)}: {result.returncode}\n"
                                 f"{result.stdout}{result.stderr}")
        return result

    def shell(self, code):
        return self.manage("shell", "-c", textwrap.dedent(code)).stdout.strip()

    @classmethod
    def stop_cluster(cls):
        if cls.cluster is not None:
            cls.cluster.send_signal(signal.SIGTERM)
            try:
                cls.cluster.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(cls.cluster.pid, signal.SIGKILL)
                cls.cluster.wait()
            cls.cluster = None

    def job(self, task_id):
        return self.dba("SELECT state::text || ' ' || attempts FROM jobcap.jobs"
                        f" WHERE dedupe_key = 'django-q:{task_id}'", "shop")

    def test_project(self):
        # The role has exactly the privileges named above.
        self.assertEqual(self.dba(
            "SELECT rolsuper OR rolcreatedb OR rolcreaterole OR rolreplication OR rolbypassrls,"
            "       (SELECT string_agg(b.rolname, ',' ORDER BY b.rolname) FROM pg_auth_members m"
            "          JOIN pg_roles b ON b.oid = m.roleid WHERE m.member = r.oid)"
            f"  FROM pg_roles r WHERE rolname = '{ROLE}'", "shop"), "f|jobcap_worker")

        # migrate, as the application's role: jobcap's migrations need nothing more.
        out = self.manage("migrate").stdout
        self.assertIn("Applying jobcap_admin.0001_extension... OK", out)
        self.assertIn("Applying jobcap_admin.0002_cluster_stat... OK", out)
        self.assertEqual(self.dba("SELECT relpersistence::text || pg_get_userbyid(relowner) FROM"
                                  " pg_class WHERE relname = 'jobcap_django_q_stat'", "shop"),
                         f"u{ROLE}")
        where = json.loads(self.shell("""
            import json, jobcap, jobcap.contrib.django_q, jobcap.contrib.admin
            print(json.dumps([m.__file__ for m in (jobcap, jobcap.contrib.django_q,
                                                   jobcap.contrib.admin)]))"""))
        for path in where:
            self.assertTrue(path.startswith(os.path.join(self.work, "venv")), path)
        self.manage("createsuperuser", "--noinput", "--username", "ops", "--email", "o@x.org")

        # A cluster, as the application's role.
        log = open(os.path.join(self.work, "qcluster.log"), "w+")
        type(self).cluster = subprocess.Popen([self.python, "manage.py", "qcluster"],
                                              cwd=self.project, env=self.env, stdout=log,
                                              stderr=subprocess.STDOUT, start_new_session=True)
        try:
            ok = self.shell("from django_q.tasks import async_task;"
                            "print(async_task('shop.tasks.double', 21))")
            bad = self.shell("from django_q.tasks import async_task;"
                             "print(async_task('shop.tasks.boom', 'inv-2291'))")
            wait_for(lambda: self.job(ok) == "succeeded 1", 60, "the task succeeded")
            self.assertEqual(self.shell(f"from django_q.tasks import result;"
                                        f"print(result('{ok}'))"), "42")
            wait_for(lambda: self.job(bad) == "dead 3", 60, "the failing task dead at 3")
            # What qinfo reads, from a process that is not the cluster's (CACHES: the default).
            wait_for(lambda: len(self.manage("qinfo", "--ids").stdout.split("-")) == 5, 30,
                     "qinfo sees the cluster (one UUID)")
        finally:
            self.stop_cluster()
            log.seek(0)
            cluster_log = log.read()
            log.close()
        self.assertNotIn("permission denied", cluster_log)

        # The admin page, linked from the index; without jobcap_operator it says so.
        admin = textwrap.dedent("""
            import json
            from django.test import Client
            from django.test.utils import setup_test_environment
            setup_test_environment()
            client = Client()
            client.login(username='ops', password='pw-ops-1')
            index = client.get('/admin/').content.decode()
            page = client.get('/admin/jobcap_admin/deadjob/?queue=shop').content.decode()
            """)
        got = json.loads(self.shell(admin + "print(json.dumps([index, page]))"))
        self.assertIn('<a href="/admin/jobcap_admin/deadjob/">Dead jobs</a>', got[0])
        self.assertIn(f"GRANT jobcap_operator TO {ROLE};", got[1])

        self.dba(f"GRANT jobcap_operator TO {ROLE}")
        got = json.loads(self.shell(admin + textwrap.dedent(f"""
            from django_q.models import Failure
            response = client.post('/admin/django_q/failure/',
                                   {{'action': 'retry_failed', '_selected_action': ['{bad}']}},
                                   follow=True)
            print(json.dumps([page, [str(m) for m in response.context['messages']]]))
            """)))
        self.assertIn('<span class="task-name">shop.tasks.boom</span>', got[0])
        self.assertIn("(&#x27;inv-2291&#x27;)", got[0])
        self.assertIn("error (attempt 3): card declined for inv-2291", got[0])
        self.assertEqual(len(got[1]), 1)
        self.assertRegex(got[1][0], r"requeued after 3 attempts \(resubmitted in Django-Q's "
                                    r"admin by ops\)\.$")
        self.assertEqual(self.job(bad), "pending 3")


if __name__ == "__main__":
    unittest.main()
