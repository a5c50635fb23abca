"""The chaos audit must be able to fail: each fault it counts, planted by hand, is counted.

Run by test/run chaos before the harness itself (JOBCAP_PG_BINDIR names the private install).
"""
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import chaos  # noqa: E402

CLEAN = {"lost": 0, "unexpected": 0, "twice": 0, "stale_accepted": 0, "no_effect": 0,
         "over_cap": 0, "stuck": 0, "stale_effects_accepted": 0, "early": 0, "ran_cancelled": 0,
         "outputs_wrong": 0}


class AuditTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        bindir = os.environ.get("JOBCAP_PG_BINDIR")
        if not bindir:
            raise unittest.SkipTest("JOBCAP_PG_BINDIR is not set: run test/run chaos")
        cls.workdir = tempfile.mkdtemp(prefix="jobcap-audit-")
        cls.cluster = chaos.Cluster(bindir, cls.workdir)
        cls.cluster.init({})
        cls.cluster.start()
        cls.db = chaos.Db(cls.cluster.conninfo, "audit test")
        cls.db.get().execute(chaos.SCHEMA)
        cls.db.get().execute("SELECT jobcap.create_queue('chaos', max_attempts => 20)")

    @classmethod
    def tearDownClass(cls):
        cls.db.close()
        cls.cluster.stop()
        import shutil
        shutil.rmtree(cls.workdir, ignore_errors=True)

    def setUp(self):
        self.sql("TRUNCATE chaos_jobs, effects, events; DELETE FROM jobcap.jobs")

    def sql(self, text, params=None):
        return self.db.get().execute(text, params)

    def job(self, kind, state, attempts, fence, cap=None, expires="now() + interval '1 minute'",
            enqueued=True, parents=None, outputs=False, payload="{}"):
        cap = cap or {"poison": 3, "killer": 2}.get(kind, 20)
        # Finished a minute ago when it is finished: before any effect planted after it.
        job_id = self.sql(
            "INSERT INTO jobcap.jobs (queue, state, attempts, fence, max_attempts,"
            " lease_expires_at, finished_at, payload) VALUES ('chaos', %s, %s, %s, %s,"
            f" {expires}, CASE WHEN %s IN ('succeeded', 'dead', 'cancelled')"
            " THEN now() - interval '1 minute' END, %s) RETURNING job_id",
            (state, attempts, fence, cap, state, payload)).fetchone()[0]
        if enqueued:
            self.sql("INSERT INTO chaos_jobs (job_id, kind, cap, parents, outputs)"
                     " VALUES (%s, %s, %s, %s, %s)", (job_id, kind, cap, parents, outputs))
        return job_id

    def effect(self, job_id, fence):
        self.sql("INSERT INTO effects (job_id, fence, worker) VALUES (%s, %s, 'w')",
                 (job_id, fence))

    def audit(self):
        result = chaos.audit(self.db)
        # A Citus run audits copies of the queue's jobs (chaos.audit's citus form): the same
        # counts, fault for fault.
        self.assertEqual(chaos.audit(self.db, citus=True), result)
        return {k: result[k] for k in CLEAN}, result

    def expect(self, **faults):
        got, _ = self.audit()
        self.assertEqual(got, {**CLEAN, **faults})

    def good_run(self):
        ok = self.job("normal", "succeeded", 1, 11)
        self.effect(ok, 11)
        self.job("poison", "dead", 3, 14)
        self.job("killer", "dead", 2, 16)
        flaky = self.job("flaky", "succeeded", 3, 19)
        self.effect(flaky, 19)
        return ok

    def test_a_clean_run_counts_nothing(self):
        self.good_run()
        got, result = self.audit()
        self.assertEqual(got, CLEAN)
        self.assertEqual((result["capped"], result["capped_expected"]), (2, 2))
        self.assertEqual((result["flaky_ok"], result["flaky_expected"]), (1, 1))

    def test_each_fault_is_counted(self):
        ok = self.good_run()
        self.job("normal", "pending", 2, 30)
        self.expect(lost=1)
        self.setUp()
        self.good_run()
        self.job("normal", "succeeded", 1, 31, enqueued=False)  # nobody enqueued it
        self.job("poison", "succeeded", 1, 32)                  # wrong final state
        self.expect(unexpected=2, no_effect=2)
        self.setUp()
        ok = self.good_run()
        self.effect(ok, 11)
        self.expect(twice=1)
        self.setUp()
        ok = self.good_run()
        self.effect(ok, 10)                                     # an older fence's effect
        dead = self.job("poison", "dead", 3, 40)
        self.effect(dead, 40)                                   # effect of a failed attempt
        self.expect(twice=1, stale_accepted=2)
        self.setUp()
        self.good_run()
        self.sql("UPDATE jobcap.jobs SET attempts = 21 WHERE state = 'succeeded'"
                 " AND job_id IN (SELECT job_id FROM chaos_jobs WHERE kind = 'normal')")
        self.expect(over_cap=1)
        self.setUp()
        self.good_run()
        self.job("normal", "running", 1, 50, expires="now() - interval '1 second'")
        self.expect(lost=1, stuck=1)
        self.setUp()
        self.good_run()
        self.sql("INSERT INTO events (worker, job_id, fence, event)"
                 " VALUES ('w', 1, 1, 'stale_effect_accepted')")
        self.expect(stale_effects_accepted=1)

    def family(self):
        """A clean workflow: a child of two succeeded parents, with their outputs, and a child
        of a dead parent, cancelled unclaimed."""
        a = self.job("normal", "succeeded", 1, 70)
        self.effect(a, 70)
        b = self.job("flaky", "succeeded", 2, 71)
        self.effect(b, 71)
        dead = self.job("poison", "dead", 3, 72)
        outputs = '{"kind": "normal", "parent_outputs": {"%d": null, "%d": null}}' % (a, b)
        child = self.job("child", "succeeded", 1, 73, parents=[a, b], outputs=True,
                         payload=outputs)
        self.effect(child, 73)
        orphan = self.job("child", "cancelled", 0, 0, parents=[a, dead])
        return a, b, dead, child, orphan

    def test_a_clean_workflow_counts_nothing(self):
        self.family()
        got, result = self.audit()
        self.assertEqual(got, CLEAN)
        self.assertEqual((result["children_ok"], result["children_cancelled"],
                          result["children"]), (1, 1, 2))

    def test_each_workflow_fault_is_counted(self):
        a, b, dead, child, orphan = self.family()
        self.sql("UPDATE jobcap.jobs SET state = 'succeeded' WHERE job_id = %s", (orphan,))
        self.effect(orphan, 0)   # ran although a parent died
        self.expect(unexpected=1, stale_accepted=0)
        self.setUp()
        a, b, dead, child, orphan = self.family()
        self.sql("UPDATE jobcap.jobs SET finished_at = now() + interval '1 minute'"
                 " WHERE job_id = %s", (b,))  # the child's effect came before b finished
        self.expect(early=1)
        self.setUp()
        a, b, dead, child, orphan = self.family()
        self.sql("UPDATE jobcap.jobs SET attempts = 1 WHERE job_id = %s", (orphan,))
        self.expect(ran_cancelled=1)
        self.setUp()
        a, b, dead, child, orphan = self.family()
        self.sql("UPDATE jobcap.jobs SET payload = payload #- ARRAY['parent_outputs', %s]"
                 " WHERE job_id = %s", (str(a), child))
        self.expect(outputs_wrong=1)
        self.setUp()
        self.family()
        self.job("child", "waiting", 0, 0, parents=[self.job("normal", "pending", 0, 0)])
        self.expect(lost=2)

    def test_dead_short_of_its_cap_is_not_counted_as_capped(self):
        self.good_run()
        self.job("killer", "dead", 1, 60)
        _, result = self.audit()
        self.assertEqual((result["capped"], result["capped_expected"]), (2, 3))


if __name__ == "__main__":
    unittest.main()
