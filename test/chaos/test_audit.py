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
         "over_cap": 0, "stuck": 0, "stale_effects_accepted": 0}


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
            enqueued=True):
        cap = cap or {"poison": 3, "killer": 2}.get(kind, 20)
        job_id = self.sql(
            "INSERT INTO jobcap.jobs (queue, state, attempts, fence, max_attempts,"
            f" lease_expires_at) VALUES ('chaos', %s, %s, %s, %s, {expires}) RETURNING job_id",
            (state, attempts, fence, cap)).fetchone()[0]
        if enqueued:
            self.sql("INSERT INTO chaos_jobs VALUES (%s, %s, %s)", (job_id, kind, cap))
        return job_id

    def effect(self, job_id, fence):
        self.sql("INSERT INTO effects (job_id, fence, worker) VALUES (%s, %s, 'w')",
                 (job_id, fence))

    def audit(self):
        result = chaos.audit(self.db)
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

    def test_dead_short_of_its_cap_is_not_counted_as_capped(self):
        self.good_run()
        self.job("killer", "dead", 1, 60)
        _, result = self.audit()
        self.assertEqual((result["capped"], result["capped_expected"]), (2, 3))


if __name__ == "__main__":
    unittest.main()
