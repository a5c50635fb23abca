#!/usr/bin/env python3
"""A bounded, deterministic fuzzer for jobcap's SQL API.

It starts a throwaway PostgreSQL instance (initdb and pg_ctl from PATH, jobcap installed in it),
then makes --calls calls, chosen by a PRNG seeded with --seed, from four sessions (the owner, an
operator, a worker granted two of the four queues, a worker granted none):

  * every function of the API with random and adversarial arguments: NULLs, empty and 10 kB
    names, control characters, quotes and format directives, integers and intervals at the ends
    of their types, infinite and extreme times, payloads up to 2 MB, deep and odd JSON, arrays
    with NULLs, fences never issued;
  * random orderings of claim / complete / fail / heartbeat / assert_fence / reap / cancel /
    requeue / complete_and_claim over the same jobs, with fences current, stale and future, in
    autocommit and inside explicit transactions that commit or roll back, with savepoints, with
    leases expired by hand, caps lowered, queues dropped and recreated, grants revoked.

A trigger (the fuzzer's, not jobcap's) logs every change of a job's state, fence or attempts.
Afterwards it checks: the postmaster is the one it started (same pid, same start time) and its
log has no "terminated by signal"; no call ever got SQLSTATE XX000 or lost its connection; and
the invariants hold over every logged change: a claim (pending -> running) adds exactly one
attempt and never exceeds the cap in force, fences and attempts never go back and every claim
gets a new fence (and so does a requeue), a fence is never handed out twice, terminal states are left only by
requeue_job (and succeeded never). It prints the number of calls and the distinct SQLSTATEs.
"""
import argparse
import collections
import os
import random
import re
import subprocess
import sys
import time

import psycopg
from psycopg.types.string import TextLoader

QUEUES = ["q0", "q1", "q2", "q3"]      # q0 and q1 are granted to the worker
GRANTED = {"q0", "q1"}
I32 = (2**31 - 1, -2**31)
I64 = (2**63 - 1, -2**63)


class Fuzzer:
    def __init__(self, args):
        self.args = args
        self.rng = random.Random(args.seed)
        self.calls = 0
        self.per_function = collections.Counter()
        self.states = collections.Counter()           # SQLSTATE (or 'ok') -> count
        self.failures = []                            # what must never happen
        self.jobs = []                                # job ids seen
        self.fence = {}                               # job id -> highest fence a claim returned
        self.all_fences = set()
        self.max_cap = {}                             # queue -> highest cap ever set

    # ---- the instance -------------------------------------------------------------------
    def start(self):
        d = os.path.abspath(self.args.dir)
        self.data = os.path.join(d, "data")
        self.log = os.path.join(d, "server.log")
        subprocess.run(["initdb", "-D", self.data, "-A", "trust", "--no-sync"], check=True,
                       stdout=subprocess.DEVNULL)
        with open(os.path.join(self.data, "postgresql.conf"), "a") as conf:
            conf.write(f"port = {self.args.port}\nlisten_addresses = ''\n"
                       f"unix_socket_directories = '{d}'\nfsync = off\n"
                       "jobcap.error_history = 5\n"
                       # Crashes are logged at LOG level; the tens of thousands of expected
                       # ERRORs are not worth the disk.
                       "log_min_messages = log\nlog_min_error_statement = panic\n"
                       "max_connections = 20\n")
        subprocess.run(["pg_ctl", "-D", self.data, "-l", self.log, "-w", "start"], check=True,
                       stdout=subprocess.DEVNULL)
        with open(os.path.join(self.data, "postmaster.pid")) as f:
            self.pid = int(f.readline())
        self.conninfo = f"host={d} port={self.args.port} dbname=postgres"

    def stop(self):
        subprocess.run(["pg_ctl", "-D", self.data, "-w", "stop", "-m", "fast"],
                       stdout=subprocess.DEVNULL)

    def connect(self, user):
        c = psycopg.connect(self.conninfo + f" user={user}", autocommit=True)
        # Payloads come back as text: deep JSON is the server's business, not Python's.
        c.adapters.register_loader("jsonb", TextLoader)
        # A call that would wait for another of our sessions fails instead (55P03).
        c.execute("SET lock_timeout = '10ms'")
        c.execute("SET statement_timeout = '20s'")
        return c

    def setup(self):
        su = psycopg.connect(self.conninfo, autocommit=True)
        self.owner_name = su.execute("SELECT current_user").fetchone()[0]
        self.start_time = su.execute("SELECT pg_postmaster_start_time()").fetchone()[0]
        su.execute("CREATE EXTENSION jobcap")
        for role, group in (("fuzz_operator", "jobcap_operator"), ("fuzz_worker", "jobcap_worker"),
                            ("fuzz_idle", "jobcap_worker")):
            su.execute(f"CREATE ROLE {role} LOGIN IN ROLE {group}")
        for q in QUEUES:
            cap = self.rng.choice([1, 2, 3, 5])
            self.max_cap[q] = cap
            su.execute("SELECT jobcap.create_queue(%s, max_attempts => %s, backoff_base => '0',"
                       " backoff_max => '0')", (q, cap))
        for q in GRANTED:
            su.execute("SELECT jobcap.grant_queue(%s, 'fuzz_worker')", (q,))
        # Every change of a job's state, fence or attempts, with the cap in force
        # (docs/semantics.md, Caps: the lower of the job's and its queue's, or a requeue's budget
        # until the next lowering) and the client's statement (which tells a requeue_job from
        # anything else).
        su.execute("""
            CREATE TABLE public.fuzz_log (id bigserial, job_id bigint, old_state text, new_state text,
                old_fence bigint, new_fence bigint, old_attempts int, new_attempts int, cap int,
                query text);
            CREATE FUNCTION public.fuzz_log_change() RETURNS trigger LANGUAGE plpgsql
            SET search_path = pg_catalog AS $$
            BEGIN
              IF OLD.state IS DISTINCT FROM NEW.state OR OLD.fence IS DISTINCT FROM NEW.fence
                 OR OLD.attempts IS DISTINCT FROM NEW.attempts THEN
                INSERT INTO public.fuzz_log (job_id, old_state, new_state, old_fence, new_fence,
                                             old_attempts, new_attempts, cap, query)
                VALUES (NEW.job_id, OLD.state, NEW.state, OLD.fence, NEW.fence, OLD.attempts,
                        NEW.attempts,
                        (SELECT CASE WHEN (NEW.cap_epoch = q.cap_epoch) IS TRUE THEN NEW.max_attempts
                                     ELSE least(NEW.max_attempts, q.max_attempts) END
                           FROM jobcap.queues q WHERE q.queue = NEW.queue),
                        current_query());
              END IF;
              RETURN NULL;
            END $$;
            CREATE TRIGGER fuzz_log AFTER UPDATE ON jobcap.jobs
              FOR EACH ROW EXECUTE FUNCTION public.fuzz_log_change();
        """)
        su.execute("SET lock_timeout = '10ms'")
        su.execute("SET statement_timeout = '20s'")
        self.su = su
        self.users = {"owner": self.owner_name, "operator": "fuzz_operator", "worker": "fuzz_worker",
                      "idle": "fuzz_idle"}
        self.sessions = {who: self.connect(user) for who, user in self.users.items()}
        self.busy = None                              # the session inside an explicit transaction
        self.bad = False                              # is this step adversarial
        self.who = None                               # the session of this step
        # Jobs to work on from the start.
        for q in QUEUES:
            for _ in range(5):
                self.jobs.append(su.execute("SELECT jobcap.enqueue_job(%s)", (q,)).fetchone()[0])

    # ---- values: valid ones, and (in an adversarial step) hostile ones ---------------------
    # Half the steps are adversarial: there each argument turns hostile with probability 0.35.
    # The other half use valid arguments, so that jobs really flow through their lives.
    def pick(self, *choices):
        return self.rng.choice(choices)

    def hostile(self):
        return self.bad and self.rng.random() < 0.35

    def name(self):
        if not self.hostile():
            # The worker mostly names its own queues.
            if self.who == "worker" and self.rng.random() < 0.8:
                return self.rng.choice(sorted(GRANTED))
            return self.rng.choice(QUEUES)
        return self.pick(None, "", "nope", "x" * 10240, "q" * 128, "q" * 129, "\x01", "a\tb",
                         "q0\n", "\x7f", "\u00df", "\U0001F4A9", "q0'; DROP TABLE jobcap.jobs; --",
                         '"q0"', "%s%n%d", "\\", " q0", "q0 ")

    def worker(self):
        if not self.hostile():
            return self.pick("w1", "w2")
        return self.pick(None, "", "x" * 10240, "w" * 257, "w\r", "%n%n", "w" * 256)

    def int4(self, good=(1, 2, 5, 10)):
        if not self.hostile():
            return self.rng.choice(good)
        return self.pick(None, 0, -1, 10000, 10001, 100000, 100001, 1000000, 1000001, *I32)

    def job_id(self):
        if self.jobs and not self.hostile():
            return self.rng.choice(self.jobs[-300:])   # mostly the live ones
        return self.pick(None, 0, -1, 999999999, *I64)

    def fence_for(self, job):
        f = self.fence.get(job, 0)
        if not self.hostile():
            return f if self.rng.random() < 0.85 else f - 1
        return self.pick(None, f + 1, 0, -1, *I64)

    def interval(self, good=(None, "1 minute", "5 minutes")):
        if not self.hostile():
            return self.rng.choice(good)
        return self.pick("0", "1 microsecond", "-1 second", "10 years", "10 years 1 second",
                         "178000000 years", "-178000000 years", "1 month -30 days",
                         "2147483647 days", "-2147483648 months", "00:00:00.5", "1 day -86400 seconds",
                         "not an interval", None)

    def timestamp(self):
        if not self.hostile():
            return "now"
        return self.pick(None, "infinity", "-infinity", "4713-01-01 00:00:00+00 BC",
                         "294276-12-31 23:59:59+00", "epoch", "2000-01-01", "2100-01-01", "yesterday")

    def payload(self):
        if not self.hostile():
            return self.pick('{}', '{"n": 1}', '[]', '"s"', 'null', '1', '{"a": {"b": [1, 2, 3]}}')
        r = self.rng.random()
        if r < 0.2:
            return None
        if r < 0.25:
            return '{"big": "' + "x" * self.pick(1024 * 1024 - 64, 1024 * 1024 + 64, 2 * 1024 * 1024) + '"}'
        if r < 0.45:
            depth = self.pick(100, 5000, 20000)
            return "[" * depth + "]" * depth
        if r < 0.75:
            return self.pick('1e1000000', '-0', '{"\\u0000": 1}', '{"a": "\\ud800"}', '{"a":1,"a":2}')
        return self.pick('not json', '{', '{"k": ' + '9' * 5000 + '}')

    def payloads(self):
        if not self.hostile():
            return "{" + ",".join(['"{}"'] * self.rng.randint(0, 5)) + "}"
        return self.pick(None, "{}", '{NULL}', '{"{}",NULL}', '{{"{}"},{"{}"}}', '{"not json"}')

    # ---- calls ----------------------------------------------------------------------------
    def admin(self, sql, params=()):
        """The fuzzer's own housekeeping as the superuser (not counted as a call); it may meet
        the locks of a session inside a transaction, and then it simply does not happen."""
        try:
            self.su.execute(sql, params)
        except psycopg.errors.Error as e:
            if e.sqlstate == "XX000":
                self.failures.append(f"XX000 in housekeeping: {e} -- {sql}")

    WORKER_FUNCTIONS = {"enqueue_job", "enqueue_jobs", "claim_job", "claim_job_by_id",
                        "complete_and_claim", "complete_job", "complete_jobs", "fail_job", "heartbeat",
                        "assert_fence"}

    def session(self, op=None):
        """Mostly a session whose role may call op (the owner, or the worker for a worker
        function, the operator for the others); one call in six from any session."""
        while True:
            if op is None or self.rng.random() < 1 / 6:
                who = self.rng.choice(["owner", "operator", "worker", "idle"])
            elif op in self.WORKER_FUNCTIONS:
                who = self.rng.choice(["owner", "worker"])
            else:
                who = self.rng.choice(["owner", "operator"])
            if who != self.busy:
                return who

    def call(self, who, function, sql, params=()):
        """One call; returns its rows, or None when it raised."""
        conn = self.sessions[who]
        self.calls += 1
        self.per_function[function] += 1
        try:
            cur = conn.execute(sql, params)
            rows = cur.fetchall() if cur.description else []
            self.states["ok"] += 1
            return rows
        except psycopg.errors.Error as e:
            state = e.sqlstate or "client"
            self.states[state] += 1
            if state == "XX000":
                self.failures.append(f"XX000 from {function} as {who}: {e} -- {sql} {params!r:.300}")
            if isinstance(e, psycopg.OperationalError) and conn.closed:
                self.failures.append(f"connection lost in {function} as {who}: {e}")
                self.sessions[who] = self.connect(self.users[who])
            return None

    def claimed(self, rows, function):
        for job_id, fence, attempt, max_attempts, *_ in rows or []:
            if attempt > max_attempts:
                self.failures.append(f"{function} returned attempt {attempt} > max_attempts {max_attempts}")
            if fence in self.all_fences:
                self.failures.append(f"{function} handed out fence {fence} twice")
            if fence <= self.fence.get(job_id, 0):
                self.failures.append(f"{function} gave job {job_id} fence {fence} after {self.fence[job_id]}")
            self.all_fences.add(fence)
            self.fence[job_id] = fence
            if job_id not in self.jobs:
                self.jobs.append(job_id)

    def step(self):
        r = self.rng
        op = r.choices(
            ["enqueue_job", "enqueue_jobs", "claim_job", "claim_job_by_id", "complete_and_claim",
             "complete_job", "complete_jobs", "fail_job", "heartbeat", "assert_fence", "reap_jobs", "cancel_job",
             "requeue_job", "create_queue", "alter_queue", "drop_queue", "grant_queue",
             "revoke_queue", "statements", "backoff", "expire", "transaction"],
            [10, 4, 12, 5, 5, 10, 3, 8, 5, 4, 5, 4, 4, 3, 3, 0.5, 2, 2, 2, 3, 3, 2])[0]
        self.bad = r.random() < 0.5
        who = self.session(op)
        self.who = who
        if op == "enqueue_job":
            rows = self.call(who, op, "SELECT jobcap.enqueue_job(%s::text, %s::jsonb, %s::timestamptz,"
                             " %s::int4, %s::int4, %s::text)",
                             (self.name(), self.payload(), self.timestamp(),
                              self.int4(good=(0, 0, -1, 5)), self.pick(None, None, *[self.int4()]),
                              self.pick(None, None, None, "k1", "k2") if not self.hostile()
                              else self.pick("", "k" * 1025, "\x01", "k" * 1024)))
            if rows and rows[0][0] not in self.jobs:
                self.jobs.append(rows[0][0])
        elif op == "enqueue_jobs":
            rows = self.call(who, op, "SELECT jobcap.enqueue_jobs(%s::text, %s::jsonb[], %s::timestamptz,"
                             " %s::int4, %s::int4)",
                             (self.name(), self.payloads(), self.timestamp(),
                              self.int4(good=(0,)), self.pick(None, None, *[self.int4()])))
            if rows and rows[0][0]:
                self.jobs.extend(j for j in rows[0][0] if j not in self.jobs)
        elif op == "claim_job":
            rows = self.call(who, op, "SELECT * FROM jobcap.claim_job(%s::text, %s::text, %s::int4, %s::interval)",
                             (self.name(), self.worker(), self.int4(), self.interval()))
            self.claimed(rows, op)
        elif op == "claim_job_by_id":
            rows = self.call(who, op, "SELECT * FROM jobcap.claim_job_by_id(%s::int8, %s::text, %s::interval)",
                             (self.job_id(), self.worker(), self.interval()))
            self.claimed(rows, op)
        elif op == "complete_and_claim":
            job = self.job_id()
            rows = self.call(who, op, "SELECT * FROM jobcap.complete_and_claim(%s::int8, %s::int8, %s::text,"
                             " %s::text, %s::int4, %s::interval)",
                             (job, self.fence_for(job), self.name(), self.worker(), self.int4(),
                              self.interval()))
            self.claimed(rows, op)
        elif op in ("complete_job", "assert_fence"):
            job = self.job_id()
            self.call(who, op, f"SELECT jobcap.{op}(%s::int8, %s::int8)", (job, self.fence_for(job)))
        elif op == "complete_jobs":
            jobs = [self.job_id() for _ in range(self.rng.randint(0, 4))]
            fences = [self.fence_for(j) for j in jobs]
            if self.hostile():
                fences = self.pick(fences[:-1], fences + [1], None, [None] * len(jobs))
            self.call(who, op, "SELECT jobcap.complete_jobs(%s::int8[], %s::int8[])",
                      (None if None in jobs and self.hostile() else [j for j in jobs], fences))
        elif op == "fail_job":
            job = self.job_id()
            self.call(who, op, "SELECT jobcap.fail_job(%s::int8, %s::int8, %s::text, %s::interval)",
                      (job, self.fence_for(job),
                       self.pick("boom", None, "", "e" * 5000, "\x01\n") if self.rng.random() < 0.995
                       else "e" * 3 * 1024 * 1024,
                       self.interval(good=(None, "0", "0", "1 second"))))
        elif op == "heartbeat":
            job = self.job_id()
            self.call(who, op, "SELECT jobcap.heartbeat(%s::int8, %s::int8, %s::interval)",
                      (job, self.fence_for(job), self.interval()))
        elif op == "reap_jobs":
            self.call(who, op, "SELECT * FROM jobcap.reap_jobs(%s::int4)", (self.int4(good=(1, 10, 1000)),))
        elif op == "cancel_job":
            self.call(who, op, "SELECT jobcap.cancel_job(%s::int8)", (self.job_id(),))
        elif op == "requeue_job":
            self.call(who, op, "SELECT jobcap.requeue_job(%s::int8, %s::text, %s::int4)",
                      (self.job_id(), self.pick("again", "again", None, "", "r" * 10240, "\x01"),
                       self.pick(None, None, *[self.int4()])))
        elif op == "create_queue":
            q = self.name()
            cap = self.pick(None, *[self.int4(good=(1, 2, 3))])
            rows = self.call(who, op, "SELECT jobcap.create_queue(%s::text, %s::int4, %s::interval,"
                             " %s::interval, %s::interval, %s::bool)",
                             (q, cap, self.interval(good=("5 minutes",)), self.interval(good=("0",)),
                              self.interval(good=("0", "1 second")), self.pick(False, True, None)))
            if rows is not None:
                self.max_cap[q] = max(self.max_cap.get(q, 0), cap or 10)
        elif op == "alter_queue":
            q = self.name()
            cap = self.pick(None, *[self.int4(good=(1, 2, 3, 4))])
            rows = self.call(who, op, "SELECT jobcap.alter_queue(%s::text, %s::int4, %s::interval,"
                             " %s::interval, %s::interval, %s::bool)",
                             (q, cap, self.interval(), self.interval(good=(None, "0")),
                              self.interval(good=(None, "0", "1 second")), self.pick(None, False, True)))
            if rows is not None and cap:
                self.max_cap[q] = max(self.max_cap.get(q, 0), cap)
        elif op == "drop_queue":
            q = self.name()
            rows = self.call(who, op, "SELECT jobcap.drop_queue(%s::text, %s::bool)",
                             (q, self.pick(False, True, None)))
            if rows is not None and q in QUEUES:
                cap = self.rng.choice([1, 2, 3])
                self.max_cap[q] = max(self.max_cap.get(q, 0), cap)
                self.admin("SELECT jobcap.create_queue(%s, max_attempts => %s, backoff_base => '0',"
                           " backoff_max => '0')", (q, cap))
                if q in GRANTED:
                    self.admin("SELECT jobcap.grant_queue(%s, 'fuzz_worker')", (q,))
        elif op == "grant_queue":
            self.call(who, op, "SELECT jobcap.grant_queue(%s::text, %s::text)",
                      (self.name(), self.pick("fuzz_idle", "fuzz_worker", "nobody", None, "", "x" * 100)))
        elif op == "revoke_queue":
            self.call(who, op, "SELECT jobcap.revoke_queue(%s::text, %s::text)",
                      (self.name(), self.pick("fuzz_idle", "nobody", None, "", "x" * 100)))
            # Put the worker's grants back, so that it keeps working its queues.
            for q in GRANTED:
                self.admin("SELECT jobcap.grant_queue(%s, 'fuzz_worker')", (q,))
        elif op == "statements":
            self.call(who, op, "SELECT count(*) FROM jobcap.statements()")
        elif op == "backoff":
            self.call(who, op, "SELECT jobcap.backoff(%s::int4, %s::interval, %s::interval)",
                      (self.int4(), self.interval(good=("1 second",)), self.interval(good=("1 hour",))))
        elif op == "expire":
            # Leases run out by hand, as the tests do, so the reaper has work.
            self.admin("UPDATE jobcap.jobs SET lease_expires_at = now() - interval '1 second'"
                       " WHERE state = 'running' AND job_id %% 3 = %s", (r.randint(0, 2),))
        elif op == "transaction" and self.busy is None:
            self.transaction()

    def transaction(self):
        """Several lifecycle calls in one explicit transaction of one session, maybe with a
        savepoint, then COMMIT or ROLLBACK. Other sessions meanwhile hit its row locks."""
        who = self.rng.choice(["owner", "worker"])
        self.who = who
        conn = self.sessions[who]
        try:
            conn.execute("BEGIN")
        except psycopg.errors.Error:
            return
        for _ in range(self.rng.randint(1, 4)):
            if self.rng.random() < 0.15:
                self.call(who, "savepoint", "SAVEPOINT s")
            self.step_in(who)
            # Another session, outside the transaction, meets its locks.
            if self.rng.random() < 0.5 and self.busy is None:
                self.busy = who
                self.step()
                self.busy = None
        try:
            conn.execute(self.pick("COMMIT", "COMMIT", "ROLLBACK"))
        except psycopg.errors.Error as e:
            self.states[e.sqlstate or "client"] += 1
            conn.execute("ROLLBACK")

    def step_in(self, who):
        r = self.rng.random()
        job = self.job_id()
        if r < 0.3:
            self.claimed(self.call(who, "claim_job", "SELECT * FROM jobcap.claim_job(%s, %s)",
                                   (self.rng.choice(QUEUES), "tx")), "claim_job")
        elif r < 0.5:
            self.call(who, "assert_fence", "SELECT jobcap.assert_fence(%s::int8, %s::int8)",
                      (job, self.fence_for(job)))
        elif r < 0.7:
            self.call(who, "complete_job", "SELECT jobcap.complete_job(%s::int8, %s::int8)",
                      (job, self.fence_for(job)))
        elif r < 0.85:
            self.call(who, "fail_job", "SELECT jobcap.fail_job(%s::int8, %s::int8, 'tx')",
                      (job, self.fence_for(job)))
        else:
            self.call(who, "reap_jobs", "SELECT * FROM jobcap.reap_jobs()")

    # ---- after ----------------------------------------------------------------------------
    def check(self):
        su = self.su
        for who, conn in self.sessions.items():
            try:
                conn.execute("SELECT 1")
            except psycopg.Error as e:
                self.failures.append(f"session {who} is gone: {e}")
        checks = {
            "claim added other than one attempt":
                "old_state = 'pending' AND new_state = 'running' AND new_attempts <> old_attempts + 1",
            "claim went past the cap in force":
                "old_state = 'pending' AND new_state = 'running' AND new_attempts > cap",
            "claim kept or lowered the fence":
                "old_state = 'pending' AND new_state = 'running' AND new_fence <= old_fence",
            "running entered other than by a claim":
                "new_state = 'running' AND old_state <> 'pending'",
            "fence went back": "new_fence < old_fence",
            "attempts went back": "new_attempts < old_attempts",
            "fence changed without a claim or a requeue":
                "new_fence <> old_fence AND NOT (old_state = 'pending' AND new_state = 'running')"
                " AND NOT (old_state IN ('dead', 'cancelled') AND new_state = 'pending'"
                " AND query LIKE '%requeue%')",
            "succeeded was left": "old_state = 'succeeded' AND new_state <> 'succeeded'",
            "dead or cancelled left other than by requeue_job":
                "old_state IN ('dead', 'cancelled') AND new_state <> old_state"
                " AND NOT (new_state = 'pending' AND query LIKE '%requeue_job%')",
        }
        for what, where in checks.items():
            n, example = su.execute(f"SELECT count(*), min(concat_ws(' ', job_id, old_state, new_state,"
                                    f" old_fence, new_fence, old_attempts, new_attempts, cap, query))"
                                    f" FROM public.fuzz_log WHERE {where}").fetchone()
            if n:
                self.failures.append(f"invariant: {what}: {n} times, e.g. {example}")
        dup = su.execute("SELECT count(*) FROM (SELECT new_fence FROM public.fuzz_log"
                         " WHERE old_state = 'pending' AND new_state = 'running'"
                         " GROUP BY new_fence HAVING count(DISTINCT job_id) > 1) d").fetchone()[0]
        if dup:
            self.failures.append(f"invariant: {dup} fences were given to more than one job")
        over = su.execute("SELECT count(*) FROM jobcap.jobs j WHERE j.max_attempts IS NOT NULL"
                          " AND j.attempts > j.max_attempts").fetchone()[0]
        if over:
            self.failures.append(f"invariant: {over} jobs have more attempts than their own budget")
        for q, cap in self.max_cap.items():
            n = su.execute("SELECT count(*) FROM jobcap.jobs WHERE queue = %s AND max_attempts IS NULL"
                           " AND attempts > %s", (q, cap)).fetchone()[0]
            if n:
                self.failures.append(f"invariant: {n} jobs of {q!r} have more attempts than any cap it had")
        self.logged = su.execute("SELECT count(*), count(*) FILTER (WHERE new_state = 'running'),"
                                 " count(*) FILTER (WHERE old_state IN ('dead', 'cancelled')"
                                 " AND new_state = 'pending') FROM public.fuzz_log").fetchone()
        self.final = su.execute("SELECT state, count(*) FROM jobcap.jobs GROUP BY 1 ORDER BY 1").fetchall()
        if su.execute("SELECT pg_postmaster_start_time()").fetchone()[0] != self.start_time:
            self.failures.append("the postmaster restarted")
        for conn in self.sessions.values():
            conn.close()
        su.close()
        with open(os.path.join(self.data, "postmaster.pid")) as f:
            pid = int(f.readline())
        if pid != self.pid:
            self.failures.append(f"postmaster pid changed: {self.pid} -> {pid}")
        with open(self.log, errors="replace") as f:
            log = f.read()
        for pattern in ("terminated by signal", "was terminated by exception", "PANIC:",
                        "server process .* exited with exit code [^01]"):
            for m in re.finditer(pattern, log):
                line = log[log.rfind("\n", 0, m.start()) + 1:log.find("\n", m.end())]
                self.failures.append(f"server log: {line}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dir", required=True, help="an empty directory for the instance")
    p.add_argument("--seed", type=int, default=20261130)
    p.add_argument("--calls", type=int, default=100000)
    p.add_argument("--port", type=int, default=55400 + os.getpid() % 500)
    args = p.parse_args()

    f = Fuzzer(args)
    f.start()
    began = time.time()
    try:
        f.setup()
        while f.calls < args.calls:
            f.step()
        f.check()
    finally:
        f.stop()
    took = time.time() - began

    print(f"seed {args.seed}: {f.calls} calls in {took:.1f} s ({f.calls / took:.0f}/s)")
    print("calls per function: " + ", ".join(f"{k} {v}" for k, v in sorted(f.per_function.items())))
    print(f"distinct SQLSTATEs: {len([s for s in f.states if s != 'ok'])}")
    for state, n in sorted(f.states.items()):
        print(f"  {state:6} {n}")
    print(f"logged job changes: {f.logged[0]} (claims {f.logged[1]}, requeues {f.logged[2]});"
          " jobs at the end: " + ", ".join(f"{s} {n}" for s, n in f.final))
    print(f"postmaster pid {f.pid} unchanged, no crash in the log" if not any(
        "postmaster" in x or "server log" in x for x in f.failures) else "SERVER PROBLEM")
    if f.failures:
        print(f"FAILED: {len(f.failures)} problems")
        for x in f.failures[:50]:
            print("  " + x)
        return 1
    print("invariants hold: claims within the cap in force, one attempt each, fences new, unique"
          " and monotonic, attempts never back, terminal states left only by requeue_job")
    return 0


if __name__ == "__main__":
    sys.exit(main())
