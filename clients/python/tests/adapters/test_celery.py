"""A real `celery worker` (prefork) on the jobcap transport.

Success, a failure, self.retry() (counted by jobcap), a hard time limit, a child SIGKILLed on
every attempt (dead at exactly its cap, history: lease expired), eta, priority, a worker killed
while holding prefetched messages, and the database restarting under a running worker.
"""
import datetime as dt
import os
import signal
import subprocess
import sys
import time
import unittest

import psycopg

from common import HERE, start_server, wait_for

sys.path.insert(0, os.path.join(HERE, "..", ".."))
server = None
celery_app = None


def setUpModule():
    global server, celery_app
    server = start_server()
    server.psql("CREATE TABLE effects (job_id bigint, fence bigint, attempt int, what text,"
                " at timestamptz DEFAULT clock_timestamp())")
    os.environ["JOBCAP_TEST_CONNINFO"] = server.conninfo
    os.environ["PYTHONPATH"] = os.pathsep.join([os.path.join(HERE, "..", ".."), HERE])
    import celery_app as app  # reads JOBCAP_TEST_CONNINFO
    celery_app = app


def tearDownModule():
    if server is not None:
        server.stop()
    for w in Worker.all:
        w.log.close()


def sql(query, params=None):
    with psycopg.connect(server.conninfo, autocommit=True) as conn:
        cur = conn.execute(query, params)
        return cur.fetchall() if cur.description else None


class Worker:
    """`celery -A celery_app worker -P prefork` in its own process group."""

    all = []

    def __init__(self, concurrency=2, prefetch=1, lease=3, name="w"):
        Worker.all.append(self)
        env = dict(os.environ, JOBCAP_TEST_PREFETCH=str(prefetch), JOBCAP_TEST_LEASE=str(lease))
        self.log = open(os.path.join(server.dir, f"celery-{name}-{time.time():.0f}.log"), "w+")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "celery_app", "worker", "-P", "prefork",
             "-c", str(concurrency), "--without-gossip", "--without-mingle",
             "--without-heartbeat", "-l", "info", "-n", f"{name}@%h"],
            cwd=HERE, env=env, stdout=self.log, stderr=subprocess.STDOUT,
            start_new_session=True)

    def kill(self):
        """SIGKILL the worker and its pool children at once: a machine lost."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()

    def stop(self, timeout=20):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)   # any child left behind
        except ProcessLookupError:
            pass

    def output(self):
        self.log.seek(0)
        return self.log.read()


def state(job_id):
    return sql("SELECT j.state::text, j.attempts, coalesce(j.max_attempts, q.max_attempts)"
               "  FROM jobcap.jobs j JOIN jobcap.queues q USING (queue) WHERE j.job_id = %s",
               (job_id,))[0]


def job_of(task_id):
    rows = sql("SELECT job_id FROM jobcap.jobs WHERE payload->'headers'->>'id' = %s", (task_id,))
    return rows[0][0] if rows else None


def history(job_id):
    return sql("SELECT attempt, kind, error FROM jobcap.job_errors WHERE job_id = %s ORDER BY seq",
               (job_id,))


class CeleryWorkerTest(unittest.TestCase):
    """One worker (2 pool processes) serves these; each test waits for its own jobs."""

    @classmethod
    def setUpClass(cls):
        cls.worker = Worker(concurrency=2)

    @classmethod
    def tearDownClass(cls):
        cls.worker.stop()

    def settled(self, result, states=("succeeded", "dead"), timeout=30):
        job_id = wait_for(lambda: job_of(result.id), what="job enqueued")
        try:
            wait_for(lambda: state(job_id)[0] in states, timeout=timeout,
                     what=f"job {job_id} in {states}")
        except AssertionError:
            print(self.worker.output()[-4000:])
            raise
        return job_id

    def test_success(self):
        job_id = self.settled(celery_app.ok.delay("hello"))
        self.assertEqual(state(job_id), ("succeeded", 1, 3))
        self.assertEqual(sql("SELECT what FROM effects WHERE job_id = %s", (job_id,)), [("hello",)])

    def test_failure_is_dead_at_once_with_its_reason(self):
        job_id = self.settled(celery_app.boom.delay("x"))
        # A task that raises is a failure in Celery: never completed as succeeded. With
        # task_acks_on_failure_or_timeout=False Celery rejects it: dead now, the reason kept.
        self.assertEqual(state(job_id), ("dead", 1, 1))
        self.assertEqual(history(job_id), [(1, "error", "ValueError: cannot process x")])

    def test_retry_is_a_counted_failure(self):
        job_id = self.settled(celery_app.flaky.delay("eventually", 3))
        self.assertEqual(state(job_id), ("succeeded", 3, 3))
        self.assertEqual([k for _, k, _ in history(job_id)], ["error", "error"])
        self.assertEqual(sql("SELECT attempt FROM effects WHERE job_id = %s", (job_id,)), [(3,)])

    def test_retry_forever_stops_at_the_cap(self):
        # max_retries=None in Celery: jobcap's cap still ends it, no second budget.
        job_id = self.settled(celery_app.flaky.delay("never", 99))
        self.assertEqual(state(job_id), ("dead", 3, 3))
        self.assertEqual(len(history(job_id)), 3)
        self.assertEqual(sql("SELECT count(*) FROM jobcap.jobs WHERE payload->'headers'->>'task'"
                             " = 'celery_app.flaky' AND job_id <> %s AND state <> 'succeeded'",
                             (job_id,)), [(0,)])

    def test_time_limit_exceeded(self):
        # Celery kills the pool process and reports TimeLimitExceeded, a final failure: dead now,
        # never completed; the history says why.
        job_id = self.settled(celery_app.slow.delay("stuck"), timeout=30)
        self.assertEqual(state(job_id), ("dead", 1, 1))
        self.assertIn("time limit", history(job_id)[-1][2])

    def test_child_sigkilled_every_attempt_dies_at_its_cap(self):
        job_id = self.settled(celery_app.suicide.delay("corrupt.mp4"), timeout=60)
        self.assertEqual(state(job_id), ("dead", 3, 3))
        self.assertEqual([(a, k) for a, k, _ in history(job_id)],
                         [(1, "lease_expired"), (2, "lease_expired"), (3, "lease_expired")])
        self.assertEqual(sql("SELECT count(*) FROM effects WHERE job_id = %s", (job_id,)), [(3,)])
        # and the queue goes quiet: nothing claims it again
        time.sleep(1)
        self.assertEqual(state(job_id), ("dead", 3, 3))

    def test_eta(self):
        eta = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=2)
        result = celery_app.ok.apply_async(("later",), eta=eta)
        job_id = wait_for(lambda: job_of(result.id))
        run_at = sql("SELECT run_at FROM jobcap.jobs WHERE job_id = %s", (job_id,))[0][0]
        self.assertLess(abs((run_at - eta).total_seconds()), 0.01)
        self.assertEqual(state(job_id)[0], "pending")   # nobody holds it while it waits
        self.settled(result)
        at = sql("SELECT at FROM effects WHERE job_id = %s", (job_id,))[0][0]
        self.assertGreaterEqual(at, eta)

    def test_countdown(self):
        result = celery_app.ok.apply_async(("counted down",), countdown=1)
        job_id = wait_for(lambda: job_of(result.id))
        self.assertEqual(sql("SELECT run_at > now() + interval '0.5 s' FROM jobcap.jobs"
                             " WHERE job_id = %s", (job_id,)), [(True,)])
        self.assertEqual(self.settled(result), job_id)

    def test_acks_late_false_is_refused(self):
        job_id = self.settled(celery_app.early_ack.delay("too early"))
        self.assertEqual(state(job_id)[0], "dead")
        self.assertIn("acks_late must be True", history(job_id)[-1][2])
        self.assertEqual(sql("SELECT count(*) FROM effects WHERE job_id = %s", (job_id,)), [(0,)])


class CeleryScenarioTest(unittest.TestCase):
    """Each test runs its own workers on its own jobs (the class above has stopped by then)."""

    def tearDown(self):
        for w in getattr(self, "workers", []):
            w.stop()

    def start(self, **kw):
        w = Worker(**kw)
        self.workers = getattr(self, "workers", []) + [w]
        return w

    def test_priority(self):
        tasks = [celery_app.ok.apply_async((f"p{p}",), priority=p) for p in (0, 9, 3, 6)]
        self.start(concurrency=1, prefetch=1, name="prio")
        job_ids = [wait_for(lambda t=t: job_of(t.id)) for t in tasks]
        wait_for(lambda: all(state(j)[0] == "succeeded" for j in job_ids), timeout=30)
        order = [w for (w,) in sql("SELECT what FROM effects WHERE what LIKE 'p_' ORDER BY at")]
        self.assertEqual(order, ["p9", "p6", "p3", "p0"])

    def test_worker_sigkilled_with_prefetched_messages(self):
        tasks = [celery_app.sleepy.delay(f"pre{i}", 1.0) for i in range(6)]
        job_ids = [wait_for(lambda t=t: job_of(t.id)) for t in tasks]
        first = self.start(concurrency=2, prefetch=2, lease=2, name="doomed")
        # wait until it holds work: running in the pool and prefetched
        wait_for(lambda: sql("SELECT count(*) FROM jobcap.jobs WHERE job_id = ANY(%s)"
                             " AND state = 'running'", (job_ids,))[0][0] >= 3, timeout=20)
        first.kill()
        held = sql("SELECT job_id, fence FROM jobcap.jobs WHERE job_id = ANY(%s)"
                   " AND state = 'running'", (job_ids,))
        self.assertGreaterEqual(len(held), 3)
        self.start(concurrency=2, prefetch=1, lease=2, name="heir")
        wait_for(lambda: all(state(j)[0] == "succeeded" for j in job_ids), timeout=40)
        # nothing lost, each effect committed exactly once and under the fence that completed
        effects = sql("SELECT job_id, count(*), max(fence) FROM effects WHERE job_id = ANY(%s)"
                      " GROUP BY job_id ORDER BY job_id", (job_ids,))
        self.assertEqual([j for j, _, _ in effects], sorted(job_ids))
        self.assertTrue(all(n == 1 for _, n, _ in effects), effects)
        fences = dict(sql("SELECT job_id, fence FROM jobcap.jobs WHERE job_id = ANY(%s)",
                          (job_ids,)))
        self.assertTrue(all(fences[j] == f for j, _, f in effects))
        # the held ones were counted: their first lease lapsed, the reaper recorded it
        for job_id, fence in held:
            self.assertIn("lease_expired", [k for _, k, _ in history(job_id)])
        # an old fence is refused for good
        job_id, fence = held[0]
        with self.assertRaises(psycopg.Error) as caught:
            sql("SELECT jobcap.complete_job(%s, %s)", (job_id, fence))
        self.assertEqual(caught.exception.sqlstate, "JC001")

    def test_warm_shutdown_acks_what_finished(self):
        # SIGTERM while two tasks run: Celery waits for them (warm shutdown); each is
        # completed at attempt 1 and a worker started afterwards runs neither again.
        first = self.start(concurrency=2, prefetch=1, lease=3, name="warm")
        tasks = [celery_app.marked.delay(f"warm{i}", 2.0) for i in range(2)]
        job_ids = [wait_for(lambda t=t: job_of(t.id)) for t in tasks]
        wait_for(lambda: sql("SELECT count(*) FROM effects WHERE job_id = ANY(%s)"
                             " AND what LIKE '%% started'", (job_ids,))[0][0] == 2, timeout=30)
        first.proc.send_signal(signal.SIGTERM)
        self.assertEqual(first.proc.wait(30), 0, first.output()[-3000:])
        for job_id in job_ids:
            self.assertEqual(state(job_id), ("succeeded", 1, 3), first.output()[-3000:])
        self.start(concurrency=2, prefetch=1, lease=3, name="after-warm")
        time.sleep(3 * 2)   # longer than the lease: a lapsed one would have been re-run
        for job_id in job_ids:
            self.assertEqual(state(job_id), ("succeeded", 1, 3))
            self.assertEqual(history(job_id), [])
        self.assertEqual(sql("SELECT count(*) FROM effects WHERE job_id = ANY(%s)", (job_ids,)),
                         [(4,)])

    def test_broker_restart(self):
        w = self.start(concurrency=2, prefetch=1, name="restart")
        before = [celery_app.ok.delay(f"before{i}") for i in range(3)]
        job_ids = [wait_for(lambda t=t: job_of(t.id)) for t in before]
        wait_for(lambda: all(state(j)[0] == "succeeded" for j in job_ids), timeout=30)
        server._run(["pg_ctl", "-D", server.data, "-m", "fast", "-w", "stop"])
        time.sleep(1)
        server._run(["pg_ctl", "-D", server.data, "-l", os.path.join(server.dir, "log"), "-w",
                     "start"])
        after = [celery_app.ok.delay(f"after{i}") for i in range(3)]
        job_ids = [wait_for(lambda t=t: job_of(t.id)) for t in after]
        try:
            wait_for(lambda: all(state(j)[0] == "succeeded" for j in job_ids), timeout=60)
        except AssertionError:
            print(w.output()[-5000:])
            raise
        self.assertIsNone(w.proc.poll())


if __name__ == "__main__":
    unittest.main()
