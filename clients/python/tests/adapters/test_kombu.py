"""kombu-level tests of the jobcap transport: publish, get, ack, reject with and without requeue,
requeue, recover/restore, heartbeats, priority, eta, size and purge."""
import datetime as dt
import logging
import time
import unittest

import psycopg

from common import start_server, wait_for

import jobcap.contrib.kombu  # noqa: F401  (registers jobcap://)
from kombu import Connection

server = None


def setUpModule():
    global server
    logging.getLogger("jobcap.kombu").setLevel(logging.ERROR)
    server = start_server()


def tearDownModule():
    if server is not None:
        server.stop()


def sql(query, params=None):
    with psycopg.connect(server.conninfo, autocommit=True) as conn:
        cur = conn.execute(query, params)
        return cur.fetchall() if cur.description else None


def job(job_id):
    return sql("SELECT j.state::text, j.attempts, coalesce(j.max_attempts, q.max_attempts)"
               "  FROM jobcap.jobs j JOIN jobcap.queues q USING (queue) WHERE j.job_id = %s",
               (job_id,))[0]


def kinds(job_id):
    return [(a, k, e) for a, k, e in sql(
        "SELECT attempt, kind, error FROM jobcap.job_errors WHERE job_id = %s ORDER BY seq",
        (job_id,))]


class KombuTest(unittest.TestCase):
    lease = 1.5

    def setUp(self):
        self.queue_name = self.id().rsplit(".", 1)[-1][:60]
        self.conn = Connection("jobcap://", transport_options={
            "conninfo": server.conninfo, "visibility_timeout": self.lease, "max_attempts": 3,
            "backoff_base": 0, "backoff_max": 0, "polling_interval": 0.05})
        self.queue = self.conn.SimpleQueue(self.queue_name)

    def tearDown(self):
        self.queue.close()
        self.conn.release()

    def put_get(self, body=None, **kw):
        self.queue.put(body or {"n": 1}, **kw)
        return self.queue.get(timeout=5)

    def test_publish_and_ack_completes(self):
        m = self.put_get({"hello": "world"})
        self.assertEqual(m.payload, {"hello": "world"})
        self.assertEqual(m.headers["jobcap_attempt"], 1)
        self.assertEqual(job(m.headers["jobcap_job_id"]), ("running", 1, 3))
        m.ack()
        self.assertEqual(job(m.headers["jobcap_job_id"]), ("succeeded", 1, 3))

    def test_claim_is_committed_before_delivery(self):
        m = self.put_get()
        # another session sees the claim (state, counted attempt, fence) at once
        row = sql("SELECT state::text, attempts, fence FROM jobcap.jobs WHERE job_id = %s",
                  (m.headers["jobcap_job_id"],))
        self.assertEqual(row, [("running", 1, m.headers["jobcap_fence"])])
        m.ack()

    def test_reject_without_requeue_is_dead_now(self):
        m = self.put_get()
        m.reject(requeue=False)
        job_id = m.headers["jobcap_job_id"]
        self.assertEqual(job(job_id), ("dead", 1, 1))
        self.assertEqual([(a, k) for a, k, _ in kinds(job_id)], [(1, "error")])
        self.assertTrue(kinds(job_id)[0][2].startswith("rejected without requeue"))
        with self.assertRaises(self.queue.Empty):
            self.queue.get(timeout=0.5)

    def test_reject_with_requeue_counts_and_lapses(self):
        m = self.put_get()
        job_id = m.headers["jobcap_job_id"]
        m.reject(requeue=True)
        # nothing re-published: still one job, still running until its lease lapses
        self.assertEqual(sql("SELECT count(*) FROM jobcap.jobs WHERE queue = %s",
                             (self.queue_name,)), [(1,)])
        m2 = self.queue.get(timeout=10)
        self.assertEqual(m2.headers["jobcap_job_id"], job_id)
        self.assertEqual(m2.headers["jobcap_attempt"], 2)
        self.assertTrue(m2.delivery_info.get("redelivered") or m2._raw.get("redelivered"))
        self.assertEqual(kinds(job_id), [(1, "lease_expired", kinds(job_id)[0][2])])
        m2.ack()
        self.assertEqual(job(job_id), ("succeeded", 2, 3))

    def test_requeue_every_time_dies_at_the_cap(self):
        self.queue.put({"poison": True})
        for attempt in (1, 2, 3):
            m = self.queue.get(timeout=10)
            self.assertEqual(m.headers["jobcap_attempt"], attempt)
            m.requeue()
        job_id = m.headers["jobcap_job_id"]
        wait_for(lambda: job(job_id)[0] == "dead", timeout=10)
        self.assertEqual(job(job_id), ("dead", 3, 3))
        self.assertEqual([k for _, k, _ in kinds(job_id)], ["lease_expired"] * 3)
        with self.assertRaises(self.queue.Empty):
            self.queue.get(timeout=0.5)

    def test_restore_unacked_republishes_nothing(self):
        for i in range(3):
            self.queue.put({"i": i})
        got = [self.queue.get(timeout=5) for _ in range(3)]
        channel = got[0].channel
        self.assertEqual(channel.qos.restore_unacked(), [])
        self.assertEqual(sql("SELECT count(*) FROM jobcap.jobs WHERE queue = %s",
                             (self.queue_name,)), [(3,)])
        # their leases lapse (no heartbeats any more) and they come back counted
        again = [self.queue.get(timeout=10) for _ in range(3)]
        self.assertEqual(sorted(m.headers["jobcap_attempt"] for m in again), [2, 2, 2])
        for m in again:
            m.ack()
        # a late ack of the first delivery is refused by the fence, never a second success
        got[0].channel.basic_ack(got[0].delivery_tag)
        self.assertEqual(job(got[0].headers["jobcap_job_id"])[0], "succeeded")

    def test_recover_is_restore(self):
        m = self.put_get()
        m.channel.basic_recover(requeue=True)
        self.assertEqual(sql("SELECT count(*) FROM jobcap.jobs WHERE queue = %s",
                             (self.queue_name,)), [(1,)])

    def test_heartbeat_keeps_an_unacked_message(self):
        m = self.put_get()
        job_id = m.headers["jobcap_job_id"]
        time.sleep(self.lease * 3)   # twice the lease: only heartbeats kept it
        self.assertEqual(job(job_id), ("running", 1, 3))
        self.assertEqual(kinds(job_id), [])
        m.ack()
        self.assertEqual(job(job_id)[0], "succeeded")

    def test_ack_after_the_lease_was_lost_is_refused(self):
        m = self.put_get()
        job_id, fence = m.headers["jobcap_job_id"], m.headers["jobcap_fence"]
        # the lease is taken away (as if the heartbeats stopped and another worker claimed it)
        jobcap.contrib.kombu._heartbeats.pop(m.delivery_tag)
        m2 = self.queue.get(timeout=10)
        self.assertEqual(m2.headers["jobcap_fence"], fence + 1)
        m.ack()  # stale: logged, not a success
        self.assertEqual(job(job_id), ("running", 2, 3))
        m2.ack()
        self.assertEqual(job(job_id), ("succeeded", 2, 3))

    def test_acks_are_completed_alone_once_complete_jobs_is_refused(self):
        # Celery's event loop acks several tasks in one complete_jobs. Citus refuses that call
        # (0A000: it routes only a call that names one job's shard); the stand-in refuses it the
        # same way and counts its calls in a sequence (not rolled back with the refused call).
        kombu_transport = jobcap.contrib.kombu
        sql("CREATE SEQUENCE refused_acks")
        sql("ALTER FUNCTION jobcap.complete_jobs(bigint[], bigint[], jsonb[])"
            " RENAME TO complete_jobs_kept")
        self.addCleanup(kombu_transport._no_batch.discard, server.conninfo)
        self.addCleanup(sql, "DROP FUNCTION jobcap.complete_jobs(bigint[], bigint[], jsonb[]);"
                        " ALTER FUNCTION jobcap.complete_jobs_kept(bigint[], bigint[], jsonb[])"
                        " RENAME TO complete_jobs; DROP SEQUENCE refused_acks")
        sql("CREATE FUNCTION jobcap.complete_jobs(job_ids bigint[], fences bigint[],"
            " outputs jsonb[] DEFAULT NULL) RETURNS integer LANGUAGE plpgsql AS $$ BEGIN"
            " PERFORM nextval('public.refused_acks'); RAISE EXCEPTION 'complete_jobs is not"
            " routable' USING ERRCODE = 'feature_not_supported'; END $$")
        for n in range(4):
            self.queue.put({"n": n})
        got = [self.queue.get(timeout=5) for _ in range(4)]
        helds = [kombu_transport._heartbeats.pop(m.delivery_tag) for m in got]
        kombu_transport._complete(helds[:2])   # refused, then each alone
        kombu_transport._complete(helds[2:])   # each alone at once
        for m in got:
            self.assertEqual(job(m.headers["jobcap_job_id"]), ("succeeded", 1, 3))
            m.ack()   # kombu's bookkeeping only: the job is no longer held
        self.assertEqual(sql("SELECT last_value, is_called FROM refused_acks"), [(1, True)])

    def test_polling_finds_the_cancelled_messages_and_stops_when_job_result_is_refused(self):
        # Without LISTEN (through a pooler) the transport polls job_result for the jobs it holds.
        kombu_transport = jobcap.contrib.kombu
        got = [self.put_get({"n": n}) for n in range(3)]
        ids = [m.headers["jobcap_job_id"] for m in got]
        for job_id in (ids[0], ids[2]):
            self.assertEqual(sql("SELECT jobcap.cancel_job(%s)", (job_id,)), [(True,)])
        transport = self.conn.transport
        transport.cancel_poll, transport._cancel_polled = 0.001, 0.0
        transport._poll_cancelled()
        # Every cancelled job found (not only the first row), its lease no longer kept.
        held = set(kombu_transport._heartbeats.held)
        self.assertEqual([m.delivery_tag in held for m in got], [False, True, False])
        # On a Citus cluster job_result is refused (0A000): asked once, then not again. The
        # stand-in refuses the same way and counts its calls in a sequence.
        sql("CREATE SEQUENCE refused_polls")
        sql("ALTER FUNCTION jobcap.job_result(bigint) RENAME TO job_result_kept")
        self.addCleanup(sql, "DROP FUNCTION jobcap.job_result(bigint); ALTER FUNCTION"
                        " jobcap.job_result_kept(bigint) RENAME TO job_result;"
                        " DROP SEQUENCE refused_polls")
        sql("CREATE FUNCTION jobcap.job_result(job_id bigint, OUT state jobcap.job_state,"
            " OUT attempts integer) LANGUAGE plpgsql AS $$ BEGIN"
            " PERFORM nextval('public.refused_polls'); RAISE EXCEPTION 'jobcap.job_result does"
            " not run on a distributed install yet' USING ERRCODE = 'feature_not_supported';"
            " END $$")
        for _ in range(3):
            transport._cancel_polled = 0.0
            transport._poll_cancelled()
        self.assertEqual(sql("SELECT last_value, is_called FROM refused_polls"), [(1, True)])
        got[1].ack()
        self.assertEqual(job(ids[1]), ("succeeded", 1, 3))

    def test_priority_higher_first(self):
        for p in (0, 9, 5):
            self.queue.put({"p": p}, priority=p)
        got = [self.queue.get(timeout=5) for _ in range(3)]
        self.assertEqual([m.payload["p"] for m in got], [9, 5, 0])
        for m in got:
            m.ack()

    def test_concurrency_key_header(self):
        self.queue.put({"k": 1}, headers={"jobcap_concurrency_key": "tenant-42"})
        self.queue.put({"k": 2})
        got = [self.queue.get(timeout=5) for _ in range(2)]
        keys = [sql("SELECT concurrency_key FROM jobcap.jobs WHERE job_id = %s",
                    (m.headers["jobcap_job_id"],))[0][0] for m in got]
        self.assertEqual(keys, ["tenant-42", None])
        for m in got:
            m.ack()
        with self.assertRaises(ValueError):
            self.queue.put({"k": 3}, headers={"jobcap_concurrency_key": 42})
        self.assertEqual(self.queue.qsize(), 0)

    def test_dedupe_headers(self):
        keep = {"jobcap_dedupe_key": "order-7", "jobcap_dedupe_window": 60}
        self.queue.put({"n": 1}, headers=keep)
        self.queue.put({"n": 2}, headers=keep)   # the key's pending job holds it: nothing new
        self.assertEqual(self.queue.qsize(), 1)
        m = self.queue.get(timeout=5)
        self.assertEqual(m.payload, {"n": 1})
        m.ack()
        # Succeeded within the window: the key still returns that job, nothing is enqueued.
        self.queue.put({"n": 3}, headers=keep)
        self.assertEqual(self.queue.qsize(), 0)
        self.assertEqual(sql("SELECT count(*), min(state::text) FROM jobcap.jobs"
                             " WHERE queue = %s AND dedupe_key = 'order-7'",
                             (self.queue_name,)), [(1, "succeeded")])
        # Debounce: replace gives the pending job the newest payload.
        replace = {"jobcap_dedupe_key": "search-index", "jobcap_dedupe": "replace"}
        for n in (1, 2, 3):
            self.queue.put({"v": n}, headers=replace)
        self.assertEqual(self.queue.qsize(), 1)
        m = self.queue.get(timeout=5)
        self.assertEqual(m.payload, {"v": 3})
        m.ack()
        # Refused before anything is enqueued: a window that is not a number of seconds, a key
        # that is not a string; and by the server (22023) a mode it does not know.
        for bad in ({"jobcap_dedupe_key": "k", "jobcap_dedupe_window": "1 hour"},
                    {"jobcap_dedupe_key": 7},
                    {"jobcap_dedupe_key": "k", "jobcap_dedupe_window": True}):
            with self.assertRaises(ValueError):
                self.queue.put({"bad": 1}, headers=bad)
        with self.assertRaises(psycopg.errors.InvalidParameterValue):
            self.queue.put({"bad": 2}, headers={"jobcap_dedupe_key": "k", "jobcap_dedupe": "merge"})
        self.assertEqual(sql("SELECT count(*) FROM jobcap.jobs WHERE queue = %s"
                             " AND state = 'pending'", (self.queue_name,)), [(0,)])

    def test_eta_header_is_run_at(self):
        eta = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=1)
        self.queue.put({"later": 1}, headers={"eta": eta.isoformat()})
        with self.assertRaises(self.queue.Empty):
            self.queue.get(timeout=0.3)
        m = self.queue.get(timeout=5)
        self.assertGreaterEqual(dt.datetime.now(dt.timezone.utc), eta)
        m.ack()

    def test_size_and_purge(self):
        for i in range(5):
            self.queue.put({"i": i})
        m = self.queue.get(timeout=5)
        self.assertEqual(self.queue.qsize(), 4)
        self.assertEqual(self.queue.clear(), 4)
        self.assertEqual(self.queue.qsize(), 0)
        m.ack()   # the running one settles normally
        self.assertEqual(job(m.headers["jobcap_job_id"])[0], "succeeded")

    def test_foreign_payloads_are_dead_and_the_next_message_comes(self):
        self.queue.put({"warm": "up"})   # declares (creates) the queue
        self.queue.get(timeout=5).ack()
        foreign = [sql("SELECT jobcap.enqueue_job(%s, %s::jsonb)", (self.queue_name, p))[0][0]
                   for p in ("{}", "[1]", '{"body": 1, "content-type": "x", "properties": {}}')]
        self.queue.put({"good": True})
        m = self.queue.get(timeout=5)
        self.assertEqual(m.payload, {"good": True})
        m.ack()
        for job_id in foreign:
            self.assertEqual(job(job_id), ("dead", 1, 1))
            self.assertIn("not a kombu message", kinds(job_id)[0][2])

    def test_no_ack_consumers_are_refused(self):
        with self.assertRaises(jobcap.contrib.kombu.Unsupported) as caught:
            self.queue.consumer.channel.basic_consume(self.queue_name, True, lambda m: None,
                                                      "tag")
        self.assertIn("no_ack=True", str(caught.exception))
        self.assertNotIn("task_acks_late", str(caught.exception))


class OptionsTest(unittest.TestCase):
    def channel(self, **options):
        conn = Connection("jobcap://", transport_options=dict(
            {"conninfo": server.conninfo}, **options))
        self.addCleanup(conn.release)
        return conn.channel()

    def test_bad_values_are_refused_with_the_option_named(self):
        for option, value in (("visibility_timeout", 0), ("visibility_timeout", "soon"),
                              ("backoff_base", -1), ("backoff_max", None),
                              ("max_attempts", 0), ("max_attempts", 2.5),
                              ("polling_interval", 0)):
            with self.subTest(option=option, value=value):
                with self.assertRaises(jobcap.contrib.kombu.InvalidOption) as caught:
                    self.channel(**{option: value})
                self.assertIn(f"transport option {option} must be", str(caught.exception))

    def test_an_unknown_option_is_named_once(self):
        log = logging.getLogger("jobcap.kombu")
        with self.assertLogs(log, "WARNING") as said:
            self.channel(max_attemps=3)
            self.channel(max_attemps=3)
        self.assertEqual(len(said.output), 1, said.output)
        self.assertIn("unknown transport option(s) max_attemps", said.output[0])
        self.assertIn("max_attempts", said.output[0])
        with self.assertNoLogs(log, "WARNING"):
            self.channel(max_attempts=3, visibility_timeout=30, polling_interval=0.5,
                         max_retries=3)


class RoleTest(unittest.TestCase):
    """Missing grants get an error that names the grant, and lose nothing; transport options
    that cannot apply say so once."""

    @classmethod
    def setUpClass(cls):
        server.psql("CREATE ROLE app_worker LOGIN IN ROLE jobcap_worker;"
                    " CREATE ROLE stranger LOGIN;"
                    " SELECT jobcap.create_queue('owned', 7, '30 s', '1 s', '5 s');"
                    " SELECT jobcap.create_queue('granted', 7);"
                    " SELECT jobcap.grant_queue('granted', 'app_worker')")

    def connect(self, role, **options):
        conninfo = server.conninfo.replace("user=postgres", f"user={role}")
        conn = Connection("jobcap://", transport_options=dict(
            {"conninfo": conninfo, "polling_interval": 0.05}, **options))
        self.addCleanup(conn.release)
        return conn

    def test_a_queue_not_granted(self):
        before = sql("SELECT count(*) FROM jobcap.jobs WHERE queue = 'owned'")
        conn = self.connect("app_worker")
        # declaring it (a consumer, a SimpleQueue) and publishing to it without a declaration
        with self.assertRaises(jobcap.contrib.kombu.AccessDenied) as caught:
            conn.SimpleQueue("owned")
        self.assertIn("jobcap.grant_queue('owned', 'app_worker', create_missing => true)",
                      str(caught.exception))
        with self.assertRaises(jobcap.contrib.kombu.AccessDenied) as caught:
            conn.Producer().publish({"n": 1}, routing_key="owned")
        self.assertIn("jobcap.grant_queue('owned', 'app_worker', create_missing => true)",
                      str(caught.exception))
        self.assertEqual(sql("SELECT count(*) FROM jobcap.jobs WHERE queue = 'owned'"), before)

    def test_a_role_without_jobcap_worker(self):
        with self.assertRaises(jobcap.contrib.kombu.AccessDenied) as caught:
            self.connect("stranger").SimpleQueue("granted")
        self.assertIn("GRANT jobcap_worker TO stranger", str(caught.exception))

    def test_purge_needs_the_operator_role(self):
        with self.connect("app_worker").SimpleQueue("granted") as queue:
            queue.put({"kept": True})
            with self.assertRaises(PermissionError) as caught:
                queue.clear()
            self.assertIn("jobcap_operator", str(caught.exception))
        self.assertGreaterEqual(sql("SELECT count(*) FROM jobcap.jobs WHERE queue = 'granted'"
                                    " AND state = 'pending'")[0][0], 1)   # nothing deleted

    def test_granted_later_nothing_was_lost(self):
        sql("SELECT jobcap.create_queue('late')")
        job_id = sql("SELECT jobcap.enqueue_job('late', %s::jsonb)",
                     ('{"body": "e30=", "content-type": "application/json",'
                      ' "content-encoding": "utf-8", "headers": {},'
                      ' "properties": {"body_encoding": "base64"}}',))[0][0]
        with self.assertRaises(jobcap.contrib.kombu.AccessDenied):
            self.connect("app_worker").SimpleQueue("late")
        self.assertEqual(job(job_id), ("pending", 0, 10))
        sql("SELECT jobcap.grant_queue('late', 'app_worker')")
        with self.connect("app_worker").SimpleQueue("late") as queue:
            m = queue.get(timeout=5)
            self.assertEqual(m.headers["jobcap_job_id"], job_id)
            m.ack()
        self.assertEqual(job(job_id), ("succeeded", 1, 10))

    def test_options_for_an_existing_queue_say_so_once(self):
        log = logging.getLogger("jobcap.kombu")
        # the owner's role reads the queue's settings: only the ones that differ are named
        with self.assertLogs(log, "WARNING") as said:
            for _ in range(2):
                with self.connect("postgres", max_attempts=3, backoff_base=1).SimpleQueue(
                        "owned") as queue:
                    queue.put({"n": 1})
        self.assertEqual(len(said.output), 1, said.output)
        self.assertIn("max_attempts=7", said.output[0])
        self.assertIn("jobcap.alter_queue('owned', max_attempts => 3)", said.output[0])
        self.assertNotIn("backoff_base", said.output[0])   # 1 s is what it has
        # a worker role may not read them: it says they may not apply, once
        with self.assertLogs(log, "WARNING") as said:
            for _ in range(2):
                with self.connect("app_worker", max_attempts=3).SimpleQueue(
                        "granted") as queue:
                    queue.put({"n": 1})
        self.assertEqual(len(said.output), 1, said.output)
        self.assertIn("may not apply to queue 'granted'", said.output[0])
        # options equal to the queue's, or none given: nothing is said
        with self.assertNoLogs(log, "WARNING"):
            with self.connect("postgres", max_attempts=7).SimpleQueue("owned2") as queue:
                queue.put({"n": 1})   # created here with them
            with self.connect("postgres", max_attempts=7).SimpleQueue("owned2") as queue:
                queue.put({"n": 2})
            with self.connect("app_worker").SimpleQueue("granted") as queue:
                queue.put({"n": 3})


if __name__ == "__main__":
    unittest.main()
