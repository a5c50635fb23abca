"""A real Django-Q cluster (`manage.py qcluster`) on the jobcap broker.

Success; a failure counted and retried until dead at the cap, never acknowledged as a success,
even with Django-Q's own max_attempts set; a task Django-Q's guard kills on every attempt
(timeout) counted by its lease and dead at the cap; enqueue inside a rolled-back transaction;
the cluster's status seen by other processes (qinfo, Stat.get_all) with CACHES at Django's
default, and gone once the cluster stopped.
"""
import json
import os
import signal
import subprocess
import sys
import unittest

import psycopg

from common import HERE, start_server, wait_for

server = None
ENV = None


def setUpModule():
    global server, ENV
    server = start_server()
    ENV = dict(os.environ,
               PYTHONPATH=os.pathsep.join([os.path.join(HERE, "..", ".."), HERE]),
               DJANGO_SETTINGS_MODULE="djq_settings", JOBCAP_TEST_HOST=server.dir,
               JOBCAP_TEST_PORT=str(server.port), JOBCAP_TEST_Q_CLUSTER="cluster")
    subprocess.run([sys.executable, "-m", "django", "migrate", "-v", "0"], cwd=HERE, env=ENV,
                   check=True)


def tearDownModule():
    if server is not None:
        server.stop()


def sql(query, params=None):
    with psycopg.connect(server.conninfo, autocommit=True) as conn:
        cur = conn.execute(query, params)
        return cur.fetchall() if cur.description else None


def django(code):
    """Runs code in a Django shell of the test settings; returns its stdout."""
    return subprocess.run([sys.executable, "-m", "django", "shell", "-c", code], cwd=HERE,
                          env=ENV, check=True, capture_output=True, text=True).stdout.strip()


def enqueue(func, *args):
    return django("from django_q.tasks import async_task;"
                  f"print(async_task({func!r}, *{args!r}))")


def job_of(task_id):
    rows = sql("SELECT j.job_id, j.state::text, j.attempts,"
               "       coalesce(j.max_attempts, q.max_attempts)"
               "  FROM jobcap.jobs j JOIN jobcap.queues q USING (queue)"
               " WHERE j.queue = 'django_q_test' ORDER BY j.job_id")
    return rows


class DjangoQClusterTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.log = open(os.path.join(server.dir, "qcluster.log"), "w+")
        cls.cluster = subprocess.Popen([sys.executable, "-m", "django", "qcluster"], cwd=HERE,
                                       env=ENV, stdout=cls.log, stderr=subprocess.STDOUT,
                                       start_new_session=True)

    @classmethod
    def tearDownClass(cls):
        cls.cluster.send_signal(signal.SIGTERM)
        try:
            cls.cluster.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(cls.cluster.pid, signal.SIGKILL)
            cls.cluster.wait()
        cls.log.close()
        # Stopped: its status expires (3 s) and no process sees the cluster any more.
        wait_for(lambda: django("import djq_tasks; print(djq_tasks.cluster_stats())") == "[]",
                 timeout=15, what="the stopped cluster's status gone")

    def job(self, job_id):
        return sql("SELECT j.state::text, j.attempts, coalesce(j.max_attempts, q.max_attempts)"
                   "  FROM jobcap.jobs j JOIN jobcap.queues q USING (queue)"
                   " WHERE j.job_id = %s", (job_id,))[0]

    def newest_job(self, func):
        rows = sql("SELECT job_id FROM jobcap.jobs WHERE queue = 'django_q_test'"
                   " ORDER BY job_id DESC LIMIT 1")
        return rows[0][0]

    def wait_state(self, job_id, states, timeout):
        try:
            wait_for(lambda: self.job(job_id)[0] in states, timeout=timeout,
                     what=f"job {job_id} in {states}")
        except AssertionError:
            self.log.seek(0)
            print(self.log.read()[-4000:])
            raise

    def history(self, job_id):
        return sql("SELECT kind, left(error, 60) FROM jobcap.job_errors WHERE job_id = %s"
                   " ORDER BY seq", (job_id,))

    def test_1_success(self):
        enqueue("djq_tasks.ok", 21)
        job_id = self.newest_job("ok")
        self.wait_state(job_id, ("succeeded",), 30)
        self.assertEqual(self.job(job_id), ("succeeded", 1, 3))

    def test_2_failure_retried_to_the_cap_never_a_success(self):
        enqueue("djq_tasks.boom", "scan.pdf")
        job_id = self.newest_job("boom")
        self.wait_state(job_id, ("dead", "succeeded"), 40)
        self.assertEqual(self.job(job_id), ("dead", 3, 3))
        self.assertEqual([k for k, _ in self.history(job_id)], ["error"] * 3)
        self.assertIn("cannot process scan.pdf", self.history(job_id)[0][1])

    def test_3_timeout_counted_by_the_lease(self):
        enqueue("djq_tasks.hang", 60)
        job_id = self.newest_job("hang")
        self.wait_state(job_id, ("dead", "succeeded"), 60)
        self.assertEqual(self.job(job_id), ("dead", 3, 3))
        self.assertEqual([k for k, _ in self.history(job_id)], ["lease_expired"] * 3)

    def test_0_status_seen_by_other_processes(self):
        """What qinfo and qmonitor read, from processes that are not the cluster's: its
        statistics live in PostgreSQL (jobcap_django_q_stat), not in a per-process cache."""
        stats = lambda: json.loads(django(  # noqa: E731
            "import djq_tasks; print(djq_tasks.cluster_stats())"))
        wait_for(lambda: stats() and stats()[0][0] == "Idle", timeout=30,
                 what="the cluster's status, Idle")
        (status, workers, cluster_id), = stats()
        self.assertEqual(workers, 2)
        info = subprocess.run([sys.executable, "-m", "django", "qinfo", "--ids"], cwd=HERE,
                              env=ENV, check=True, capture_output=True, text=True).stdout
        self.assertEqual(info.split(), [str(__import__("uuid").UUID(cluster_id))])
        self.assertEqual(sql("SELECT count(*) FROM jobcap_django_q_stat"
                             " WHERE expires_at > now()")[0][0], 1)

    def test_5_concurrency_key_set_by_pre_enqueue(self):
        django("from django_q.signals import pre_enqueue\n"
               "def keyed(sender, task, **kw):\n"
               "    task['jobcap_concurrency_key'] = 'tenant-7'\n"
               "pre_enqueue.connect(keyed)\n"
               "from django_q.tasks import async_task\n"
               "async_task('djq_tasks.ok', 5)\n")
        job_id = self.newest_job("ok")
        self.assertEqual(sql("SELECT concurrency_key FROM jobcap.jobs WHERE job_id = %s",
                             (job_id,))[0][0], "tenant-7")
        self.wait_state(job_id, ("succeeded",), 30)

    def test_5_dedupe_options_set_by_pre_enqueue(self):
        django("from django_q.signals import pre_enqueue\n"
               "def debounced(sender, task, **kw):\n"
               "    task['jobcap_dedupe_key'] = 'reindex'\n"
               "    task['jobcap_dedupe'] = 'replace'\n"
               "pre_enqueue.connect(debounced)\n"
               "from django.db import transaction\n"
               "from django_q.tasks import async_task\n"
               "with transaction.atomic():\n"
               "    for n in (1, 2, 3):\n"
               "        async_task('djq_tasks.ok', n)\n")
        rows = sql("SELECT job_id FROM jobcap.jobs WHERE dedupe_key = 'reindex'")
        self.assertEqual(len(rows), 1, "three tasks with one key: one job")
        self.wait_state(rows[0][0], ("succeeded",), 30)

    def test_4_enqueue_joins_the_callers_transaction(self):
        before = sql("SELECT count(*) FROM jobcap.jobs")[0][0]
        django("from django.db import transaction\n"
               "from django_q.tasks import async_task\n"
               "try:\n"
               "    with transaction.atomic():\n"
               "        async_task('djq_tasks.ok', 1)\n"
               "        raise RuntimeError('rolled back')\n"
               "except RuntimeError:\n"
               "    pass\n")
        self.assertEqual(sql("SELECT count(*) FROM jobcap.jobs")[0][0], before)


if __name__ == "__main__":
    unittest.main()
