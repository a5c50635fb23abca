"""A real `celery worker` (prefork) on the jobcap transport.

Success, a failure, self.retry() (counted by jobcap), hard and soft time limits (counted
attempts retried until the cap), a child SIGKILLed on every attempt (dead at exactly its cap,
history: lease expired), eta, priority, warm shutdown (running and prefetched tasks each run
once), payloads Celery did not publish (dead with the reason, the worker runs on), revoke(),
chord_unlock's retries, settings and roles refused at start, inspect/events refused, a NOTIFY
waking an idle worker, a worker killed while holding prefetched messages, and the database
restarting under a running worker.
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
    results = os.path.join(server.dir, "results")
    os.mkdir(results)
    os.environ["JOBCAP_TEST_RESULTS"] = "file://" + results
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

    def __init__(self, concurrency=2, prefetch=1, lease=3, name="w", flags=(
            "--without-gossip", "--without-mingle", "--without-heartbeat"), env=None):
        Worker.all.append(self)
        env = dict(os.environ, JOBCAP_TEST_PREFETCH=str(prefetch), JOBCAP_TEST_LEASE=str(lease),
                   **(env or {}))
        self.log = open(os.path.join(server.dir, f"celery-{name}-{time.time():.0f}.log"), "w+")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "celery_app", "worker", "-P", "prefork",
             "-c", str(concurrency), *flags, "-l", "info", "-n", f"{name}@%h"],
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

    def test_concurrency_key_header(self):
        result = celery_app.ok.apply_async(("keyed",),
                                           headers={"jobcap_concurrency_key": "tenant-42"})
        job_id = self.settled(result)
        self.assertEqual(state(job_id)[0], "succeeded")
        self.assertEqual(sql("SELECT concurrency_key FROM jobcap.jobs WHERE job_id = %s",
                             (job_id,))[0][0], "tenant-42")

    def test_dedupe_window_headers(self):
        headers = {"jobcap_dedupe_key": "report-1", "jobcap_dedupe_window": 600}
        job_id = self.settled(celery_app.ok.apply_async(("once",), headers=headers))
        self.assertEqual(state(job_id)[0], "succeeded")
        # Within the window the key returns the succeeded job: nothing new to run.
        celery_app.ok.apply_async(("twice",), headers=headers)
        self.assertEqual(sql("SELECT job_id FROM jobcap.jobs WHERE dedupe_key = 'report-1'"),
                         [(job_id,)])
        self.assertEqual(sql("SELECT what FROM effects WHERE what IN ('once', 'twice')"),
                         [("once",)])

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

    def test_hard_time_limit_is_a_counted_attempt_retried_until_the_cap(self):
        # Celery kills the pool process at the hard limit, as the postmortem's timeout did: each
        # time counts as an attempt, retried until the cap (as a SIGKILL is), never completed;
        # the history says "time limit" at each attempt.
        job_id = self.settled(celery_app.slow.delay("stuck"), timeout=40)
        self.assertEqual(state(job_id), ("dead", 3, 3))
        rows = history(job_id)
        self.assertEqual([(a, k) for a, k, _ in rows], [(1, "timed_out"), (2, "timed_out"),
                                                        (3, "timed_out")])
        for _, _, error in rows:
            self.assertIn("hard time limit (1 s) exceeded", error)

    def test_soft_time_limit_is_a_counted_attempt_retried_until_the_cap(self):
        job_id = self.settled(celery_app.soft.delay("slowish"), timeout=40)
        self.assertEqual(state(job_id), ("dead", 3, 3))
        rows = history(job_id)
        self.assertEqual([(a, k) for a, k, _ in rows], [(1, "timed_out"), (2, "timed_out"),
                                                        (3, "timed_out")])
        for _, _, error in rows:
            self.assertIn("soft time limit (0.5 s) exceeded", error)

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


def ensure_queue(queue="celery"):
    if not sql("SELECT 1 FROM jobcap.queues WHERE queue = %s", (queue,)):
        # as the transport creates it (celery_app's transport options)
        sql("SELECT jobcap.create_queue(%s, 3, '3 s', '0', '0')", (queue,))


def enqueue(payload, queue="celery"):
    """A job put on a Celery queue by something other than Celery (SQL, a scheduler)."""
    ensure_queue(queue)
    return sql("SELECT jobcap.enqueue_job(%s, %s::jsonb)", (queue, payload))[0][0]


def kombu_message(body, content_type="application/json", headers=None, encoding="base64"):
    """A kombu message as the transport stores it, with a body of our choosing."""
    import base64
    import json
    raw = base64.b64encode(body.encode()).decode() if encoding == "base64" else body
    return json.dumps({"body": raw, "content-type": content_type, "content-encoding": "utf-8",
                       "headers": headers if headers is not None else {
                           "id": "foreign-1", "task": "celery_app.ok", "retries": 0},
                       "properties": {"body_encoding": encoding, "priority": 0,
                                      "delivery_info": {"exchange": "", "routing_key": "celery"}}})


class ForeignPayloadTest(unittest.TestCase):
    """Jobs on a Celery queue that Celery did not publish: each is dead at once with the reason,
    the worker keeps running, and a good task beside them runs."""

    CASES = {
        "empty object": ("{}", "not a kombu message"),
        "plain object": ('{"a": 1}', "not a kombu message"),
        "schedule_job payload": ('{"task": "celery_app.ok", "args": ["scheduled"]}',
                                 "not a kombu message"),
        "array": ("[1, 2]", "a JSON array"),
        "string": ('"text"', "a JSON string"),
        "number": ("42", "a JSON number"),
        "null": ("null", "JSON null"),
        "body not a string": ('{"body": 5, "content-type": "application/json",'
                              ' "content-encoding": "utf-8", "headers": {}, "properties": {}}',
                              "body"),
        "headers not an object": ('{"body": "", "content-type": "application/json",'
                                  ' "content-encoding": "utf-8", "headers": [1],'
                                  ' "properties": {}}', "headers"),
        "bad base64": (kombu_message("", encoding="base64").replace('"body": ""',
                                                                     '"body": "%%%"'),
                       "base64"),
        "body not JSON": (kombu_message("not json"), "does not decode"),
        "no task name": (kombu_message('[["x"], {}, {}]', headers={"id": "foreign-2"}),
                         "no task name"),
        "pickle not accepted": (kombu_message("x", content_type="application/x-python-serialize"),
                                "accept_content"),
    }

    def test_foreign_payloads_are_dead_with_the_reason_and_the_worker_runs_on(self):
        job_ids = {name: enqueue(payload) for name, (payload, _) in self.CASES.items()}
        good = celery_app.ok.delay("beside the foreign ones")
        worker = Worker(concurrency=2, name="foreign")
        try:
            good_id = wait_for(lambda: job_of(good.id))
            wait_for(lambda: all(state(j)[0] in ("dead", "succeeded")
                                 for j in list(job_ids.values()) + [good_id]), timeout=30,
                     what="every job settled")
            for name, job_id in job_ids.items():
                with self.subTest(name):
                    self.assertEqual(state(job_id), ("dead", 1, 1))
                    (attempt, kind, error), = history(job_id)
                    self.assertIn("refused by the jobcap transport", error)
                    self.assertIn(self.CASES[name][1], error)
            self.assertEqual(state(good_id), ("succeeded", 1, 3))
            self.assertIsNone(worker.proc.poll(), worker.output()[-3000:])
            self.assertNotIn("Unrecoverable error", worker.output())
        finally:
            worker.stop()


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

    def test_warm_shutdown_with_prefetched_tasks(self):
        # One process, prefetch 4: at SIGTERM one task runs and three wait in the worker. The
        # running one is completed once; the waiting ones either ran before the worker left
        # or are given back uncounted (release_job), for the next worker at once.
        first = self.start(concurrency=1, prefetch=4, lease=30, name="warm-prefetch")
        tasks = [celery_app.marked.delay(f"warmpre{i}", 1.0) for i in range(4)]
        job_ids = [wait_for(lambda t=t: job_of(t.id)) for t in tasks]
        wait_for(lambda: sql("SELECT count(*) FROM jobcap.jobs WHERE job_id = ANY(%s)"
                             " AND state = 'running'", (job_ids,))[0][0] == 4, timeout=30)
        wait_for(lambda: sql("SELECT count(*) FROM effects WHERE job_id = ANY(%s)"
                             " AND what LIKE '%% started'", (job_ids,))[0][0] >= 1, timeout=30)
        first.proc.send_signal(signal.SIGTERM)
        self.assertEqual(first.proc.wait(30), 0, first.output()[-3000:])
        states = {j: state(j) for j in job_ids}
        for job_id, st in states.items():
            self.assertIn(st, (("succeeded", 1, 3), ("pending", 0, 3)), first.output()[-3000:])
        self.start(concurrency=2, prefetch=1, lease=30, name="after-warm-prefetch")
        wait_for(lambda: all(state(j)[0] == "succeeded" for j in job_ids), timeout=20,
                 what="the given-back tasks run at once, not after a 30 s lease")
        for job_id in job_ids:
            self.assertEqual(state(job_id), ("succeeded", 1, 3))
        self.assertEqual(sql("SELECT count(*) FROM effects WHERE job_id = ANY(%s)"
                             " AND what NOT LIKE '%% started'", (job_ids,)), [(4,)])

    def test_a_queue_with_notify_wakes_an_idle_worker_at_once(self):
        ensure_queue("celery")
        sql("SELECT jobcap.alter_queue('celery', notify => true)")
        self.addCleanup(sql, "SELECT jobcap.alter_queue('celery', notify => false)")
        w = self.start(name="notified", env={"JOBCAP_TEST_POLL": "10"})
        wait_for(lambda: "ready." in w.output(), timeout=30)
        time.sleep(1)
        for i in range(3):
            t0 = time.monotonic()
            job_id = wait_for(lambda: job_of(celery_app.ok.delay(f"notified{i}").id))
            wait_for(lambda: state(job_id)[0] == "succeeded", timeout=15)
            # polling every 10 s, the worker took it within 1.5 s of the NOTIFY
            self.assertLess(time.monotonic() - t0, 1.5, w.output()[-2000:])

    def test_revoke_cancels_a_waiting_task(self):
        result = celery_app.ok.apply_async(("revoked while waiting",), countdown=3)
        job_id = wait_for(lambda: job_of(result.id))
        self.start(concurrency=2, name="revoke")
        result.revoke()
        self.assertEqual(state(job_id)[0], "cancelled")
        time.sleep(4)   # past its countdown: nobody runs it
        self.assertEqual(state(job_id), ("cancelled", 0, 3))
        self.assertEqual(sql("SELECT count(*) FROM effects WHERE job_id = %s", (job_id,)),
                         [(0,)])

    def test_revoke_of_a_running_task_refuses_its_fenced_effects(self):
        w = self.start(concurrency=2, name="revoke-running")
        result = celery_app.marked.delay("revoked while running", 2.0)
        job_id = wait_for(lambda: job_of(result.id))
        wait_for(lambda: sql("SELECT count(*) FROM effects WHERE job_id = %s", (job_id,))[0][0],
                 timeout=20)
        result.revoke()
        time.sleep(4)
        self.assertEqual(state(job_id)[0], "cancelled", w.output()[-3000:])
        # only the unfenced "started" row: the effect under assert_fence was refused
        self.assertEqual(sql("SELECT what FROM effects WHERE job_id = %s", (job_id,)),
                         [("revoked while running started",)])
        # the refused completion stopped nothing: the worker runs the next task
        after = wait_for(lambda: job_of(celery_app.ok.delay("after the revoke").id))
        wait_for(lambda: state(after)[0] == "succeeded", timeout=20)
        self.assertIsNone(w.proc.poll())

    def test_revoke_terminate_stops_the_running_task_and_the_worker_goes_on(self):
        # One pool process: the next task can only run once the revoked one was stopped.
        w = self.start(concurrency=1, name="revoke-terminate")
        result = celery_app.marked.delay("terminated while running", 30.0)
        job_id = wait_for(lambda: job_of(result.id))
        wait_for(lambda: sql("SELECT count(*) FROM effects WHERE job_id = %s", (job_id,))[0][0],
                 timeout=20)
        sent = time.monotonic()
        result.revoke(terminate=True)
        wait_for(lambda: result.state == "REVOKED", timeout=5)
        took = time.monotonic() - sent
        self.assertLess(took, 2.0, w.output()[-3000:])
        self.assertIn(f"jobcap: job {job_id} (task {result.id}) ended on the server while it "
                      "ran (cancelled): terminating it", w.output())
        after = wait_for(lambda: job_of(celery_app.ok.delay("after the terminate").id))
        wait_for(lambda: state(after)[0] == "succeeded", timeout=10)
        self.assertIsNone(w.proc.poll())
        # Cancelled, never retried: one attempt, no error history, only the unfenced row.
        time.sleep(1)
        self.assertEqual(state(job_id), ("cancelled", 1, 3))
        self.assertEqual([k for _, k, _ in history(job_id)], ["cancelled"])
        self.assertEqual(sql("SELECT what FROM effects WHERE job_id = %s", (job_id,)),
                         [("terminated while running started",)])

    def test_chord_unlock_retries_do_not_use_up_a_cap(self):
        # celery.chord_unlock retries every second until the chord's header is done: five
        # seconds of header is more retries than the queue's cap of 3.
        from celery import chord
        self.start(concurrency=3, name="chord")
        result = chord([celery_app.sleepy.s(f"header{i}", 5.0) for i in range(2)])(
            celery_app.chord_done.s())
        wait_for(lambda: sql("SELECT count(*) FROM effects WHERE what LIKE 'chord done: %%'"
                             )[0][0] == 1, timeout=40, what="the chord's callback ran")
        unlocks = sql("SELECT state::text, attempts FROM jobcap.jobs"
                      " WHERE payload->'headers'->>'task' = 'celery.chord_unlock'")
        self.assertGreater(len(unlocks), 3, unlocks)
        self.assertEqual({s for s, _ in unlocks}, {"succeeded"})
        self.assertEqual({a for _, a in unlocks}, {1})
        self.assertIsNotNone(result)

    def test_remote_control_and_task_events_are_refused_at_start(self):
        probe = wait_for(lambda: job_of(celery_app.ok.delay("probe").id))
        for why, kw in (("worker_enable_remote_control",
                         {"env": {"JOBCAP_TEST_REMOTE_CONTROL": "1"}}),
                        ("worker_send_task_events", {"flags": ("--without-heartbeat", "-E")}),
                        ("task_acks_late", {"env": {"JOBCAP_TEST_ACKS_EARLY": "1"}})):
            with self.subTest(why):
                w = self.start(name="refused", **kw)
                code = w.proc.wait(30)
                self.assertNotEqual(code, 0)
                self.assertRegex(w.output(), f"{why} must be (False|True)")
                self.assertEqual(state(probe), ("pending", 0, 3))   # it took nothing

    def test_a_worker_role_without_its_grant_is_refused_at_start(self):
        sql("DO $$BEGIN CREATE ROLE celery_worker LOGIN IN ROLE jobcap_worker;"
            " EXCEPTION WHEN duplicate_object THEN NULL; END$$")
        sql("GRANT INSERT ON effects TO celery_worker")   # what the task writes
        probe = wait_for(lambda: job_of(celery_app.ok.delay("waits for a grant").id))
        as_role = server.conninfo.replace("user=postgres", "user=celery_worker")
        w = self.start(name="ungranted", env={"JOBCAP_TEST_CONNINFO": as_role})
        self.assertNotEqual(w.proc.wait(30), 0)
        self.assertIn("jobcap.grant_queue('celery', 'celery_worker', create_missing => true)",
                      w.output())
        self.assertEqual(state(probe), ("pending", 0, 3))   # nothing taken, nothing lost
        sql("SELECT jobcap.grant_queue('celery', 'celery_worker')")
        self.start(name="granted", env={"JOBCAP_TEST_CONNINFO": as_role})
        wait_for(lambda: state(probe)[0] == "succeeded", timeout=30)
        self.assertEqual(state(probe), ("succeeded", 1, 3))

    def test_inspect_and_events_monitor_are_refused_with_the_reason(self):
        env = dict(os.environ)
        for args, says in ((["inspect", "ping", "-t", "2"], "remote control"),
                           (["control", "shutdown"], "remote control"),
                           (["events", "--dump"], "events")):
            with self.subTest(args[0]):
                done = subprocess.run([sys.executable, "-m", "celery", "-A", "celery_app", *args],
                                      cwd=HERE, env=env, capture_output=True, text=True,
                                      timeout=60)
                self.assertNotEqual(done.returncode, 0)
                self.assertIn(says, done.stdout + done.stderr)
        self.assertEqual(sql("SELECT queue FROM jobcap.queues WHERE queue LIKE '%%pidbox'"
                             " OR queue LIKE 'celeryev%%'"), [])

    def test_a_default_worker_creates_no_queue_for_its_events(self):
        # Celery's worker heartbeats are events: nobody can receive them here, and they must
        # not fill queues named by their routing keys (worker.heartbeat, worker.online).
        w = self.start(name="heartbeats", flags=())
        job_id = wait_for(lambda: job_of(celery_app.ok.delay("beside heartbeats").id))
        wait_for(lambda: state(job_id)[0] == "succeeded", timeout=20)
        time.sleep(3)
        self.assertEqual(sql("SELECT queue FROM jobcap.queues WHERE queue LIKE 'worker.%%'"), [])
        self.assertIsNone(w.proc.poll())

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
