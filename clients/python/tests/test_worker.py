"""The Python client against a throwaway server: settle, fence, timeouts, wake-ups, signals."""
import datetime as dt
import hashlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import unittest

import psycopg

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import jobcap  # noqa: E402
from pgserver import Server  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
server = None


def setUpModule():
    global server
    logging.getLogger("jobcap").setLevel(logging.ERROR)  # lost connections are on purpose here
    server = Server().start()
    server.psql("CREATE TABLE effects (job_id bigint NOT NULL, fence bigint NOT NULL,"
                " at timestamptz DEFAULT clock_timestamp())")


def tearDownModule():
    if server is not None:
        server.stop()


def connect(**kw):
    return psycopg.connect(server.conninfo, autocommit=True, **kw)


def wait_for(predicate, timeout=10.0, interval=0.02):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s")


class Base(unittest.TestCase):
    queue_options = {}
    isolate = False  # the in-process mode; IsolationTest runs handlers in child processes

    def setUp(self):
        self.conn = connect()
        test = self.id().rsplit(".", 1)[-1]
        self.queue = test[:50] + "_" + hashlib.sha1(self.id().encode()).hexdigest()[:8]
        options = {"max_attempts": 5, "lease": 30, "backoff_base": 0, "backoff_max": 0}
        options.update(self.queue_options)
        jobcap.create_queue(self.conn, self.queue, **options)
        self.outcomes = []
        self.threads = []

    def tearDown(self):
        for worker, thread in self.threads:
            worker.stop()
            thread.join(10)
            self.assertFalse(thread.is_alive(), "worker did not stop")
        self.conn.close()

    def start(self, handler, **kw):
        kw.setdefault("poll_max", 0.2)
        kw.setdefault("exit_on_hang", False)  # never os._exit the test runner
        kw.setdefault("isolate", self.isolate)
        worker = jobcap.Worker(server.conninfo, self.queue, handler,
                               on_settled=lambda job, outcome, error:
                               self.outcomes.append((job.id, outcome, error)), **kw)
        thread = threading.Thread(target=worker.run, kwargs={"handle_signals": False},
                                  daemon=True)
        thread.start()
        self.threads.append((worker, thread))
        return worker

    def enqueue(self, payload=None, **kw):
        return jobcap.enqueue(self.conn, self.queue, payload, **kw)

    def job(self, job_id):
        return self.conn.execute("SELECT state::text, attempts, fence FROM jobcap.jobs"
                                 " WHERE job_id = %s", (job_id,)).fetchone()

    def effects(self, job_id):
        return self.conn.execute("SELECT fence FROM effects WHERE job_id = %s ORDER BY fence",
                                 (job_id,)).fetchall()

    def expire_and_reap(self, job_id):
        self.conn.execute("UPDATE jobcap.jobs SET lease_expires_at = now() - interval '1 second'"
                          " WHERE job_id = %s", (job_id,))
        self.conn.execute("SELECT jobcap.reap_jobs()")


class StaleFenceTest(Base):
    def test_every_fenced_call_maps_jc001_to_stale_fence(self):
        job_id = self.enqueue({"n": 1})
        old = self.conn.execute("SELECT fence FROM jobcap.claim_job(%s, 'w1')",
                                (self.queue,)).fetchone()[0]
        self.expire_and_reap(job_id)
        new = self.conn.execute("SELECT fence FROM jobcap.claim_job(%s, 'w2')",
                                (self.queue,)).fetchone()[0]
        self.assertGreater(new, old)
        for call in (lambda: jobcap.complete(self.conn, job_id, old),
                     lambda: jobcap.fail(self.conn, job_id, old, "late"),
                     lambda: jobcap.heartbeat(self.conn, job_id, old),
                     lambda: jobcap.assert_fence(self.conn, job_id, old)):
            with self.assertRaises(jobcap.StaleFence) as caught:
                call()
            stale = caught.exception
            self.assertEqual(stale.sqlstate, "JC001")
            self.assertEqual((stale.job_id, stale.fence), (job_id, old))
            self.assertIn("claimed again", stale.detail)
            self.assertIsInstance(stale.__cause__, psycopg.Error)
        # The current fence still works: the stale calls changed nothing.
        self.assertEqual(jobcap.complete(self.conn, job_id, new), "succeeded")

    def test_raw_sql_errors_are_recognised(self):
        job_id = self.enqueue()
        with self.assertRaises(psycopg.Error) as caught:
            self.conn.execute("SELECT jobcap.assert_fence(%s, 99)", (job_id,))
        self.assertTrue(jobcap.is_stale(caught.exception))
        with self.assertRaises(psycopg.Error) as other:
            self.conn.execute("SELECT jobcap.complete_job(-1, 1)")
        self.assertFalse(jobcap.is_stale(other.exception))
        with self.assertRaises(jobcap.StaleFence):
            with jobcap.translate("assert_fence"):
                self.conn.execute("SELECT jobcap.assert_fence(%s, 99)", (job_id,))


class SettleTest(Base):
    def test_effects_commit_with_the_completion(self):
        def handle(job):
            job.execute("INSERT INTO effects (job_id, fence) VALUES (%s, %s)",
                        (job.id, job.fence))

        ids = [self.enqueue({"n": n}) for n in range(7)]
        self.start(handle, batch=3)
        wait_for(lambda: all(self.job(i)[0] == "succeeded" for i in ids))
        for i in ids:
            self.assertEqual(self.effects(i), [(self.job(i)[2],)])
        self.assertEqual(sorted(o[1] for o in self.outcomes), ["succeeded"] * 7)

    def test_failure_keeps_the_error_text_and_stops_at_the_cap(self):
        def handle(job):
            job.execute("INSERT INTO effects (job_id, fence) VALUES (%s, %s)",
                        (job.id, job.fence))
            raise ValueError(f"corrupt input on attempt {job.attempt}")

        job_id = self.enqueue(max_attempts=3)
        self.start(handle)
        wait_for(lambda: self.job(job_id)[0] == "dead")
        self.assertEqual(self.job(job_id)[1], 3)
        self.assertEqual(self.effects(job_id), [], "a failed attempt's writes roll back")
        errors = [r[0] for r in self.conn.execute(
            "SELECT error FROM jobcap.job_errors WHERE job_id = %s ORDER BY seq", (job_id,))]
        self.assertEqual(len(errors), 3)
        self.assertTrue(errors[2].startswith("ValueError: corrupt input on attempt 3"), errors[2])
        self.assertIn("Traceback", errors[2])
        self.assertEqual([o[1] for o in self.outcomes], ["retry", "retry", "dead"])

    def test_a_lost_lease_rolls_back_the_handlers_writes(self):
        def handle(job):
            job.execute("INSERT INTO effects (job_id, fence) VALUES (%s, %s)",
                        (job.id, job.fence))
            if job.attempt == 1:
                with connect() as other:  # the lease runs out while we work
                    other.execute("UPDATE jobcap.jobs SET lease_expires_at = now() - "
                                  "interval '1 second' WHERE job_id = %s", (job.id,))
                    other.execute("SELECT jobcap.reap_jobs()")

        job_id = self.enqueue()
        self.start(handle)
        wait_for(lambda: self.job(job_id)[0] == "succeeded")
        self.assertEqual([o[1] for o in self.outcomes], ["stale", "succeeded"])
        stale = self.outcomes[0][2]
        self.assertIsInstance(stale, jobcap.StaleFence)
        # In-process, the batch's last job completes and claims the next batch in one call.
        self.assertEqual(stale.operation, "complete_and_claim")
        self.assertEqual(self.effects(job_id), [(self.job(job_id)[2],)],
                         "only the current fence's write commits")
        self.assertLess(stale.fence, self.job(job_id)[2])

    def test_assert_fence_in_the_handler(self):
        seen = []

        def handle(job):
            if job.attempt == 1:
                with connect() as other:
                    other.execute("UPDATE jobcap.jobs SET lease_expires_at = now() - "
                                  "interval '1 second' WHERE job_id = %s", (job.id,))
                    other.execute("SELECT jobcap.reap_jobs()")
            try:
                job.assert_fence()
            except jobcap.StaleFence:
                seen.append(job.fence)
                raise
            job.execute("INSERT INTO effects (job_id, fence) VALUES (%s, %s)",
                        (job.id, job.fence))

        job_id = self.enqueue()
        self.start(handle)
        wait_for(lambda: self.job(job_id)[0] == "succeeded")
        self.assertEqual(len(seen), 1)
        self.assertLess(seen[0], self.job(job_id)[2])
        self.assertEqual([o[1] for o in self.outcomes], ["stale", "succeeded"])
        self.assertEqual(self.effects(job_id), [(self.job(job_id)[2],)])


class ControlsTest(Base):
    def claim(self, queue=None, batch=10):
        return self.conn.execute("SELECT count(*) FROM jobcap.claim_job(%s, 'w', %s)",
                                 (queue or self.queue, batch)).fetchone()[0]

    def test_pause_and_resume(self):
        self.enqueue({"n": 1})
        self.assertTrue(jobcap.pause_queue(self.conn, self.queue))
        self.assertFalse(jobcap.pause_queue(self.conn, self.queue))
        self.enqueue({"n": 2})  # enqueue still works
        self.assertEqual(self.claim(), 0)
        self.assertTrue(jobcap.resume_queue(self.conn, self.queue))
        self.assertFalse(jobcap.resume_queue(self.conn, self.queue))
        self.assertEqual(self.claim(), 2)

    def test_max_running_on_create_and_alter(self):
        capped = self.queue[:50] + "_capped"
        jobcap.create_queue(self.conn, capped, max_running=2)
        for n in range(5):
            jobcap.enqueue(self.conn, capped, {"n": n})
        self.assertEqual(self.claim(capped, 5), 2)
        self.assertEqual(self.claim(capped, 5), 0)
        jobcap.set_max_running(self.conn, capped, 3)
        self.assertEqual(self.claim(capped, 5), 1)
        jobcap.set_max_running(self.conn, capped, None)
        self.assertEqual(self.claim(capped, 5), 2)
        self.conn.execute("SELECT jobcap.drop_queue(%s, force => true)", (capped,))

    def queue_row(self, queue):
        return self.conn.execute(
            "SELECT max_attempts, lease, max_running, max_snoozes, max_run_time, rate_limit,"
            " rate_period, max_running_per_key, fairness FROM jobcap.queues WHERE queue = %s",
            (queue,)).fetchone()

    def test_create_and_alter_queue_with_every_setting(self):
        q = self.queue[:50] + "_set"
        jobcap.create_queue(self.conn, q, max_attempts=4, lease=60, max_running=5,
                            max_snoozes=2, max_run_time=90, rate_limit=100,
                            rate_period=dt.timedelta(minutes=1), max_running_per_key=3,
                            fairness="round_robin")
        self.assertEqual(self.queue_row(q), (
            4, dt.timedelta(seconds=60), 5, 2, dt.timedelta(seconds=90), 100,
            dt.timedelta(minutes=1), 3, "round_robin"))
        # Only what is given changes; 0 removes a limit, as in SQL.
        jobcap.alter_queue(self.conn, q, max_running=0, rate_limit=0, fairness="fifo",
                           max_snoozes=7)
        self.assertEqual(self.queue_row(q), (
            4, dt.timedelta(seconds=60), None, 7, dt.timedelta(seconds=90), None,
            dt.timedelta(minutes=1), 3, "fifo"))
        jobcap.alter_queue(self.conn, q)  # nothing given: nothing changes
        self.assertEqual(self.queue_row(q)[3], 7)
        # Bad input is the server's error, with its SQLSTATE.
        with self.assertRaises(psycopg.errors.InvalidParameterValue):
            jobcap.alter_queue(self.conn, q, fairness="lottery")
        self.conn.execute("SELECT jobcap.drop_queue(%s, force => true)", (q,))

    def test_create_queue_defaults_are_the_servers(self):
        q = self.queue[:50] + "_def"
        jobcap.create_queue(self.conn, q)
        self.assertEqual(self.queue_row(q)[2:], (None, 10, None, None, dt.timedelta(seconds=1),
                                                 None, "fifo"))
        self.conn.execute("SELECT jobcap.drop_queue(%s, force => true)", (q,))

    def test_cancel_job(self):
        waiting = self.enqueue()
        self.assertTrue(jobcap.cancel_job(self.conn, waiting))
        self.assertEqual(self.job(waiting)[0], "cancelled")
        self.assertFalse(jobcap.cancel_job(self.conn, waiting))  # finished already

    def test_concurrency_key_on_enqueue(self):
        keyed = self.queue[:50] + "_keyed"
        self.conn.execute("SELECT jobcap.create_queue(%s, max_running_per_key => 1)", (keyed,))
        for key in ("a", "a", "b", None, None):
            jobcap.enqueue(self.conn, keyed, {}, concurrency_key=key)
        keys = [r[0] for r in self.conn.execute(
            "SELECT concurrency_key FROM jobcap.jobs WHERE queue = %s ORDER BY job_id",
            (keyed,))]
        self.assertEqual(keys, ["a", "a", "b", None, None])
        # One of a, the one of b, both without a key.
        self.assertEqual(self.claim(keyed, 5), 4)
        self.assertEqual(self.claim(keyed, 5), 0)
        self.conn.execute("SELECT jobcap.drop_queue(%s, force => true)", (keyed,))

    def test_dedupe_window_and_replace(self):
        first = self.enqueue({"v": 1}, dedupe_key="d", dedupe_window=3600)
        self.assertEqual(self.enqueue({"v": 2}, dedupe_key="d", dedupe="replace"), first)
        self.assertEqual(self.conn.execute("SELECT payload FROM jobcap.jobs WHERE job_id = %s",
                                           (first,)).fetchone()[0], {"v": 2})
        self.conn.execute("SELECT jobcap.complete_job(job_id, fence)"
                          " FROM jobcap.claim_job(%s, 'w')", (self.queue,))
        # Succeeded within the window: the same job; without a window, a new one.
        self.assertEqual(self.enqueue(dedupe_key="d", dedupe_window=dt.timedelta(hours=1)), first)
        self.assertNotEqual(self.enqueue(dedupe_key="d"), first)
        with self.assertRaises(psycopg.errors.InvalidParameterValue):
            self.enqueue(dedupe_window=60)

    def test_complete_keeps_the_output(self):
        job_id = self.enqueue()
        fence = self.conn.execute("SELECT fence FROM jobcap.claim_job(%s, 'w')",
                                  (self.queue,)).fetchone()[0]
        self.assertEqual(jobcap.complete(self.conn, job_id, fence, {"rows": 3}), "succeeded")
        self.assertEqual(self.conn.execute("SELECT output FROM jobcap.jobs WHERE job_id = %s",
                                           (job_id,)).fetchone()[0], {"rows": 3})

    def test_polling_for_cancellations_stops_once_job_result_is_refused(self):
        # Citus refuses job_result (0A000); the stand-in refuses it the same way and counts its
        # calls in a sequence (not rolled back with the refused call).
        self.conn.execute("CREATE SEQUENCE refused_polls")
        self.conn.execute("ALTER FUNCTION jobcap.job_result(bigint) RENAME TO job_result_kept")
        self.addCleanup(execute_apart, "DROP FUNCTION jobcap.job_result(bigint); ALTER FUNCTION"
                        " jobcap.job_result_kept(bigint) RENAME TO job_result;"
                        " DROP SEQUENCE refused_polls")
        self.conn.execute(
            "CREATE FUNCTION jobcap.job_result(job_id bigint, OUT state jobcap.job_state,"
            " OUT attempts integer) LANGUAGE plpgsql AS $$ BEGIN"
            " PERFORM nextval('public.refused_polls'); RAISE EXCEPTION 'job_result is not"
            " routable' USING ERRCODE = 'feature_not_supported'; END $$")
        job_id = self.enqueue()
        self.start(lambda job: time.sleep(1.0), listen=False, cancel_poll=0.05)
        wait_for(lambda: self.outcomes)
        self.assertEqual(self.job(job_id)[:2], ("succeeded", 1))
        # Polled every 0.05 s while the handler ran for 1 s: refused once, then not asked again.
        self.assertEqual(self.conn.execute("SELECT last_value, is_called FROM refused_polls")
                         .fetchone(), (1, True))

    def test_job_result_reads_a_job_without_table_access(self):
        job_id = self.enqueue()
        fence = self.conn.execute("SELECT fence FROM jobcap.claim_job(%s, 'w')",
                                  (self.queue,)).fetchone()[0]
        jobcap.fail(self.conn, job_id, fence, "smtp refused")
        failed = jobcap.job_result(self.conn, job_id)
        self.assertEqual((failed.state, failed.attempts, failed.output, failed.error,
                          failed.finished_at), ("pending", 1, None, "smtp refused", None))
        self.conn.execute("UPDATE jobcap.jobs SET run_at = now() WHERE job_id = %s", (job_id,))
        fence = self.conn.execute("SELECT fence FROM jobcap.claim_job(%s, 'w')",
                                  (self.queue,)).fetchone()[0]
        jobcap.complete(self.conn, job_id, fence, {"sent": True})
        done = jobcap.job_result(self.conn, job_id)
        self.assertEqual((done.state, done.attempts, done.output), ("succeeded", 2, {"sent": True}))
        self.assertIsNotNone(done.finished_at)

    def test_the_handler_sets_the_output(self):
        def handle(job):
            if job.payload["n"]:
                job.output = {"double": job.payload["n"] * 2}

        ids = [self.enqueue({"n": n}) for n in range(3)]
        self.start(handle)
        wait_for(lambda: all(self.job(i)[0] == "succeeded" for i in ids))
        outputs = [self.conn.execute("SELECT output FROM jobcap.jobs WHERE job_id = %s",
                                     (i,)).fetchone()[0] for i in ids]
        self.assertEqual(outputs, [None, {"double": 2}, {"double": 4}])

    def test_schedule_and_unschedule(self):
        name = self.queue + "_tick"
        next_run = jobcap.schedule_job(self.conn, name, "*/5 * * * *", self.queue, {"task": "t"})
        now = self.conn.execute("SELECT now()").fetchone()[0]
        self.assertGreater(next_run, now)
        self.assertEqual(next_run.minute % 5, 0)
        self.assertEqual(self.conn.execute(
            "SELECT cron, payload FROM jobcap.schedules WHERE name = %s", (name,)).fetchone(),
            ("*/5 * * * *", {"task": "t"}))
        with self.assertRaises(psycopg.Error) as bad:
            jobcap.schedule_job(self.conn, name, "every minute", self.queue)
        self.assertEqual(bad.exception.sqlstate, "22023")
        self.assertTrue(jobcap.unschedule_job(self.conn, name))
        self.assertFalse(jobcap.unschedule_job(self.conn, name))


class DeadlineTest(Base):
    def test_the_timeout_interrupts_a_stuck_handler(self):
        def handle(job):
            job.execute("INSERT INTO effects (job_id, fence) VALUES (%s, %s)",
                        (job.id, job.fence))
            if job.attempt == 1:
                while True:
                    time.sleep(0.01)

        job_id = self.enqueue()
        started = time.monotonic()
        self.start(handle, lease=3, timeout=0.5)
        wait_for(lambda: self.job(job_id)[0] == "succeeded")
        self.assertLess(time.monotonic() - started, 2.5, "the retry came before the lease ran out")
        self.assertEqual([o[1] for o in self.outcomes], ["retry", "succeeded"])
        self.assertIsInstance(self.outcomes[0][2], jobcap.JobTimeout)
        error = self.conn.execute("SELECT error FROM jobcap.job_errors WHERE job_id = %s",
                                  (job_id,)).fetchone()[0]
        self.assertIn("timeout", error)
        self.assertEqual(self.effects(job_id), [(self.job(job_id)[2],)])

    def test_heartbeats_carry_long_work_past_the_lease(self):
        def handle(job):
            for _ in range(6):
                time.sleep(0.3)
                job.heartbeat()
            job.execute("INSERT INTO effects (job_id, fence) VALUES (%s, %s)",
                        (job.id, job.fence))

        job_id = self.enqueue()
        self.start(handle, lease=1.0, timeout=0.6)
        reaped = []
        while self.job(job_id)[0] != "succeeded":  # an eager reaper meanwhile
            reaped += self.conn.execute("SELECT job_id FROM jobcap.reap_jobs()").fetchall()
            time.sleep(0.05)
        self.assertEqual(reaped, [])
        self.assertEqual(self.job(job_id)[1], 1)
        self.assertEqual([o[1] for o in self.outcomes], ["succeeded"])

    def test_jobs_waiting_in_a_batch_keep_their_leases(self):
        def handle(job):
            time.sleep(0.5)

        ids = [self.enqueue() for _ in range(4)]
        self.start(handle, batch=4, lease=1.0, timeout=0.7)
        reaped = []
        while not all(self.job(i)[0] == "succeeded" for i in ids):
            reaped += self.conn.execute("SELECT job_id FROM jobcap.reap_jobs()").fetchall()
            time.sleep(0.05)
        self.assertEqual(reaped, [])
        self.assertEqual([self.job(i)[1] for i in ids], [1, 1, 1, 1])

    def test_timeout_must_be_shorter_than_the_lease(self):
        with self.assertRaises(ValueError):
            jobcap.Worker(server.conninfo, self.queue, print, lease=10, timeout=10)
        with self.assertRaises(ValueError):
            jobcap.Worker(server.conninfo, self.queue, print, lease=10, timeout=0)
        self.assertEqual(jobcap.Worker(server.conninfo, self.queue, print, lease=10).timeout, 8)


class WakeUpTest(Base):
    queue_options = {"notify": True}

    def test_notify_wakes_an_idle_worker(self):
        self.start(lambda job: None, poll_min=30, poll_max=30)
        time.sleep(0.5)  # idle, in a 30 s poll
        started = time.monotonic()
        job_id = self.enqueue()
        wait_for(lambda: self.job(job_id)[0] == "succeeded", timeout=5)
        self.assertLess(time.monotonic() - started, 2.0)

    def test_one_notify_per_enqueueing_transaction(self):
        with connect() as listener:
            listener.execute("LISTEN jobcap")
            with self.conn.transaction():
                for _ in range(5):
                    self.enqueue()
            notes = []
            gen = listener.notifies()
            self.conn.execute("NOTIFY jobcap, 'end-marker'")
            for note in gen:
                notes.append(note.payload)
                if note.payload == "end-marker":
                    gen.close()
        self.assertEqual(notes, [self.queue, "end-marker"])


class PollingTest(Base):
    def test_without_notify_polling_finds_the_job_within_one_interval(self):
        self.start(lambda job: None, poll_min=0.05, poll_max=0.4)
        time.sleep(1.5)  # the backoff has grown to poll_max
        started = time.monotonic()
        job_id = self.enqueue()
        wait_for(lambda: self.job(job_id)[0] == "succeeded", timeout=5)
        self.assertLess(time.monotonic() - started, 0.4 + 0.5)

    def test_a_worker_reconnects_after_losing_its_connection(self):
        self.start(lambda job: None, poll_max=0.1)
        first = self.enqueue()
        wait_for(lambda: self.job(first)[0] == "succeeded")
        killed = self.conn.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE application_name LIKE 'jobcap worker%'").fetchone()[0]
        self.assertGreaterEqual(killed, 1)
        second = self.enqueue()
        wait_for(lambda: self.job(second)[0] == "succeeded")


class ConnectionLossTest(Base):
    queue_options = {"lease": 1}

    def test_a_job_whose_connection_dies_goes_back_with_its_lease(self):
        pids = []

        def handle(job):
            if job.attempt == 1:
                pids.append(job.execute("SELECT pg_backend_pid()").fetchone()[0])
                time.sleep(0.4)  # the connection dies meanwhile
            job.execute("INSERT INTO effects (job_id, fence) VALUES (%s, %s)",
                        (job.id, job.fence))

        job_id = self.enqueue()
        self.start(handle, lease=1.0, timeout=0.8)
        wait_for(lambda: pids)
        self.conn.execute("SELECT pg_terminate_backend(%s)", (pids[0],))
        time.sleep(1.2)  # the lease runs out; the reaper takes it back
        self.conn.execute("SELECT jobcap.reap_jobs()")
        wait_for(lambda: self.job(job_id)[0] == "succeeded")
        self.assertEqual([o[1] for o in self.outcomes], ["succeeded"])
        self.assertEqual(self.job(job_id)[1], 2)
        self.assertEqual(self.effects(job_id), [(self.job(job_id)[2],)])


class CancelTest(Base):
    """cancel_job reaches the handler of a worker run in a thread (IsolatedCancelTest: in a pool
    process); ProcessTest does the same with worker processes."""

    def test_a_cancelled_handler_gets_job_cancelled_and_the_worker_goes_on(self):
        seen = []

        def handler(job):
            if job.payload.get("quick"):
                return
            try:
                for _ in range(400):
                    time.sleep(0.05)
            except jobcap.JobCancelled as cancelled:
                seen.append((cancelled.reason, job.cancelled.is_set()))
                raise

        long = self.enqueue({"n": 1})
        self.start(handler, lease=30, timeout=20)
        wait_for(lambda: self.job(long)[0] == "running")
        time.sleep(0.2)
        sent = time.monotonic()
        self.conn.execute("SELECT jobcap.cancel_job(%s)", (long,))
        wait_for(lambda: any(o[0] == long for o in self.outcomes), timeout=5)
        self.assertLess(time.monotonic() - sent, 2.0)
        (job_id, outcome, error), = self.outcomes
        self.assertEqual(outcome, "cancelled")
        self.assertIsInstance(error, jobcap.JobCancelled)
        self.assertEqual(error.reason, "cancelled")
        if not self.isolate:
            self.assertEqual(seen, [("cancelled", True)])
        quick = self.enqueue({"quick": True})
        wait_for(lambda: self.job(quick)[0] == "succeeded", timeout=5)
        self.assertEqual(self.job(long)[0:2], ("cancelled", 1))


    def test_an_attempt_past_max_run_time_stops_its_handler_and_is_retried(self):
        def handler(job):
            if job.attempt >= 2:
                return
            for _ in range(400):
                time.sleep(0.05)

        self.conn.execute("SELECT jobcap.alter_queue(%s, max_run_time => '1 second')",
                          (self.queue,))
        job_id = self.enqueue()
        self.start(handler, lease=30, timeout=20)
        wait_for(lambda: self.job(job_id)[0] == "running")
        time.sleep(1.1)
        # The background worker's pass, run here: it ends the attempt and notifies.
        self.assertEqual(self.conn.execute("SELECT count(*) FROM jobcap.reap_jobs()"
                                           ).fetchone()[0], 1)
        wait_for(lambda: len(self.outcomes) == 2, timeout=5)
        (_, first, error), (_, second, _) = self.outcomes
        self.assertEqual((first, error.reason, second), ("cancelled", "timed_out", "succeeded"))
        self.assertEqual(self.job(job_id)[0:2], ("succeeded", 2))


class IsolatedCancelTest(CancelTest):
    isolate = True


class ProcessTest(Base):
    """Workers as real processes: the main-thread timer, SIGTERM, the hard exit."""

    isolate_env = "0"  # IsolatedProcessTest runs the same tests with ISOLATE=1

    def spawn(self, mode, **env):
        env.setdefault("ISOLATE", self.isolate_env)
        proc = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "worker_script.py"), server.conninfo,
             self.queue, mode], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, **{k: str(v) for k, v in env.items()}})
        self.addCleanup(self.reap_process, proc)  # a failed test leaves no worker behind
        return proc

    @staticmethod
    def reap_process(proc):
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()

    def test_sigterm_finishes_the_job_in_flight_and_claims_no_more(self):
        first, second = self.enqueue(), self.enqueue()
        proc = self.spawn("slow")
        line = ""
        while not line.startswith("started"):
            line = proc.stdout.readline()
            self.assertTrue(line, "the worker exited early")
        self.assertEqual(line.strip(), f"started {first}")
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=10)
        self.assertEqual(proc.returncode, 0, out)
        self.assertIn("exited cleanly", out)
        self.assertEqual(self.job(first)[0:2], ("succeeded", 1), out)
        self.assertEqual(self.job(second)[0:2], ("pending", 0))

    def read_until(self, proc, prefix):
        while True:
            line = proc.stdout.readline()
            self.assertTrue(line, f"the worker exited before printing {prefix!r}")
            if line.startswith(prefix):
                return line.strip()

    def check_cancel_stops_the_handler(self, **env):
        long = self.enqueue({"n": 1})
        proc = self.spawn("cancel", LEASE=30, TIMEOUT=20, **env)
        self.assertEqual(self.read_until(proc, "started"), f"started {long}")
        sent = time.monotonic()
        self.assertTrue(self.conn.execute("SELECT jobcap.cancel_job(%s)", (long,)).fetchone()[0])
        self.assertEqual(self.read_until(proc, "settled"), f"settled {long} cancelled")
        took = time.monotonic() - sent
        self.assertLess(took, 2.0, "the handler was not stopped within 2 s of cancel_job")
        # The worker goes on: it claims and completes the next job.
        quick = self.enqueue({"quick": True})
        self.assertEqual(self.read_until(proc, "settled"), f"settled {quick} succeeded")
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=10)
        self.assertEqual(proc.returncode, 0, out)
        # Cancelled, its one attempt not retried, the handler's write rolled back.
        self.assertEqual(self.job(long)[0:2], ("cancelled", 1))
        self.assertEqual(self.effects(long), [])
        self.assertEqual(self.job(quick)[0:2], ("succeeded", 1))
        kinds = [k for k, in self.conn.execute(
            "SELECT kind FROM jobcap.job_errors WHERE job_id = %s ORDER BY seq",
            (long,))]
        self.assertEqual(kinds.count("cancelled"), 1, kinds)
        self.assertNotIn("error", kinds)
        return took

    def test_cancel_job_stops_the_running_handler(self):
        self.check_cancel_stops_the_handler()

    def test_without_listen_a_cancellation_is_found_by_polling(self):
        # What a worker behind PgBouncer in transaction pooling does (pooling.py).
        self.check_cancel_stops_the_handler(LISTEN=0, CANCEL_POLL=0.3)

    def test_the_main_thread_timer_interrupts_a_sleep(self):
        job_id = self.enqueue(max_attempts=1)
        proc = self.spawn("sleeper", LEASE=3, TIMEOUT=0.5)
        try:
            wait_for(lambda: self.job(job_id)[0] == "dead", timeout=5)
        finally:
            proc.send_signal(signal.SIGTERM)
            out, _ = proc.communicate(timeout=10)
        self.assertEqual(proc.returncode, 0, out)
        self.assertEqual(self.effects(job_id), [])

    def test_a_handler_that_ignores_its_timeout_ends_the_process_before_the_lease(self):
        job_id = self.enqueue()
        proc = self.spawn("hang", LEASE=3, TIMEOUT=1)
        try:
            out, _ = proc.communicate(timeout=10)
        finally:
            proc.kill()
            proc.stdout.close()
        self.assertEqual(proc.returncode, jobcap.HANG_EXIT_STATUS, out)
        self.assertIn("ignored its timeout", out)
        state, attempts, _ = self.job(job_id)
        live = self.conn.execute("SELECT lease_expires_at > now() FROM jobcap.jobs"
                                 " WHERE job_id = %s", (job_id,)).fetchone()[0]
        self.assertEqual((state, attempts, live), ("running", 1, True),
                         "the process died while its lease was still good")


def kinds(conn, job_id):
    return [tuple(r) for r in conn.execute(
        "SELECT kind, attempt, error FROM jobcap.job_errors WHERE job_id = %s ORDER BY seq",
        (job_id,))]


class IsolationTest(Base):
    """Handlers in child processes: a crash costs nothing to the other jobs held."""
    isolate = True
    queue_options = {"max_attempts": 3}

    def test_a_poison_job_that_sigkills_its_process_dies_alone_at_its_cap(self):
        def handle(job):
            if job.payload.get("poison"):
                os.kill(os.getpid(), signal.SIGKILL)
            job.execute("INSERT INTO effects (job_id, fence) VALUES (%s, %s)",
                        (job.id, job.fence))

        batches = []
        for b in range(3):  # batches of 5, one poison job in each, in a different place
            batches.append([self.enqueue({"poison": n == b * 2}) for n in range(5)])
        poison = [ids[b * 2] for b, ids in enumerate(batches)]
        innocent = [i for ids in batches for i in ids if i not in poison]
        self.start(handle, prefetch=4)  # holds up to 5: the batch
        wait_for(lambda: all(self.job(i)[0] in ("succeeded", "dead") for i in poison + innocent),
                 timeout=30)
        for i in poison:
            self.assertEqual(self.job(i)[:2], ("dead", 3))
            self.assertEqual(kinds(self.conn, i),
                             [("crashed", n, "killed by signal 9 (SIGKILL)") for n in (1, 2, 3)])
            self.assertEqual(self.effects(i), [])
        for i in innocent:
            self.assertEqual(self.job(i)[:2], ("succeeded", 1), f"job {i}")
            self.assertEqual(kinds(self.conn, i), [])
            self.assertEqual(self.effects(i), [(self.job(i)[2],)])
        dead = self.conn.execute("SELECT count(*), sum(crashes), sum(errors) FROM jobcap.dead_jobs"
                                 " WHERE queue = %s", (self.queue,)).fetchone()
        self.assertEqual(tuple(dead), (3, 9, 0))
        wait_for(lambda: len([o for o in self.outcomes
                              if isinstance(o[2], jobcap.HandlerCrashed)]) == 9)

    def test_a_segfault_is_a_crash_and_an_exception_an_error(self):
        def handle(job):
            if job.payload["how"] == "segv":
                import ctypes
                ctypes.string_at(0)
            raise ValueError("bad input")

        segv = self.enqueue({"how": "segv"}, max_attempts=1)
        error = self.enqueue({"how": "raise"}, max_attempts=1)
        self.start(handle)
        wait_for(lambda: self.job(segv)[0] == "dead" and self.job(error)[0] == "dead")
        self.assertEqual(kinds(self.conn, segv), [("crashed", 1, "killed by signal 11 (SIGSEGV)")])
        (kind, attempt, text), = kinds(self.conn, error)
        self.assertEqual((kind, attempt), ("error", 1))
        self.assertTrue(text.startswith("ValueError: bad input"), text)

    def test_writes_commit_with_the_completion_and_stale_fences_hold(self):
        def handle(job):
            job.execute("INSERT INTO effects (job_id, fence) VALUES (%s, %s)",
                        (job.id, job.fence))
            if job.attempt == 1:
                with connect() as other:  # the lease runs out while we work
                    other.execute("UPDATE jobcap.jobs SET lease_expires_at = now() - "
                                  "interval '1 second' WHERE job_id = %s", (job.id,))
                    other.execute("SELECT jobcap.reap_jobs()")

        job_id = self.enqueue()
        self.start(handle)
        wait_for(lambda: len(self.outcomes) == 2)
        self.assertEqual([o[1] for o in self.outcomes], ["stale", "succeeded"], self.outcomes)
        self.assertIsInstance(self.outcomes[0][2], jobcap.StaleFence)
        self.assertEqual(self.effects(job_id), [(self.job(job_id)[2],)])

    def test_heartbeats_from_the_child_carry_work_past_the_lease(self):
        def handle(job):
            for _ in range(6):
                time.sleep(0.3)
                job.heartbeat()

        job_id = self.enqueue()
        self.start(handle, lease=1.0, timeout=0.6)
        reaped = []
        while self.job(job_id)[0] != "succeeded":
            # Only this job: an earlier test may leave a job of its own queue to its lease.
            reaped += [r for r in self.conn.execute("SELECT job_id FROM jobcap.reap_jobs()")
                       if r[0] == job_id]
            time.sleep(0.05)
        self.assertEqual(reaped, [])
        wait_for(lambda: self.outcomes)  # the child's report may follow its commit
        self.assertEqual([o[1] for o in self.outcomes], ["succeeded"])

    def test_the_timeout_interrupts_the_handler_and_a_deaf_one_is_killed_in_its_lease(self):
        def handle(job):
            if job.payload["deaf"]:
                while True:
                    try:
                        time.sleep(30)
                    except BaseException:
                        pass
            time.sleep(30)

        polite = self.enqueue({"deaf": False}, max_attempts=1)
        deaf = self.enqueue({"deaf": True}, max_attempts=1)
        started = time.monotonic()
        self.start(handle, lease=3, timeout=0.5, concurrency=2)
        wait_for(lambda: self.job(polite)[0] == "dead" and self.job(deaf)[0] == "dead")
        self.assertLess(time.monotonic() - started, 3, "both ended before the lease ran out")
        self.assertEqual(kinds(self.conn, polite)[0][:2], ("error", 1))
        self.assertIn("JobTimeout", kinds(self.conn, polite)[0][2])
        self.assertEqual(kinds(self.conn, deaf),
                         [("crashed", 1, "killed by signal 9 (SIGKILL): the handler ignored "
                           "its 0.5s timeout")])

    def test_it_holds_no_more_than_concurrency_plus_prefetch(self):
        def handle(job):
            time.sleep(0.2)

        ids = [self.enqueue() for _ in range(8)]
        self.start(handle, concurrency=2, prefetch=1)
        most = 0
        while not all(self.job(i)[0] == "succeeded" for i in ids):
            held = self.conn.execute("SELECT count(*) FROM jobcap.jobs WHERE queue = %s"
                                     " AND state = 'running'", (self.queue,)).fetchone()[0]
            most = max(most, held)
            time.sleep(0.02)
        self.assertLessEqual(most, 3)
        self.assertGreaterEqual(most, 2, "two handlers ran at once")
        self.assertEqual([self.job(i)[1] for i in ids], [1] * 8)

    def test_a_stopped_worker_releases_what_it_did_not_start(self):
        started = threading.Event()

        def handle(job):
            started.set()
            time.sleep(0.5)

        ids = [self.enqueue() for _ in range(5)]
        worker = self.start(handle, prefetch=4)
        wait_for(lambda: self.conn.execute(
            "SELECT count(*) = 5 FROM jobcap.jobs WHERE queue = %s AND state = 'running'",
            (self.queue,)).fetchone()[0])
        time.sleep(0.1)
        worker.stop()
        worker_thread = self.threads[-1][1]
        worker_thread.join(10)
        states = [self.job(i)[:2] for i in ids]
        self.assertEqual(states[0], ("succeeded", 1))
        self.assertEqual(states[1:], [("pending", 0)] * 4)
        for i in ids[1:]:
            self.assertEqual([k[:2] for k in kinds(self.conn, i)], [("released", 1)])
        self.assertEqual(sorted(o[1] for o in self.outcomes), ["released"] * 4 + ["succeeded"])


def execute_apart(statements):
    """Runs statements on a connection of their own (a cleanup runs after tearDown closed ours)."""
    with connect() as other:
        other.execute(statements)


def expire_in_another_session(job_id):
    """What a frozen worker's job goes through: its lease runs out and the reaper takes it back."""
    with connect() as other:
        other.execute("UPDATE jobcap.jobs SET lease_expires_at = now() - interval '1 second'"
                      " WHERE job_id = %s", (job_id,))
        other.execute("SELECT jobcap.reap_jobs()")


class BatchSettleTest(Base):
    """Jobs whose transaction stayed empty are completed together, each under its own fence."""

    def finished_at(self, ids):
        return self.conn.execute("SELECT count(DISTINCT finished_at) FROM jobcap.jobs"
                                 " WHERE job_id = ANY(%s)", (ids,)).fetchone()[0]

    def test_jobs_that_wrote_nothing_are_completed_in_one_statement(self):
        ids = [self.enqueue({"n": n}) for n in range(5)]
        self.start(lambda job: None, batch=5)
        wait_for(lambda: len(self.outcomes) == 5)
        self.assertEqual([self.job(i)[:2] for i in ids], [("succeeded", 1)] * 5)
        # complete_jobs stamps its whole batch with one finished_at; separate completions differ.
        self.assertEqual(self.finished_at(ids), 1)
        self.assertEqual(sorted(o[1] for o in self.outcomes), ["succeeded"] * 5)

    def test_the_output_of_a_job_completed_in_a_batch_is_kept(self):
        def handle(job):
            job.output = {"n": job.payload["n"]} if job.payload["n"] % 2 else None

        ids = [self.enqueue({"n": n}) for n in range(4)]
        self.start(handle, batch=4)
        wait_for(lambda: len(self.outcomes) == 4)
        self.assertEqual(self.finished_at(ids), 1)
        outputs = [self.conn.execute("SELECT output FROM jobcap.jobs WHERE job_id = %s",
                                     (i,)).fetchone()[0] for i in ids]
        self.assertEqual(outputs, [None, {"n": 1}, None, {"n": 3}])

    def test_one_stale_fence_in_a_batch_costs_only_its_job(self):
        ids = [self.enqueue({"n": n}) for n in range(5)]
        stale_id = ids[2]

        def handle(job):
            if job.id == stale_id and job.attempt == 1:
                expire_in_another_session(job.id)  # its lease is gone before the batch settles

        with self.assertLogs("jobcap", logging.INFO) as logs:
            self.start(handle, batch=5, settle_window=5)  # the batch waits for its slowest
            wait_for(lambda: self.job(stale_id)[0] == "succeeded" and len(self.outcomes) == 6)
        # The batch was tried and refused as a whole (complete_jobs is all or nothing) ...
        tried = [m for m in logs.output if "completing 5 jobs together failed" in m]
        self.assertEqual(len(tried), 1, logs.output)
        # ... then each job was completed on its own: the stale one alone lost its attempt.
        for i in ids:
            self.assertEqual(self.job(i)[:2], ("succeeded", 2 if i == stale_id else 1))
        stale = [o for o in self.outcomes if o[1] == "stale"]
        self.assertEqual([o[0] for o in stale], [stale_id])
        self.assertIsInstance(stale[0][2], jobcap.StaleFence)
        self.assertEqual(stale[0][2].operation, "complete_job")
        self.assertEqual(sorted(o[0] for o in self.outcomes if o[1] == "succeeded"), ids)
        self.assertEqual(kinds(self.conn, stale_id)[0][0], "lease_expired")

    def test_once_complete_jobs_is_refused_each_job_is_completed_alone_without_retrying_it(self):
        # Citus refuses a call it cannot route to one shard with 0A000; the stand-in refuses the
        # same way and counts its calls in a sequence (not rolled back with the refused call).
        self.conn.execute("CREATE SEQUENCE refused_calls")
        self.conn.execute("ALTER FUNCTION jobcap.complete_jobs(bigint[], bigint[], jsonb[])"
                          " RENAME TO complete_jobs_kept")
        self.addCleanup(execute_apart, "DROP FUNCTION jobcap.complete_jobs(bigint[], bigint[],"
                        " jsonb[]); ALTER FUNCTION jobcap.complete_jobs_kept(bigint[], bigint[],"
                        " jsonb[]) RENAME TO complete_jobs; DROP SEQUENCE refused_calls")
        self.conn.execute(
            "CREATE FUNCTION jobcap.complete_jobs(job_ids bigint[], fences bigint[],"
            " outputs jsonb[] DEFAULT NULL) RETURNS integer LANGUAGE plpgsql AS $$ BEGIN"
            " PERFORM nextval('public.refused_calls'); RAISE EXCEPTION 'complete_jobs is not"
            " routable' USING ERRCODE = 'feature_not_supported'; END $$")
        ids = [self.enqueue({"n": n}) for n in range(15)]
        with self.assertLogs("jobcap", logging.INFO) as logs:
            self.start(lambda job: None, batch=5)
            wait_for(lambda: len(self.outcomes) == 15)
        self.assertEqual([self.job(i)[:2] for i in ids], [("succeeded", 1)] * 15)
        self.assertEqual(sorted(o[1] for o in self.outcomes), ["succeeded"] * 15)
        # Three batches of five; complete_jobs was tried for the first only.
        self.assertEqual(self.conn.execute("SELECT last_value, is_called FROM refused_calls")
                         .fetchone(), (1, True))
        refused = [m for m in logs.output if "complete_jobs is refused here" in m]
        self.assertEqual(len(refused), 1, logs.output)

    def test_complete_jobs_is_all_or_nothing(self):
        ids = [self.enqueue({"n": n}) for n in range(3)]
        rows = self.conn.execute("SELECT job_id, fence FROM jobcap.claim_job(%s, 'w', 3)",
                                 (self.queue,)).fetchall()
        fences = dict(rows)
        self.expire_and_reap(ids[1])
        with self.assertRaises(jobcap.StaleFence):
            jobcap.complete_jobs(self.conn, ids, [fences[i] for i in ids])
        self.assertEqual([self.job(i)[0] for i in ids], ["running", "pending", "running"])
        self.assertEqual(jobcap.complete_jobs(self.conn, [ids[0], ids[2]],
                                              [fences[ids[0]], fences[ids[2]]],
                                              [{"ok": True}, None]), 2)
        self.assertEqual([self.job(i)[0] for i in ids], ["succeeded", "pending", "succeeded"])

    def test_complete_and_claim_completes_and_claims_in_one_call(self):
        first, second = self.enqueue(), self.enqueue()
        (job_id, fence), = self.conn.execute("SELECT job_id, fence FROM jobcap.claim_job(%s, 'w')",
                                             (self.queue,)).fetchall()
        self.assertEqual(job_id, first)
        rows = jobcap.complete_and_claim(self.conn, first, fence, self.queue, "w", output=[1])
        self.assertEqual([r[0] for r in rows], [second])
        self.assertEqual(self.job(first)[0], "succeeded")
        with self.assertRaises(jobcap.StaleFence):
            jobcap.complete_and_claim(self.conn, first, fence, self.queue, "w")


class PoolTest(Base):
    """The isolated mode's pool: long-lived processes, replaced when one dies."""
    isolate = True
    queue_options = {"max_attempts": 3}

    def pids(self, ids):
        return [self.conn.execute("SELECT output FROM jobcap.jobs WHERE job_id = %s",
                                  (i,)).fetchone()[0]["pid"] for i in ids]

    def test_a_handler_that_sigkills_its_process_costs_only_its_job(self):
        def handle(job):
            if job.payload.get("kill"):
                os.kill(os.getpid(), signal.SIGKILL)
            if job.payload["n"] % 2:  # half write in their transaction, half are batched
                job.execute("INSERT INTO effects (job_id, fence) VALUES (%s, %s)",
                            (job.id, job.fence))
            job.output = {"pid": os.getpid()}

        before = [self.enqueue({"n": n}) for n in range(10)]
        killer = self.enqueue({"n": 10, "kill": True}, max_attempts=1)
        after = [self.enqueue({"n": n}) for n in range(11, 21)]
        worker = self.start(handle, concurrency=2, prefetch=2)
        wait_for(lambda: len(self.outcomes) == 21, timeout=30)
        self.assertEqual(self.job(killer)[:2], ("dead", 1))
        self.assertEqual(kinds(self.conn, killer), [("crashed", 1, "killed by signal 9 (SIGKILL)")])
        (crash,) = [o for o in self.outcomes if o[0] == killer]
        self.assertEqual(crash[1], "dead")
        self.assertIsInstance(crash[2], jobcap.HandlerCrashed)
        for i in before + after:
            self.assertEqual(self.job(i)[:2], ("succeeded", 1), f"job {i}")
            self.assertEqual(kinds(self.conn, i), [])
        self.assertEqual(sorted(o[0] for o in self.outcomes if o[1] == "succeeded"),
                         before + after)
        pids = set(self.pids(before + after))
        self.assertNotIn(os.getpid(), pids, "handlers ran in pool processes")
        self.assertLessEqual(len(pids), 3, "two processes, one replacement, reused job to job")
        # The pool is whole again: two live processes, the killed one not among them.
        wait_for(lambda: len(worker._procs) == 2)
        live = set(worker._procs)
        self.assertEqual(len(live), 2)
        for pid in live:
            os.kill(pid, 0)  # alive
        more = [self.enqueue({"n": n}) for n in range(21, 25)]
        wait_for(lambda: all(self.job(i)[0] == "succeeded" for i in more))
        self.assertLessEqual(set(self.pids(more)), live)

    def test_a_handler_that_exits_is_a_crash_and_the_pool_goes_on(self):
        def handle(job):
            if job.payload.get("exit"):
                os._exit(3)
            job.output = {"pid": os.getpid()}

        quitter = self.enqueue({"exit": True}, max_attempts=2)
        others = [self.enqueue() for _ in range(4)]
        self.start(handle)  # one pool process
        wait_for(lambda: self.job(quitter)[0] == "dead"
                 and all(self.job(i)[0] == "succeeded" for i in others))
        self.assertEqual(kinds(self.conn, quitter),
                         [("crashed", n, "exited with status 3 without settling the job")
                          for n in (1, 2)])
        self.assertEqual([self.job(i)[1] for i in others], [1] * 4)

    def test_a_connection_the_server_ended_between_jobs_costs_no_job(self):
        def handle(job):
            job.execute("INSERT INTO effects (job_id, fence) VALUES (%s, %s)",
                        (job.id, job.fence))

        first = self.enqueue()
        self.start(handle, concurrency=2)
        wait_for(lambda: self.job(first)[0] == "succeeded")
        ended = self.conn.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE application_name LIKE 'jobcap job %%'").fetchone()[0]
        self.assertGreaterEqual(ended, 1)
        time.sleep(0.2)
        ids = [self.enqueue() for _ in range(4)]
        wait_for(lambda: all(self.job(i)[0] == "succeeded" for i in ids))
        self.assertEqual([self.job(i)[1] for i in ids], [1] * 4)
        for i in ids:
            self.assertEqual(kinds(self.conn, i), [])
            self.assertEqual(self.effects(i), [(self.job(i)[2],)])

    def test_one_stale_fence_among_jobs_settled_by_the_supervisor_costs_only_its_job(self):
        ids = [self.enqueue({"n": n}) for n in range(6)]
        stale_id = ids[3]

        def handle(job):
            if job.id == stale_id and job.attempt == 1:
                expire_in_another_session(job.id)

        self.start(handle, concurrency=3, prefetch=3)
        wait_for(lambda: self.job(stale_id)[0] == "succeeded" and len(self.outcomes) == 7)
        for i in ids:
            self.assertEqual(self.job(i)[:2], ("succeeded", 2 if i == stale_id else 1))
        self.assertEqual([o[0] for o in self.outcomes if o[1] == "stale"], [stale_id])
        self.assertEqual(sorted(o[0] for o in self.outcomes if o[1] == "succeeded"), ids)


class IsolatedProcessTest(ProcessTest):
    isolate_env = "1"

    def test_sigterm_during_a_batch_releases_the_unstarted_jobs(self):
        ids = [self.enqueue() for _ in range(5)]
        proc = self.spawn("slow", PREFETCH=4)
        line = ""
        while not line.startswith("started"):
            line = proc.stdout.readline()
            self.assertTrue(line, "the worker exited early")
        self.assertEqual(line.strip(), f"started {ids[0]}")
        held = self.conn.execute("SELECT count(*) FROM jobcap.jobs WHERE queue = %s"
                                 " AND state = 'running'", (self.queue,)).fetchone()[0]
        self.assertEqual(held, 5, "the batch was held")
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=10)
        self.assertEqual(proc.returncode, 0, out)
        self.assertIn("exited cleanly", out)
        self.assertEqual(self.job(ids[0])[:2], ("succeeded", 1), out)
        self.assertEqual([self.job(i)[:2] for i in ids[1:]], [("pending", 0)] * 4)
        self.assertEqual(self.effects(ids[0]), [(self.job(ids[0])[2],)])

    def test_a_killed_supervisor_loses_no_job_it_had_yet_to_complete(self):
        ids = [self.enqueue() for _ in range(300)]
        proc = self.spawn("light", LEASE=2, TIMEOUT=1, CONCURRENCY=4, PREFETCH=4)
        wait_for(lambda: self.conn.execute(
            "SELECT count(*) >= 60 FROM jobcap.jobs WHERE queue = %s AND state = 'succeeded'",
            (self.queue,)).fetchone()[0], timeout=20)
        proc.kill()  # SIGKILL: finished jobs not completed yet die with it, and its pool
        proc.wait()
        succeeded_before = self.conn.execute(
            "SELECT count(*) FROM jobcap.jobs WHERE queue = %s AND state = 'succeeded'",
            (self.queue,)).fetchone()[0]
        self.assertLess(succeeded_before, len(ids), "killed mid-run")
        time.sleep(2.2)  # the leases it held run out
        self.conn.execute("SELECT jobcap.reap_jobs()")
        again = self.spawn("light", LEASE=2, TIMEOUT=1, CONCURRENCY=4, PREFETCH=4)
        try:
            wait_for(lambda: all(self.job(i)[0] == "succeeded" for i in ids), timeout=30)
        finally:
            again.send_signal(signal.SIGTERM)
            out, _ = again.communicate(timeout=10)
        self.assertEqual(again.returncode, 0, out)
        attempts = self.conn.execute("SELECT attempts, count(*) FROM jobcap.jobs WHERE queue = %s"
                                     " GROUP BY 1 ORDER BY 1", (self.queue,)).fetchall()
        self.assertEqual(sum(n for _, n in attempts), len(ids))
        self.assertLessEqual(max(a for a, _ in attempts), 2, attempts)
        # What the killed worker held came back by its lease, counted: at least once, not lost.
        retried = self.conn.execute(
            "SELECT count(DISTINCT job_id) FROM jobcap.job_errors e JOIN jobcap.jobs j"
            " USING (job_id) WHERE j.queue = %s AND e.kind = 'lease_expired'",
            (self.queue,)).fetchone()[0]
        self.assertGreater(retried, 0)
        self.assertEqual(dict(attempts).get(2, 0), retried)

    def test_a_handler_that_ignores_its_timeout_ends_the_process_before_the_lease(self):
        job_id = self.enqueue(max_attempts=1)
        proc = self.spawn("hang", LEASE=3, TIMEOUT=1)
        try:
            wait_for(lambda: self.job(job_id)[0] == "dead", timeout=5)
            live = self.conn.execute("SELECT finished_at < claimed_at + interval '3 seconds'"
                                     " FROM jobcap.jobs WHERE job_id = %s", (job_id,)).fetchone()[0]
            self.assertTrue(live, "the pool process was ended before the lease ran out")
            self.assertEqual(proc.poll(), None, "the supervisor lives on")
        finally:
            proc.send_signal(signal.SIGTERM)
            out, _ = proc.communicate(timeout=10)
        self.assertEqual(proc.returncode, 0, out)
        self.assertIn("ignored its timeout", out)
        self.assertEqual(self.effects(job_id), [])


if __name__ == "__main__":
    unittest.main()
