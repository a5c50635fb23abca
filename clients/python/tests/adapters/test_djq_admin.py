"""jobcap.contrib.admin without a browser: payloads decoded for the page (and a hostile pickle
not run), Django-Q's Resubmit as a requeue of the task's job, the page and Resubmit for a
database role without jobcap_operator, the statistics table's migration, and the migration
for an application role (extension created by the DBA; missing, with what the DBA runs).

Django runs in subprocesses (`python -m django shell` with djq_settings), as in
test_django_q.py: the Celery tests share this process.
"""
import json
import os
import subprocess
import sys
import textwrap
import unittest
import uuid

import psycopg

from common import HERE, start_server

server = None
ENV = None


def setUpModule():
    global server, ENV
    server = start_server()
    ENV = dict(os.environ,
               PYTHONPATH=os.pathsep.join([os.path.join(HERE, "..", ".."), HERE]),
               DJANGO_SETTINGS_MODULE="djq_settings", JOBCAP_TEST_HOST=server.dir,
               JOBCAP_TEST_PORT=str(server.port), JOBCAP_TEST_URLCONF="admin_urls")
    subprocess.run([sys.executable, "-m", "django", "migrate", "-v", "0"], cwd=HERE, env=ENV,
                   check=True)
    django("from django.contrib.auth.models import User;"
           "User.objects.create_superuser('ops', 'ops@example.com', 'pw-ops-1')")


def tearDownModule():
    if server is not None:
        server.stop()


def sql(query, params=None, dbname="postgres", user="postgres"):
    conninfo = f"host={server.dir} port={server.port} dbname={dbname} user={user}"
    with psycopg.connect(conninfo, autocommit=True) as conn:
        cur = conn.execute(query, params)
        return cur.fetchall() if cur.description else None


def django(code, env=None, check=True, command="shell"):
    """Runs code in a Django shell of the test settings; returns the completed process."""
    args = ["shell", "-c", textwrap.dedent(code)] if command == "shell" else command
    return subprocess.run([sys.executable, "-m", "django", *args], cwd=HERE,
                          env=env or ENV, check=check, capture_output=True, text=True)


def django_json(code, env=None):
    out = django(code, env).stdout.strip().splitlines()
    return json.loads(out[-1])


ADMIN_CLIENT = """
import json
from django.test import Client
from django.test.utils import setup_test_environment
setup_test_environment()
client = Client()
client.login(username='ops', password='pw-ops-1')
def post_action(ids):
    response = client.post('/admin/django_q/failure/',
                           {'action': 'retry_failed', '_selected_action': ids}, follow=True)
    return [str(m) for m in response.context['messages']]
"""


class PayloadsTest(unittest.TestCase):
    """describe() on what the adapters enqueue, and on what they must not run."""

    def test_payloads(self):
        marker = f"/tmp/jobcap-pwned-{uuid.uuid4().hex}"
        got = django_json(f"""
            import base64, json, pickle, os
            from django.contrib.auth.models import User
            from django_q.conf import Conf
            from django_q import core_signing
            from django_q.signing import PickleSerializer, SignedPackage
            from django_q.tasks import async_task
            from jobcap.contrib.admin.payloads import describe
            user = User.objects.get(username='ops')

            def package_of(job_id):
                from django.db import connection
                with connection.cursor() as c:
                    c.execute('SELECT payload FROM jobcap.jobs WHERE job_id = %s', (job_id,))
                    return c.fetchone()[0]

            out = {{}}
            job = async_task('djq_tasks.boom', 'scan-0042.pdf', user, pages=[1, 2, 3],
                             group='scans')
            from django.db import connection
            with connection.cursor() as c:
                c.execute("SELECT payload FROM jobcap.jobs WHERE queue = %s"
                          " ORDER BY job_id DESC LIMIT 1", (Conf.PREFIX,))
                out['djq'] = describe(c.fetchone()[0], Conf.PREFIX)
            out['djq_func'] = describe({{'package': SignedPackage.dumps(
                {{'id': 'x', 'name': 'n', 'func': describe, 'args': (1,), 'kwargs': {{}}}})}},
                Conf.PREFIX)
            out['djq_other_key'] = describe({{'package': core_signing.dumps(
                {{'id': 'x'}}, key='another key', salt=Conf.PREFIX,
                serializer=PickleSerializer)}},
                Conf.PREFIX)

            class Evil:
                def __reduce__(self):
                    return (os.system, ('touch {marker}',))
            evil = core_signing.dumps({{'id': 'e', 'name': 'evil', 'func': 'math.floor',
                                       'args': (Evil(),), 'kwargs': {{}}}},
                                      key=Conf.SECRET_KEY, salt=Conf.PREFIX,
                                      serializer=PickleSerializer)
            out['evil'] = describe({{'package': evil}}, Conf.PREFIX)
            out['evil_ran'] = os.path.exists('{marker}')

            def kombu(body, ctype='application/json', **headers):
                return {{'body': base64.b64encode(body).decode(), 'content-type': ctype,
                         'content-encoding': 'utf-8', 'headers': headers,
                         'properties': {{'body_encoding': 'base64'}}}}
            out['celery'] = describe(kombu(json.dumps([['inv-7'], {{'retry': True}}, {{}}])
                                           .encode(),
                                           task='billing.charge', id='1',
                                           argsrepr="('inv-7',)", kwargsrepr="{{'retry': True}}"))
            out['celery_masked'] = describe(kombu(json.dumps([['4111-1111'], {{}}, {{}}]).encode(),
                                                  task='billing.charge', id='2',
                                                  argsrepr="('****',)", kwargsrepr='{{}}'))
            out['celery_body'] = describe(kombu(json.dumps([['inv-8'], {{}}, {{}}]).encode(),
                                                task='billing.refund', id='3'))
            out['celery_pickle'] = describe(kombu(pickle.dumps(([Evil()], {{}}, {{}})),
                                                  'application/x-python-serialize',
                                                  task='billing.refund', id='4'))
            out['evil_ran'] = out['evil_ran'] or os.path.exists('{marker}')
            out['plain'] = describe({{'file': 'corrupt.mp4', 'size': 7340032}})
            print(json.dumps(out))
            """)
        self.assertFalse(got["evil_ran"], "a payload's pickle ran code")
        self.assertFalse(os.path.exists(marker))

        djq = got["djq"]
        self.assertEqual((djq["kind"], djq["task"]), ("django-q", "djq_tasks.boom"))
        self.assertEqual(djq["args"], "('scan-0042.pdf', <auth.User 1>, pages=[1, 2, 3])")
        self.assertRegex(djq["note"], r"^Django-Q task [a-z]+-[a-z]+-[a-z]+-[a-z]+, group scans$")
        self.assertEqual(got["djq_func"]["task"], "jobcap.contrib.admin.payloads.describe")
        self.assertEqual(got["djq_other_key"]["task"], "")
        self.assertIn("signature does not verify", got["djq_other_key"]["note"])
        self.assertRegex(got["evil"]["args"], r"^\(posix\.system\('touch /tmp/job")

        self.assertEqual(got["celery"], {"kind": "celery", "task": "billing.charge",
                                         "args": "('inv-7',) {'retry': True}",
                                         "note": "Celery task (arguments as Celery's "
                                                 "argsrepr/kwargsrepr)"})
        self.assertEqual(got["celery_masked"]["args"], "('****',)")
        self.assertEqual((got["celery_body"]["task"], got["celery_body"]["args"]),
                         ("billing.refund", "('inv-8')"))
        self.assertEqual(got["celery_pickle"]["args"], "")
        self.assertIn("application/x-python-serialize: not decoded",
                      got["celery_pickle"]["note"])
        self.assertEqual(got["plain"]["args"], '{"file": "corrupt.mp4", "size": 7340032}')


def jobs_of(queue):
    return sql("SELECT job_id, state::text, attempts, max_attempts FROM jobcap.jobs"
               " WHERE queue = %s ORDER BY job_id", (queue,))


class ResubmitTest(unittest.TestCase):
    """Django-Q's "Resubmit" action on failed tasks requeues the one job."""

    def test_resubmit(self):
        queue = "django_q_test"
        # A task enqueued by Django-Q, then failed: pending (to be retried), then dead.
        task_id = django_json("""
            import json
            from django.utils import timezone
            from django_q.tasks import async_task
            from django_q.models import Task
            from django_q.signing import SignedPackage
            from django.db import connection
            async_task('djq_tasks.boom', 'scan-7.pdf')
            with connection.cursor() as c:
                c.execute("SELECT payload->>'package' FROM jobcap.jobs"
                          " ORDER BY job_id DESC LIMIT 1")
                task = SignedPackage.loads(c.fetchone()[0])
            Task.objects.create(id=task['id'], name=task['name'], func=task['func'],
                                args=task['args'], kwargs=task['kwargs'], started=timezone.now(),
                                stopped=timezone.now(), success=False, result='ValueError')
            print(json.dumps(task['id']))
            """)
        before = jobs_of(queue)
        job_id = before[-1][0]
        self.assertEqual(sql("SELECT dedupe_key FROM jobcap.jobs WHERE job_id = %s",
                             (job_id,)), [(f"django-q:{task_id}",)])

        messages = django_json(ADMIN_CLIENT + f"print(json.dumps(post_action(['{task_id}'])))")
        self.assertEqual(len(messages), 1)
        self.assertRegex(messages[0], rf"its job {job_id} is pending \(attempt 0 of 5\): "
                                      "left as it is")
        self.assertEqual(jobs_of(queue), before)

        for _ in range(5):
            sql("SELECT jobcap.fail_job(job_id, fence, 'ValueError: cannot process') FROM"
                " jobcap.claim_job_by_id(%s, 'test')", (job_id,))
        self.assertEqual(sql("SELECT state::text, attempts FROM jobcap.jobs WHERE job_id = %s",
                             (job_id,)), [("dead", 5)])

        messages = django_json(ADMIN_CLIENT + f"print(json.dumps(post_action(['{task_id}'])))")
        self.assertEqual(len(messages), 1)
        self.assertRegex(messages[0], rf"job {job_id} requeued after 5 attempts "
                                      r"\(resubmitted in Django-Q's admin by ops\)")
        after = jobs_of(queue)
        self.assertEqual(len(after), len(before), "a new job was made")
        self.assertEqual(sql("SELECT state::text, attempts, max_attempts FROM jobcap.jobs"
                             " WHERE job_id = %s", (job_id,)), [("pending", 5, 10)])
        self.assertEqual(sql("SELECT kind, error FROM jobcap.job_errors WHERE job_id = %s"
                             " ORDER BY seq DESC LIMIT 1", (job_id,)),
                         [("requeued", "resubmitted in Django-Q's admin by ops")])
        self.assertEqual(django("from django_q.models import Failure;"
                                f"print(Failure.objects.filter(id='{task_id}').count())")
                         .stdout.strip(), "0")

    def test_resubmit_of_a_task_whose_job_is_gone(self):
        """As Django-Q does: enqueued again (a new job), with a warning saying so."""
        queue = "django_q_test"
        task_id = uuid.uuid4().hex
        django(f"""
            from django.utils import timezone
            from django_q.models import Task
            Task.objects.create(id='{task_id}', name='gone-task', func='djq_tasks.ok',
                                args=(4,), kwargs={{}}, started=timezone.now(),
                                stopped=timezone.now(), success=False, result='x')
            """)
        before = jobs_of(queue) or []
        messages = django_json(ADMIN_CLIENT + f"print(json.dumps(post_action(['{task_id}'])))")
        self.assertEqual(messages, ["gone-task: its job is no longer kept (past its "
                                    "retention, or enqueued under a jobcap_dedupe_key of its "
                                    "own): enqueued as a new job, with a new budget of "
                                    "attempts."])
        self.assertEqual(len(jobs_of(queue)), len(before) + 1)


class PermissionsTest(unittest.TestCase):
    """Staff users see the page with DeadJob's view permission; requeue and purge need its
    change permission; without either the page is refused (and not on the admin index)."""

    def test_permissions(self):
        sql("SELECT jobcap.create_queue('perm', max_attempts => 1)")
        job_id = sql("SELECT jobcap.enqueue_job('perm', '{}')")[0][0]
        sql("SELECT jobcap.fail_job(job_id, fence, 'x') FROM jobcap.claim_job('perm', 't')")
        got = django_json(f"""
            import json
            from django.contrib.auth.models import Permission, User
            from django.test import Client
            from django.test.utils import setup_test_environment
            setup_test_environment()
            out = {{}}
            for name, perms in (('nobody', []), ('viewer', ['view_deadjob']),
                                ('changer', ['view_deadjob', 'change_deadjob'])):
                user = User.objects.create_user(name, password='pw', is_staff=True)
                user.user_permissions.set(Permission.objects.filter(codename__in=perms))
                client = Client()
                client.login(username=name, password='pw')
                page = client.get('/admin/jobcap_admin/deadjob/?queue=perm')
                index = client.get('/admin/')
                post = client.post('/admin/jobcap_admin/deadjob/requeue/',
                                   {{'job': ['{job_id}'], 'reason': name, 'queue': 'perm'}})
                out[name] = dict(page=page.status_code, post=post.status_code,
                                 checkbox='id="select-{job_id}"' in page.content.decode(),
                                 linked='/admin/jobcap_admin/deadjob/' in index.content.decode())
            print(json.dumps(out))
            """)
        self.assertEqual(got["nobody"], {"page": 403, "post": 403, "checkbox": False,
                                         "linked": False})
        self.assertEqual(got["viewer"], {"page": 200, "post": 403, "checkbox": False,
                                         "linked": True})
        self.assertEqual(got["changer"], {"page": 200, "post": 302, "checkbox": True,
                                          "linked": True})
        self.assertEqual(sql("SELECT state::text FROM jobcap.jobs WHERE job_id = %s",
                             (job_id,)), [("pending",)])
        self.assertEqual(sql("SELECT error FROM jobcap.job_errors WHERE job_id = %s"
                             " AND kind = 'requeued'", (job_id,)), [("changer (by changer)",)])


class BrokerQueueTest(unittest.TestCase):
    """The broker makes its queue only where the role may; an existing queue's settings apply,
    and Q_CLUSTER's jobcap options that differ are named once."""

    ENQUEUE = ("from django_q.brokers import get_broker\n"
               "from django_q.tasks import async_task\n"
               "for _ in range(3):\n"
               "    async_task('djq_tasks.ok', 1, broker=get_broker('{queue}'))\n")

    def test_existing_queue_with_other_settings(self):
        sql("SELECT jobcap.create_queue('opts', max_attempts => 7)")
        err = django(self.ENQUEUE.format(queue="opts")).stderr
        self.assertEqual(err.count("jobcap: queue 'opts' exists"), 1, err)
        self.assertIn("jobcap: queue 'opts' exists, and its settings apply, not "
                      "Q_CLUSTER['jobcap']'s max_attempts 5 (the queue's: 7), backoff_base "
                      "0:00:00 (the queue's: 0:00:10), backoff_max 0:00:00 (the queue's: "
                      "1:00:00): jobcap.alter_queue changes the queue's", err)
        self.assertEqual(sql("SELECT count(*) FROM jobcap.jobs WHERE queue = 'opts'"), [(3,)])

    def test_worker_role_leaves_no_error_in_the_server_log(self):
        sql("CREATE ROLE enqueuer LOGIN; GRANT jobcap_worker TO enqueuer;"
            "GRANT ALL ON ALL TABLES IN SCHEMA public TO enqueuer")
        sql("SELECT jobcap.create_queue('granted'); SELECT jobcap.grant_queue('granted', "
            "'enqueuer')")
        with open(os.path.join(server.dir, "log")) as f:
            f.seek(0, os.SEEK_END)
            out = django(self.ENQUEUE.format(queue="granted"),
                         env=dict(ENV, JOBCAP_TEST_USER="enqueuer"))
            log = f.read()
        self.assertEqual(sql("SELECT count(*) FROM jobcap.jobs WHERE queue = 'granted'"),
                         [(3,)])
        self.assertNotIn("ERROR", log)
        self.assertNotIn("exists, and its settings apply", out.stderr)


class UnprivilegedRoleTest(unittest.TestCase):
    """A site whose database role is a worker role, not an operator: the page says what the
    DBA grants; Resubmit refuses (it would otherwise make a job with a fresh budget)."""

    @classmethod
    def setUpClass(cls):
        sql("CREATE ROLE site LOGIN; GRANT jobcap_worker TO site;"
            "GRANT ALL ON ALL TABLES IN SCHEMA public TO site;"
            "GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO site")
        sql("SELECT jobcap.create_queue('django_q_test')"
            " WHERE NOT EXISTS (SELECT FROM jobcap.queues WHERE queue = 'django_q_test')")
        sql("SELECT jobcap.grant_queue('django_q_test', 'site')")
        cls.env = dict(ENV, JOBCAP_TEST_USER="site")

    def test_page_and_resubmit(self):
        got = django_json(ADMIN_CLIENT + textwrap.dedent("""
            from django.utils import timezone
            from django_q.models import Task
            Task.objects.create(id='f' * 32, name='site-task', func='djq_tasks.ok', args=(1,),
                                kwargs={}, started=timezone.now(), stopped=timezone.now(),
                                success=False, result='x')
            page = client.get('/admin/jobcap_admin/deadjob/')
            index = client.get('/admin/')
            print(json.dumps({'status': page.status_code, 'page': page.content.decode(),
                              'index': index.content.decode(),
                              'messages': post_action(['f' * 32])}))
            """), env=self.env)
        self.assertEqual(got["status"], 200)
        self.assertIn("This site's database role, <code>site</code>,", got["page"])
        self.assertIn("GRANT jobcap_operator TO site;", got["page"])
        self.assertIn('href="/admin/jobcap_admin/deadjob/"', got["index"])
        self.assertEqual(len(got["messages"]), 1)
        self.assertIn("site-task: not resubmitted: permission denied", got["messages"][0])
        self.assertIn("needs jobcap_operator's privileges", got["messages"][0])


class MigrationTest(unittest.TestCase):
    """The app's migrations for an application role: the extension made by a DBA, or not."""

    def test_extension_created_by_the_dba(self):
        sql("CREATE ROLE app1 LOGIN")
        sql("CREATE DATABASE app1 OWNER app1")
        sql("CREATE EXTENSION jobcap", dbname="app1")
        env = dict(ENV, JOBCAP_TEST_USER="app1", JOBCAP_TEST_DBNAME="app1")
        out = django(None, env, command=["migrate", "jobcap_admin", "-v", "1"])
        self.assertIn("Applying jobcap_admin.0002_cluster_stat... OK", out.stdout)
        self.assertEqual(sql("SELECT relpersistence, pg_get_userbyid(relowner) FROM pg_class"
                             " WHERE relname = 'jobcap_django_q_stat'", dbname="app1"),
                         [("u", "app1")])

    def test_extension_missing(self):
        sql("CREATE ROLE app2 LOGIN")
        sql("CREATE DATABASE app2 OWNER app2")
        env = dict(ENV, JOBCAP_TEST_USER="app2", JOBCAP_TEST_DBNAME="app2")
        out = django(None, env, check=False, command=["migrate", "jobcap_admin"])
        self.assertNotEqual(out.returncode, 0)
        self.assertIn('CommandError: jobcap is not installed in database "app2", and role '
                      '"app2" may not install it (permission denied to create extension '
                      '"jobcap")', out.stderr)
        self.assertIn("    CREATE EXTENSION jobcap;\n    GRANT jobcap_worker TO app2;",
                      out.stderr)
        self.assertIn("SELECT jobcap.grant_queue('django_q_test', 'app2', create_missing => true);", out.stderr)
        self.assertNotIn("Traceback", out.stderr)
        self.assertEqual(sql("SELECT count(*) FROM pg_extension WHERE extname = 'jobcap'",
                             dbname="app2"), [(0,)])


if __name__ == "__main__":
    unittest.main()
