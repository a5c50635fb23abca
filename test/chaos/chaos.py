"""jobcap's chaos harness: real worker processes in two languages against a throwaway cluster,
killed, frozen and cut off from the server on purpose, then an audit in SQL that counts what
was lost. Run it with test/chaos/run (which builds the private install first).

The run, bounded in time and stopping by itself:
  1. a throwaway cluster (shared_preload_libraries = 'jobcap') from the private install, as the
     postgres user when we are root, on a Unix socket in its own directory;
  2. N jobs of five kinds, enqueued in paced transactions on a notify queue:
       normal  writes its effect and completes
       poison  always raises (dies at its cap through fail_job)
       killer  writes an effect, then SIGKILLs its own worker process (dies at its cap through
               the reaper: nothing after the kill runs)
       hanger  its lease runs out while it works; it waits for the reaper, tries an effect
               under the stale fence (assert_fence must reject it), then tries to complete
               (complete_job must reject it); it behaves on its next attempt
       flaky   fails on its first k attempts, then succeeds
       child   a normal job enqueued with depends_on: one to three jobs of any kind enqueued
               shortly before it (so mostly still in flight), half of them with
               parent_outputs; it must run once after all its parents succeeded, or be
               cancelled (never claimed) when one of them ended dead or cancelled;
  3. Python and Node workers at once; the harness SIGKILLs random workers and restarts every
     worker that dies; SIGSTOPs a worker past its lease and SIGCONTs it; restarts the server
     once with pg_ctl -m immediate;
  4. when every job is terminal (or the time bound is hit), SIGTERM to every worker (each must
     exit cleanly), then the audit table. Exit status 0 only when every fault count is zero
     and every path that must be exercised was.

Every handler writes its effect in the same transaction as complete_job; the effects table is
deliberately not unique on job_id, so a double application is counted, not prevented.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import pwd
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback

import psycopg
from psycopg.types.json import Jsonb

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
KINDS = ("normal", "poison", "killer", "hanger", "flaky", "child")

SCHEMA = """
CREATE EXTENSION IF NOT EXISTS jobcap;
-- What the harness enqueued, written in the enqueueing transaction: idx is the job's place in
-- the plan (children name their parents by it), parents the ids its depends_on named.
CREATE TABLE chaos_jobs (job_id bigint PRIMARY KEY, kind text NOT NULL, cap int NOT NULL,
                         idx int, parents bigint[], outputs boolean NOT NULL DEFAULT false);
CREATE INDEX ON chaos_jobs (idx);
-- One row per applied effect. Not unique on job_id on purpose: a second application is counted.
CREATE TABLE effects (job_id bigint NOT NULL, fence bigint NOT NULL, worker text NOT NULL,
                      at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE INDEX ON effects (job_id);
-- What workers saw: stale fences rejected, hanger steps.
CREATE TABLE events (at timestamptz NOT NULL DEFAULT clock_timestamp(), worker text,
                     job_id bigint, fence bigint, event text NOT NULL);
"""


def log(msg: str) -> None:
    sys.stdout.write(f"{msg}\n")
    sys.stdout.flush()


# --- the cluster --------------------------------------------------------------------------------

class Cluster:
    def __init__(self, bindir: str, workdir: str):
        self.bindir = bindir
        self.dir = workdir
        self.data = os.path.join(workdir, "data")
        self.logfile = os.path.join(workdir, "postgres.log")
        self.as_postgres = os.geteuid() == 0
        if self.as_postgres:
            pw = pwd.getpwnam("postgres")
            os.chown(workdir, pw.pw_uid, pw.pw_gid)
        self.conninfo = f"host={workdir} port=5432 user=postgres dbname=postgres"
        self.connection = {"host": workdir, "port": 5432, "user": "postgres",
                           "database": "postgres"}
        self.running = False

    def _pg(self, *args: str) -> None:
        cmd = [os.path.join(self.bindir, args[0]), *args[1:]]
        if self.as_postgres:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(args[:2])} failed:\n{done.stdout}{done.stderr}")

    def init(self, settings: dict) -> None:
        self._pg("initdb", "-D", self.data, "-U", "postgres", "-A", "trust", "--no-sync",
                 "-E", "UTF8", "--locale=C")
        conf = {"listen_addresses": "''", "unix_socket_directories": f"'{self.dir}'",
                "port": "5432", "shared_preload_libraries": "'jobcap'",
                "max_connections": "100", "shared_buffers": "64MB",
                # A crash of the server processes is what we inject, not of the machine: the
                # WAL in the page cache survives pg_ctl -m immediate, so fsync buys nothing here.
                "fsync": "off", "log_min_messages": "warning", "log_line_prefix": "'%m [%p] '"}
        conf.update(settings)
        with open(os.path.join(self.data, "postgresql.conf"), "a") as f:
            f.writelines(f"{k} = {v}\n" for k, v in conf.items())

    def start(self) -> None:
        self._pg("pg_ctl", "-D", self.data, "-l", self.logfile, "-w", "-t", "60", "start")
        self.running = True

    def restart_immediate(self) -> None:
        self._pg("pg_ctl", "-D", self.data, "-l", self.logfile, "-m", "immediate", "-w",
                 "-t", "60", "restart")

    def restart_fast(self) -> None:
        self._pg("pg_ctl", "-D", self.data, "-l", self.logfile, "-m", "fast", "-w", "-t", "60",
                 "restart")

    def stop(self) -> None:
        if self.running:
            try:
                self._pg("pg_ctl", "-D", self.data, "-m", "fast", "-w", "-t", "60", "stop")
            except RuntimeError:
                self._pg("pg_ctl", "-D", self.data, "-m", "immediate", "-w", "stop")
            self.running = False


class CitusCluster(Cluster):
    """--citus: a coordinator and two worker nodes (shared_preload_libraries = 'citus,jobcap',
    Citus built by test/citus/build into the private install named by JOBCAP_PG_BINDIR), each
    listening on localhost (Citus's nodes reach each other by TCP) and on a Unix socket in the
    run's directory. The workers connect to the coordinator; restart_immediate() restarts the
    worker node that holds the chaos queue's shard, where its jobs are."""

    PORTS = (25491, 25492, 25493)  # below the ephemeral ports (test/citus/cluster.sh)

    def __init__(self, bindir: str, workdir: str):
        super().__init__(bindir, workdir)
        self.nodes = [os.path.join(workdir, f"n{i}") for i in range(3)]
        self.data = self.nodes[0]
        self.logs = [os.path.join(workdir, f"n{i}.log") for i in range(3)]
        self.logfile = self.logs[0]
        port = self.PORTS[0]
        self.conninfo = f"host={workdir} port={port} user=postgres dbname=postgres"
        self.connection = dict(self.connection, port=port)
        self.shard_node = None  # the index of the node that holds the chaos queue's shard

    def node_conninfo(self, i: int) -> str:
        return f"host={self.dir} port={self.PORTS[i]} user=postgres dbname=postgres"

    def init(self, settings: dict) -> None:
        for i, data in enumerate(self.nodes):
            self._pg("initdb", "-D", data, "-U", "postgres", "-A", "trust", "--no-sync",
                     "-E", "UTF8", "--locale=C")
            conf = {"listen_addresses": "'localhost'", "unix_socket_directories": f"'{self.dir}'",
                    "port": str(self.PORTS[i]), "shared_preload_libraries": "'citus,jobcap'",
                    "max_connections": "200", "shared_buffers": "32MB", "fsync": "off",
                    "jobcap.reap_interval": "'200ms'", "log_min_messages": "warning",
                    "log_line_prefix": "'%m [%p] '"}
            conf.update(settings)
            with open(os.path.join(data, "postgresql.conf"), "a") as f:
                f.writelines(f"{k} = {v}\n" for k, v in conf.items())

    def start(self) -> None:
        for data, logfile in zip(self.nodes, self.logs):
            self._pg("pg_ctl", "-D", data, "-l", logfile, "-w", "-t", "60", "start")
        self.running = True
        for i in range(3):
            with psycopg.connect(self.node_conninfo(i), autocommit=True) as conn:
                conn.execute("CREATE EXTENSION citus")
                conn.execute("CREATE EXTENSION jobcap")
        with psycopg.connect(self.conninfo, autocommit=True) as conn:
            conn.execute("SELECT citus_set_coordinator_host('localhost', %s)", (self.PORTS[0],))
            for port in self.PORTS[1:]:
                conn.execute("SELECT citus_add_node('localhost', %s)", (port,))

    def distribute(self, conn) -> None:
        """jobcap.distribute(), then which node holds the chaos queue's shard."""
        conn.execute("SELECT jobcap.distribute(shard_count => 8)")
        port = conn.execute(
            "SELECT n.nodeport FROM pg_dist_placement p JOIN pg_dist_node n USING (groupid)"
            " WHERE p.shardid = get_shard_id_for_distribution_column('jobcap.jobs', 'chaos')"
        ).fetchone()[0]
        self.shard_node = self.PORTS.index(port)

    def restart_immediate(self) -> None:
        i = self.shard_node
        self._pg("pg_ctl", "-D", self.nodes[i], "-l", self.logs[i], "-m", "immediate", "-w",
                 "-t", "60", "restart")

    def restart_fast(self) -> None:
        raise RuntimeError("a Citus run sets its settings in postgresql.conf; nothing restarts")

    def stop(self) -> None:
        if self.running:
            for data in self.nodes:
                try:
                    self._pg("pg_ctl", "-D", data, "-m", "fast", "-w", "-t", "60", "stop")
                except RuntimeError:
                    self._pg("pg_ctl", "-D", data, "-m", "immediate", "-w", "stop")
            self.running = False


class Db:
    """One autocommit connection that reconnects (the server restarts under it)."""

    def __init__(self, conninfo: str, app: str):
        self.conninfo = conninfo
        self.app = app
        self.conn = None
        self.options = ""  # server settings of every (re)connection, as libpq's options

    def get(self) -> psycopg.Connection:
        if self.conn is None or self.conn.closed or self.conn.broken:
            extra = {"options": self.options} if self.options else {}  # else PGOPTIONS holds
            self.conn = psycopg.connect(self.conninfo, autocommit=True, application_name=self.app,
                                        connect_timeout=5, **extra)
        return self.conn

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()


# What a stalled harness loop reports of each node: its sessions that are not idle, with what
# they wait on and whom they wait for.
ACTIVITY = """
SELECT pid, coalesce(nullif(application_name, ''), backend_type), state,
       wait_event_type || ':' || wait_event, pg_blocking_pids(pid),
       left(regexp_replace(query, '\\s+', ' ', 'g'), 120)
  FROM pg_stat_activity
 WHERE pid <> pg_backend_pid() AND state IS DISTINCT FROM 'idle'
   AND (datname = current_database() OR datname IS NULL AND backend_type LIKE 'jobcap%')
 ORDER BY pid
"""


# A node's prepared transactions: they hold their locks with no session (pg_blocking_pids shows 0).
PREPARED = "SELECT 'prepared', gid, prepared, owner FROM pg_prepared_xacts ORDER BY prepared"


class Watchdog(threading.Thread):
    """The harness loop alone thaws frozen workers and restarts dead ones, so a stall of its
    own starves the run and the audit then fails far from the cause. After `after` seconds
    without a beat, the watchdog logs (once per stall) where the loop stands and what every
    node's sessions wait on."""

    def __init__(self, conninfos: list, after: float = 8.0):
        super().__init__(name="watchdog", daemon=True)
        self.conninfos = conninfos
        self.after = after
        self.beat_at = time.monotonic()
        self.done = threading.Event()
        self.main = threading.main_thread().ident

    def beat(self) -> None:
        self.beat_at = time.monotonic()

    def run(self) -> None:
        reported = None
        while not self.done.wait(1.0):
            beat = self.beat_at
            if time.monotonic() - beat < self.after or reported == beat:
                continue
            reported = beat
            frame = sys._current_frames().get(self.main)
            # The harness's own frames (which call), then the innermost (what it waits in).
            stack = traceback.extract_stack(frame) if frame else []
            ours = [f for f in stack if f.filename == __file__][-2:] + stack[-1:]
            where = "".join(traceback.format_list(ours)).rstrip() or "?"
            lines = [f"watchdog: the harness loop has not turned for "
                     f"{time.monotonic() - beat:.0f}s; it stands at:", where]
            for i, conninfo in enumerate(self.conninfos):
                try:
                    with psycopg.connect(conninfo, autocommit=True, connect_timeout=3,
                                         options="-c statement_timeout=3s") as conn:
                        rows = conn.execute(ACTIVITY).fetchall()
                        rows += conn.execute(PREPARED).fetchall()
                    lines += [f"  node {i}: " + " | ".join(map(str, row)) for row in rows]
                except psycopg.Error as error:
                    lines.append(f"  node {i}: {str(error).strip()}")
            log("\n".join(lines))


# --- the reaper loop (--reaper loop: the no-preload path) ------------------------------------------

class ReaperLoop(threading.Thread):
    def __init__(self, conninfo: str, interval: float):
        super().__init__(name="reaper", daemon=True)
        self.db = Db(conninfo, "chaos reaper loop")
        self.interval = interval
        self.done = threading.Event()
        self.reaped = 0

    def run(self) -> None:
        while not self.done.wait(self.interval):
            try:
                self.reaped += len(self.db.get().execute(
                    "SELECT job_id FROM jobcap.reap_jobs()").fetchall())
            except psycopg.Error:
                pass  # the server is restarting
        self.db.close()


# --- the workers --------------------------------------------------------------------------------

def catches_sigterm(pid: int) -> bool:
    """Whether the process has a handler for SIGTERM (SigCgt in /proc/PID/status)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            caught = next(int(line.split()[1], 16) for line in f if line.startswith("SigCgt:"))
    except (OSError, StopIteration):
        return True  # gone, or no procfs: nothing to wait for
    return bool(caught & (1 << (signal.SIGTERM - 1)))


class Fleet:
    def __init__(self, cluster: Cluster, args, logfile):
        self.cluster = cluster
        self.args = args
        self.logfile = logfile
        self.slots = [("py", i) for i in range(args.py_workers)] + \
                     [("node", i) for i in range(args.node_workers)]
        self.procs: dict = {}           # slot -> Popen
        self.started: dict = {}         # slot -> monotonic start
        self.names: dict = {}           # slot -> the worker name of its current process
        self.restart_at: dict = {}      # slot -> when to restart
        self.generation = collections.Counter()
        self.harness_kills = 0
        self.self_kills = 0             # SIGKILLs the harness did not send: killer jobs
        self.crashes = []               # unexpected exits
        self.stopped: set = set()       # slots under SIGSTOP
        self.thawed: dict = {}          # slot -> monotonic time of its SIGCONT
        self.killed_by_us: set = set()  # pids
        self.env = dict(os.environ, CHAOS_LEASE=str(args.lease), CHAOS_TIMEOUT=str(args.timeout),
                        CHAOS_BATCH=str(args.batch), CHAOS_CONCURRENCY=str(args.concurrency))

    def spawn(self, slot) -> None:
        lang, i = slot
        self.generation[slot] += 1
        name = f"{lang}{i}.{self.generation[slot]}"
        self.names[slot] = name
        if lang == "py":
            cmd = [sys.executable, os.path.join(HERE, "worker.py"), self.cluster.conninfo, name]
        else:
            cmd = ["node", os.path.join(HERE, "worker.js"), json.dumps(self.cluster.connection),
                   name]
        self.procs[slot] = subprocess.Popen(cmd, stdout=self.logfile, stderr=subprocess.STDOUT,
                                            env=self.env, stdin=subprocess.DEVNULL)
        self.started[slot] = time.monotonic()

    def start_all(self) -> None:
        for slot in self.slots:
            self.spawn(slot)

    def alive(self, lang=None) -> list:
        return [s for s, p in self.procs.items()
                if p is not None and p.poll() is None and (lang is None or s[0] == lang)]

    def tend(self, restarting: bool) -> None:
        """Notes exits, and restarts the dead after a short pause."""
        now = time.monotonic()
        for slot, proc in list(self.procs.items()):
            if proc is None:
                if restarting and now >= self.restart_at.get(slot, 0):
                    self.spawn(slot)
                continue
            code = proc.poll()
            if code is None:
                continue
            if code == -signal.SIGKILL:
                if proc.pid in self.killed_by_us:
                    self.killed_by_us.discard(proc.pid)
                else:
                    self.self_kills += 1
            else:
                self.crashes.append(f"{slot[0]}{slot[1]} exited with {code} during the run")
            self.procs[slot] = None
            self.stopped.discard(slot)
            self.restart_at[slot] = now + random.uniform(0.2, 0.6)

    def kill_random(self, rng: random.Random):
        """SIGKILLs a worker, not one frozen or thawed less than a lease ago: a thawed worker's
        first calls are the stale ones the freeze is for. Returns its name, or None."""
        now = time.monotonic()
        candidates = [s for s in self.alive() if s not in self.stopped
                      and now - self.started[s] > 1.0
                      and now - self.thawed.get(s, -1e9) > self.args.lease]
        if not candidates:
            return None
        slot = rng.choice(candidates)
        proc = self.procs[slot]
        self.killed_by_us.add(proc.pid)
        proc.send_signal(signal.SIGKILL)
        # Reaped now, so that it no longer counts as alive: the freeze that may follow in the
        # same turn must not pick it (its leases still look held).
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            pass  # not dead yet (in the kernel): tend() sees it go
        self.harness_kills += 1
        return self.names[slot]

    def freeze(self, lang: str, rng: random.Random, holding: set):
        """SIGSTOPs a worker of `lang`, one that holds a lease (`holding`: worker names) if any."""
        candidates = [s for s in self.alive(lang) if s not in self.stopped]
        if not candidates:
            return None
        candidates = [s for s in candidates if self.names[s] in holding] or candidates
        slot = rng.choice(candidates)
        self.procs[slot].send_signal(signal.SIGSTOP)
        self.stopped.add(slot)
        return slot

    def thaw(self, slot) -> None:
        proc = self.procs.get(slot)
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
        self.stopped.discard(slot)
        self.thawed[slot] = time.monotonic()

    def stop_all(self, grace: float = 15.0) -> None:
        """SIGTERM to each worker; each must finish what it holds and exit 0."""
        for slot in list(self.stopped):
            self.thaw(slot)
        # A worker that has just started may not have its SIGTERM handler yet: wait until each
        # Python worker has one, as the kernel shows it (up to 20 s: a loaded machine starts
        # Python slowly), and each worker has lived 1.5 s (Node catches SIGTERM from its start,
        # to restore the terminal, so for Node the kernel cannot tell).
        end = time.monotonic() + 20
        while time.monotonic() < end and any(
                time.monotonic() - self.started[s] < 1.5 or not catches_sigterm(self.procs[s].pid)
                for s in self.alive()):
            time.sleep(0.1)
        for slot in self.alive():
            self.procs[slot].send_signal(signal.SIGTERM)
        end = time.monotonic() + grace
        for slot, proc in self.procs.items():
            if proc is None:
                continue
            try:
                code = proc.wait(max(end - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                self.crashes.append(f"{slot[0]}{slot[1]} did not stop within {grace:g}s of SIGTERM")
                continue
            if code != 0 and proc.pid not in self.killed_by_us:
                self.crashes.append(f"{slot[0]}{slot[1]} exited with {code} on SIGTERM")

    def kill_all(self) -> None:
        for proc in self.procs.values():
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()


# --- the plan -----------------------------------------------------------------------------------

def plan(args, rng: random.Random) -> list:
    shares = [("poison", args.poison), ("killer", args.killer), ("hanger", args.hanger),
              ("flaky", args.flaky)]
    children = getattr(args, "children", 0)  # the failover run plans none
    if children:
        shares.append(("child", children))
    counts = {k: max(args.min_each, round(args.jobs * share)) for k, share in shares}
    counts["normal"] = args.jobs - sum(counts.values())
    caps = {"normal": 20, "hanger": 20, "flaky": 20, "poison": 3, "killer": 2, "child": 20}
    jobs = []
    for kind, n in counts.items():
        for _ in range(n):
            # A child's handler does what a normal job's does; only its enqueue differs.
            payload = {"kind": "normal" if kind == "child" else kind,
                       "work_ms": rng.randint(0, args.work_ms)}
            if kind == "flaky":
                payload["fail_times"] = rng.randint(1, 3)
            if kind == "hanger":
                payload["hang_attempts"] = 1
            jobs.append({"kind": kind, "cap": caps[kind], "payload": payload})
    rng.shuffle(jobs)
    for i, job in enumerate(jobs):
        job["idx"] = i
        if job["kind"] != "child":
            continue
        # Parents from the batches just before this one's: committed, and mostly still pending
        # or running when the child arrives, so their settles race each other and the child.
        start = i - i % args.txn
        window = range(max(0, start - 12 * args.txn), start)
        if not window:
            job["kind"] = "normal"
            continue
        parents = rng.sample(window, min(len(window), rng.choice((1, 1, 2, 3))))
        # Doomed parents are few (2.5% of jobs): a quarter of the children get one on purpose,
        # so cancellation is exercised in a short run too.
        doomed = [k for k in window if jobs[k]["kind"] in ("poison", "killer")]
        if doomed and rng.random() < 0.25:
            parents = list({*parents[:2], rng.choice(doomed)})
        job["parent_idx"] = parents
        job["parent_outputs"] = rng.random() < 0.5
    return jobs


def enqueue_rows(batch: list) -> list:
    """A batch as ENQUEUE's JSON rows."""
    keys = ("kind", "cap", "payload", "idx", "parent_idx", "parent_outputs")
    return [{k: j[k] for k in keys if k in j} for j in batch]


# A child's depends_on is looked up here from its parents' places in the plan: a batch whose
# commit the harness could not confirm was enqueued again, and a child then waits for both.
ENQUEUE = """
WITH p AS (SELECT p.*, (SELECT array_agg(c.job_id ORDER BY c.job_id) FROM chaos_jobs c
                         WHERE c.idx = ANY(p.parent_idx)) AS parents
             FROM jsonb_to_recordset(%s)
                  AS p(kind text, cap int, payload jsonb, idx int, parent_idx int[],
                       parent_outputs boolean))
INSERT INTO chaos_jobs (job_id, kind, cap, idx, parents, outputs)
SELECT jobcap.enqueue_job('chaos', p.payload, max_attempts => p.cap, depends_on => p.parents,
                          parent_outputs => coalesce(p.parent_outputs, false)),
       p.kind, p.cap, p.idx, p.parents, coalesce(p.parent_outputs, false)
  FROM p
"""


# On Citus a call of enqueue_job reaches the queue's shard only as a statement of its own with
# constant arguments (Citus delegates it there): one statement per job, in the batch's
# transaction, each job recorded after it.
def enqueue_each(conn, batch: list) -> None:
    for job in batch:
        parents = None
        if job.get("parent_idx"):
            parents = conn.execute("SELECT array_agg(job_id ORDER BY job_id) FROM chaos_jobs"
                                   " WHERE idx = ANY(%s)", (job["parent_idx"],)).fetchone()[0]
        outputs = bool(job.get("parent_outputs"))
        job_id = conn.execute(
            "SELECT jobcap.enqueue_job('chaos', %s, max_attempts => %s, depends_on => %s,"
            " parent_outputs => %s)", (Jsonb(job["payload"]), job["cap"], parents, outputs)
        ).fetchone()[0]
        conn.execute("INSERT INTO chaos_jobs (job_id, kind, cap, idx, parents, outputs)"
                     " VALUES (%s, %s, %s, %s, %s, %s)",
                     (job_id, job["kind"], job["cap"], job["idx"], parents, outputs))


# --- the audit ----------------------------------------------------------------------------------

AUDIT = """
WITH j AS (SELECT j.*, coalesce(j.max_attempts, q.max_attempts) AS cap
             FROM jobcap.jobs j JOIN jobcap.queues q USING (queue) WHERE j.queue = 'chaos'),
     c AS (SELECT c.*, CASE WHEN c.kind IN ('poison', 'killer') THEN 'dead'
                            WHEN EXISTS (SELECT FROM jobcap.jobs p WHERE p.job_id = ANY(c.parents)
                                            AND p.state <> 'succeeded') THEN 'cancelled'
                            ELSE 'succeeded' END AS expected FROM chaos_jobs c)
SELECT
  (SELECT count(*) FROM c LEFT JOIN j USING (job_id)
    WHERE j.state IS NULL OR j.state NOT IN ('succeeded', 'dead', 'cancelled')) AS lost,
  (SELECT count(*) FROM j LEFT JOIN c USING (job_id) WHERE c.job_id IS NULL)
  + (SELECT count(*) FROM c JOIN j USING (job_id)
      WHERE j.state IN ('succeeded', 'dead', 'cancelled') AND j.state::text <> c.expected)
    AS unexpected,
  (SELECT count(*) FROM (SELECT FROM effects GROUP BY job_id HAVING count(*) > 1) d) AS twice,
  (SELECT count(*) FROM effects f LEFT JOIN j USING (job_id)
    WHERE j.job_id IS NULL OR j.state <> 'succeeded' OR f.fence <> j.fence) AS stale_accepted,
  (SELECT count(*) FROM j WHERE state = 'succeeded'
      AND NOT EXISTS (SELECT FROM effects f WHERE f.job_id = j.job_id)) AS no_effect,
  (SELECT count(*) FROM j WHERE attempts > cap) AS over_cap,
  (SELECT count(*) FROM j WHERE state = 'running'
      AND (lease_expires_at IS NULL OR lease_expires_at < now())) AS stuck,
  (SELECT count(*) FROM c JOIN j USING (job_id)
    WHERE c.kind IN ('poison', 'killer') AND j.state = 'dead' AND j.attempts = j.cap) AS capped,
  (SELECT count(*) FROM c WHERE kind IN ('poison', 'killer')) AS capped_expected,
  (SELECT count(*) FROM c JOIN j USING (job_id) WHERE c.kind = 'flaky' AND j.state = 'succeeded')
    AS flaky_ok,
  (SELECT count(*) FROM c WHERE kind = 'flaky') AS flaky_expected,
  (SELECT count(*) FROM events WHERE event = 'stale:complete_job') AS stale_rejected,
  (SELECT count(*) FROM events WHERE event = 'stale_effect_rejected') AS stale_effects_rejected,
  (SELECT count(*) FROM events WHERE event = 'stale_effect_accepted') AS stale_effects_accepted,
  (SELECT count(*) FROM c JOIN effects f USING (job_id)
    WHERE EXISTS (SELECT FROM jobcap.jobs p WHERE p.job_id = ANY(c.parents)
                     AND (p.finished_at IS NULL OR p.finished_at >= f.at))) AS early,
  (SELECT count(*) FROM c JOIN j USING (job_id)
    WHERE c.parents IS NOT NULL AND j.state = 'cancelled' AND j.attempts > 0) AS ran_cancelled,
  (SELECT count(*) FROM c JOIN j USING (job_id)
    WHERE c.outputs AND j.state = 'succeeded'
      AND (SELECT count(*) FROM jsonb_object_keys(coalesce(j.payload -> 'parent_outputs', '{}')))
          <> cardinality(c.parents)) AS outputs_wrong,
  (SELECT count(*) FROM c JOIN j USING (job_id) WHERE c.kind = 'child' AND j.state = 'succeeded')
    AS children_ok,
  (SELECT count(*) FROM c JOIN j USING (job_id) WHERE c.kind = 'child' AND j.state = 'cancelled')
    AS children_cancelled,
  (SELECT count(*) FROM c WHERE kind = 'child') AS children
"""


def audit(db: Db, citus: bool = False) -> dict:
    query = AUDIT
    if citus:
        # Citus cannot plan the audit's correlated subqueries over a distributed table: the
        # chaos queue's jobs (one shard) and the queues are copied to the coordinator first.
        conn = db.get()
        conn.execute("DROP TABLE IF EXISTS pg_temp.audit_jobs, pg_temp.audit_queues")
        conn.execute("CREATE TEMP TABLE audit_jobs AS SELECT * FROM jobcap.jobs"
                     " WHERE queue = 'chaos'")
        conn.execute("CREATE TEMP TABLE audit_queues AS SELECT * FROM jobcap.queues")
        query = AUDIT.replace("jobcap.jobs", "audit_jobs").replace("jobcap.queues",
                                                                     "audit_queues")
    cur = db.get().execute(query)
    row = cur.fetchone()
    return dict(zip([d.name for d in cur.description], row))


def details(db: Db) -> dict:
    conn = db.get()
    kinds = dict(conn.execute("SELECT kind, count(*) FROM chaos_jobs GROUP BY kind").fetchall())
    events = dict(conn.execute("SELECT event, count(*) FROM events GROUP BY event").fetchall())
    history = dict(conn.execute(
        "SELECT kind, count(*) FROM jobcap.job_errors WHERE queue = 'chaos' GROUP BY kind"
    ).fetchall())
    return {"kinds": kinds, "events": events, "history": history}


# --- the run ------------------------------------------------------------------------------------

class Progress:
    def __init__(self, tty: bool):
        self.tty = tty
        self.last_line = 0.0
        self.width = 0

    def event(self, text: str) -> None:
        """A line of its own (the live line goes on below it)."""
        if self.tty:
            sys.stdout.write("\r" + text + " " * max(self.width - len(text), 0) + "\n")
            sys.stdout.flush()
            self.width = 0
        else:
            log(text)
            self.last_line = time.monotonic()

    def show(self, text: str, force: bool = False) -> None:
        if self.tty:
            text = text[:shutil.get_terminal_size((200, 24)).columns - 1]
            pad = max(self.width - len(text), 0)
            sys.stdout.write("\r" + text + " " * pad)
            sys.stdout.flush()
            self.width = len(text)
        elif force or time.monotonic() - self.last_line >= 5:
            log(text)
            self.last_line = time.monotonic()

    def end(self) -> None:
        if self.tty:
            sys.stdout.write("\n")


def detect_reaper(cluster: Cluster, db: Db, wanted: str) -> str:
    """'worker' when the preloaded background worker reaps, 'loop' when the harness must."""
    settings = dict(db.get().execute(
        "SELECT name, setting FROM pg_settings WHERE name LIKE 'jobcap.%'").fetchall())
    has_worker = "jobcap.reap_interval" in settings
    if wanted == "worker" and not has_worker:
        raise SystemExit("--reaper=worker: this jobcap build has no background worker "
                         "(no jobcap.reap_interval setting)")
    mode = wanted if wanted != "auto" else ("worker" if has_worker else "loop")
    if mode == "worker":
        conn = db.get()
        conn.execute("ALTER SYSTEM SET jobcap.reap_interval = '200ms'")
        if settings.get("jobcap.database", "postgres") != "postgres":
            conn.execute("ALTER SYSTEM SET jobcap.database = 'postgres'")
            db.close()
            cluster.restart_fast()
        else:
            conn.execute("SELECT pg_reload_conf()")
        # The reaper must really be there: the audit would otherwise blame the clients.
        end = time.monotonic() + 15
        while not db.get().execute("SELECT count(*) FROM pg_stat_activity"
                                   " WHERE backend_type LIKE 'jobcap%'"
                                   " AND datname = current_database()").fetchone()[0]:
            if time.monotonic() > end:
                raise SystemExit("jobcap is preloaded but no jobcap background process runs; "
                                 f"see {cluster.logfile}")
            time.sleep(0.2)
    return mode


def detect_citus_reaper(cluster: CitusCluster) -> str:
    """On Citus the background worker of the node holding the shard reaps (set to 200 ms in
    postgresql.conf); the run fails if none serves that node's database."""
    end = time.monotonic() + 15
    with psycopg.connect(cluster.node_conninfo(cluster.shard_node), autocommit=True) as conn:
        while not conn.execute("SELECT count(*) FROM pg_stat_activity"
                               " WHERE backend_type LIKE 'jobcap%'"
                               " AND datname = current_database()").fetchone()[0]:
            if time.monotonic() > end:
                raise SystemExit("no jobcap background process runs on the node of the shard")
            time.sleep(0.2)
    return "worker"


def run(args) -> int:
    rng = random.Random(args.seed)
    random.seed(args.seed)
    workdir = tempfile.mkdtemp(prefix="jobcap-chaos-")
    cluster = (CitusCluster if args.citus else Cluster)(args.bindir, workdir)
    worker_log = open(os.path.join(workdir, "workers.log"), "w")
    fleet = None
    reaper = None
    db = None
    started = time.monotonic()
    try:
        cluster.init({})
        cluster.start()
        db = Db(cluster.conninfo, "chaos harness")
        db.get().execute(SCHEMA)
        db.get().execute("SELECT jobcap.create_queue('chaos', max_attempts => 20,"
                         " lease => %s, backoff_base => '100 ms', backoff_max => '1 s',"
                         " notify => true)", (f"{args.lease} s",))
        if args.citus:
            cluster.distribute(db.get())
            mode = detect_citus_reaper(cluster)
        else:
            mode = detect_reaper(cluster, db, args.reaper)
        if mode == "loop":
            reaper = ReaperLoop(cluster.conninfo, 0.2)
            reaper.start()
        jobs = plan(args, rng)
        kinds = collections.Counter(j["kind"] for j in jobs)
        log(f"jobcap chaos: {len(jobs)} jobs ({', '.join(f'{kinds[k]} {k}' for k in KINDS)}), "
            f"{args.py_workers} Python + {args.node_workers} Node workers, lease {args.lease:g}s, "
            f"timeout {args.timeout:g}s, reaper: "
            f"{'the preloaded background worker' if mode == 'worker' else 'harness loop'}, "
            f"cluster {workdir}")

        fleet = Fleet(cluster, args, worker_log)
        fleet.start_all()
        # No statement of the loop may wait long: a frozen worker can hold a job's row lock
        # (inside its transaction, after complete_job or assert_fence) that an enqueue naming
        # the job in depends_on waits for, and only this loop thaws the worker. A statement
        # cancelled by the timeout is retried as after a restart (QueryCanceled is an
        # OperationalError).
        db.options = "-c statement_timeout=5s"
        db.close()
        watchdog = Watchdog([cluster.node_conninfo(i) for i in range(3)] if args.citus
                            else [cluster.conninfo])
        watchdog.start()
        t0 = time.monotonic()
        E = args.enqueue_seconds
        deadline = t0 + args.max_seconds
        batches = [jobs[i:i + args.txn] for i in range(0, len(jobs), args.txn)]
        enqueued = 0
        next_batch = 0
        next_kill = t0 + E * 0.1 + rng.uniform(args.kill_every * 0.5, args.kill_every * 1.5)
        kills_until = t0 + E + 5
        freezes = [(t0 + E * 0.25, "py"), (t0 + E * 0.6, "node")]
        thaws = []
        froze = 0
        frozen = []
        restart_at = t0 + E * 0.45 if args.server_restart else None
        restarts = 0
        progress = Progress(sys.stdout.isatty() and not args.quiet_progress)
        counts = {}
        last_poll = 0.0
        finished = False
        while time.monotonic() < deadline:
            now = time.monotonic()
            watchdog.beat()
            # Enqueue on schedule: batch b is due at t0 + E * b / len(batches).
            try:
                while next_batch < len(batches) and now >= t0 + E * next_batch / len(batches):
                    batch = batches[next_batch]
                    with db.get().transaction():
                        if args.citus:
                            enqueue_each(db.get(), batch)
                        else:
                            db.get().execute(ENQUEUE, (Jsonb(enqueue_rows(batch)),))
                    enqueued += len(batch)
                    next_batch += 1
            except psycopg.errors.QueryCanceled:
                progress.event(f"[{time.monotonic() - t0:6.1f}s] an enqueue waited past 5s:"
                               " cancelled, its batch retried")
                db.close()
            except psycopg.OperationalError:
                db.close()  # the server is restarting; this batch is retried (if it committed
                #             and we could not tell, its jobs are recorded all the same)
            now = time.monotonic()  # the enqueue may have waited: thaws are timed from here
            # Chaos.
            if now >= next_kill and now < kills_until:
                killed = fleet.kill_random(rng)
                if killed:
                    progress.event(f"[{now - t0:6.1f}s] SIGKILL {killed}")
                next_kill = now + rng.uniform(args.kill_every * 0.5, args.kill_every * 1.5)
            # A freeze waits (up to 5 s) for a worker that holds a lease: one frozen while idle
            # exercises nothing.
            if freezes and now >= freezes[0][0]:
                due, lang = freezes[0]
                try:
                    holding = {w for (w,) in db.get().execute(
                        "SELECT DISTINCT worker FROM jobcap.jobs WHERE queue = 'chaos'"
                        " AND state = 'running'").fetchall()}
                except psycopg.OperationalError:
                    holding = set()
                    db.close()
                if not any(fleet.names[s] in holding for s in fleet.alive(lang)) \
                        and now < due + 5:
                    holding = None
                slot = fleet.freeze(lang, rng, holding) if holding is not None else None
                if holding is not None:
                    freezes.pop(0)
                if slot is not None:
                    froze += 1
                    frozen.append(fleet.names[slot])
                    progress.event(f"[{now - t0:6.1f}s] SIGSTOP {fleet.names[slot]} "
                                   f"({'holding a lease' if fleet.names[slot] in holding else 'idle'})"
                                   f" for {args.lease + 2:g}s")
                    thaws.append((now + args.lease + 2.0, slot))
            for when, slot in list(thaws):
                if now >= when:
                    fleet.thaw(slot)
                    progress.event(f"[{now - t0:6.1f}s] SIGCONT {fleet.names[slot]}")
                    thaws.remove((when, slot))
            if restart_at is not None and now >= restart_at:
                restart_at = None
                progress.event(f"[{now - t0:6.1f}s] restarting "
                               f"{'the worker node holding the shard' if args.citus else 'the server'}"
                               " (pg_ctl -m immediate)")
                began = time.monotonic()
                cluster.restart_immediate()
                restarts += 1
                progress.event(f"[{time.monotonic() - t0:6.1f}s] back after "
                               f"{time.monotonic() - began:.1f}s")
                db.close()
            fleet.tend(restarting=True)
            # Progress, and the end.
            if now - last_poll >= 0.5:
                last_poll = now
                try:
                    counts = dict(db.get().execute(
                        "SELECT state::text, count(*) FROM jobcap.jobs WHERE queue = 'chaos'"
                        " GROUP BY state").fetchall())
                except psycopg.OperationalError:
                    db.close()
                progress.show(
                    f"[{now - t0:6.1f}s] enqueued {enqueued}/{len(jobs)} | succeeded "
                    f"{counts.get('succeeded', 0)} dead {counts.get('dead', 0)} running "
                    f"{counts.get('running', 0)} pending {counts.get('pending', 0)} waiting "
                    f"{counts.get('waiting', 0)} cancelled {counts.get('cancelled', 0)} | workers "
                    f"{len(fleet.alive('py'))} py {len(fleet.alive('node'))} node | SIGKILL "
                    f"{fleet.harness_kills}+{fleet.self_kills} killers, SIGSTOP {froze}, "
                    f"restarts {restarts}")
                if next_batch == len(batches) and not thaws and \
                        counts.get("pending", 0) + counts.get("running", 0) \
                        + counts.get("waiting", 0) == 0 and counts:
                    finished = True
                    break
            time.sleep(0.05)
        progress.end()
        watchdog.done.set()
        watchdog.join(10)
        db.options = ""  # the audit's statements take what they take
        db.close()
        elapsed = time.monotonic() - t0
        if not finished:
            log(f"time bound of {args.max_seconds:g}s reached before every job was settled")
        fleet.stop_all()
        if reaper is not None:
            reaper.done.set()
            reaper.join()
        result = audit(db, args.citus)
        result["frozen_stale"] = db.get().execute(
            "SELECT count(*) FROM events WHERE event LIKE 'stale:%%' AND worker = ANY(%s)",
            (frozen,)).fetchone()[0]
        info = details(db)
        worker_log.flush()
        return report(args, result, info, fleet, froze, restarts, mode, elapsed, finished,
                      time.monotonic() - started)
    finally:
        teardown(fleet, worker_log, db, cluster.stop, workdir, args.keep)


def teardown(fleet, worker_log, db, stop, workdir, keep) -> None:
    """The end of a run (this one, test/failover's): the fleet killed, the log and the
    connection closed, the servers stopped (stop()), their directory kept or removed."""
    if fleet is not None:
        fleet.kill_all()
    worker_log.close()
    if db is not None:
        db.close()
    stop()
    if keep:
        log(f"kept {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)


def report(args, r, info, fleet, froze, restarts, mode, elapsed, finished, wall) -> int:
    rows = []

    def fault(label, count):
        rows.append((label, count, "0", count == 0))

    def exercised(label, count, expected=None):
        if expected is None:
            rows.append((label, count, "> 0", count > 0))
        else:
            rows.append((label, count, f"{expected}", count == expected and count > 0))

    fault("jobs lost (neither succeeded, dead nor cancelled)", r["lost"])
    fault("unexpected jobs (not enqueued, or wrong final state)", r["unexpected"])
    fault("effects applied twice", r["twice"])
    fault("stale completions accepted", r["stale_accepted"] + r["stale_effects_accepted"])
    fault("succeeded jobs without their effect", r["no_effect"])
    fault("jobs with attempts > max_attempts", r["over_cap"])
    fault("jobs stuck running without a live lease", r["stuck"])
    fault("workers that crashed or did not stop on SIGTERM", len(fleet.crashes))
    fault("children that ran before a parent had succeeded", r["early"])
    fault("children both claimed and cancelled", r["ran_cancelled"])
    fault("children without every parent's output", r["outputs_wrong"])
    exercised("poison/killer jobs dead at exactly their cap", r["capped"], r["capped_expected"])
    exercised("flaky jobs that succeeded", r["flaky_ok"], r["flaky_expected"])
    exercised("stale completions rejected", r["stale_rejected"])
    exercised("stale effects rejected (hangers, assert_fence)", r["stale_effects_rejected"])
    exercised("stale calls rejected from SIGSTOPped workers", r["frozen_stale"])
    exercised("worker processes SIGKILLed (harness + killer jobs)",
              fleet.harness_kills + fleet.self_kills)
    if r["children"]:
        exercised("children run after their parents", r["children_ok"])
        exercised("children cancelled with a parent", r["children_cancelled"])

    kinds = info["kinds"]
    total = sum(kinds.values())
    log("")
    log(f"jobcap chaos audit{' (Citus: a coordinator and two worker nodes)' if args.citus else ''}:"
        f" {total} jobs ({', '.join(f'{kinds.get(k, 0)} {k}' for k in KINDS)}),"
        f" {args.py_workers} Python + {args.node_workers} Node workers, {elapsed:.1f}s of chaos"
        f" ({wall:.1f}s wall)")
    width = max(len(label) for label, *_ in rows)
    log(f"  {'check':<{width}}  {'count':>6}  {'want':>6}  verdict")
    for label, count, want, ok in rows:
        log(f"  {label:<{width}}  {count:>6}  {want:>6}  {'ok' if ok else 'FAIL'}")
    events = info["events"]
    stale = {k.split(":", 1)[1]: v for k, v in events.items() if k.startswith("stale:")}
    log(f"  exercised: SIGKILL {fleet.harness_kills} by the harness and {fleet.self_kills} by "
        f"killer jobs; SIGSTOP {froze} x {args.lease + 2:g}s; "
        f"{'restarts of the worker node holding the shard' if args.citus else 'server restarts'}"
        f" (immediate) {restarts}; reaper: "
        f"{'background worker' if mode == 'worker' else 'harness loop'}")
    log(f"  stale fences rejected, by call: "
        f"{', '.join(f'{k} {v}' for k, v in sorted(stale.items())) or 'none'}; hangers reaped "
        f"{events.get('hanger_reaped', 0)}, not reaped in time {events.get('hanger_not_reaped', 0)}")
    log(f"  attempts that ended badly (job_errors): "
        f"{', '.join(f'{k} {v}' for k, v in sorted(info['history'].items())) or 'none'}")
    for crash in fleet.crashes:
        log(f"  worker trouble: {crash}")
    if fleet.crashes:
        log("  the workers' log ends:")
        with open(fleet.logfile.name) as f:
            for line in f.readlines()[-40:]:
                log(f"    {line.rstrip()}")
    passed = finished and all(ok for *_, ok in rows)
    log("PASS" if passed else "FAIL")
    return 0 if passed else 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--short", action="store_true",
                   help="about 30 s: fewer jobs and workers (CI and the demo)")
    p.add_argument("--jobs", type=int)
    p.add_argument("--py-workers", type=int)
    p.add_argument("--node-workers", type=int)
    p.add_argument("--enqueue-seconds", type=float, help="how long enqueueing is spread over")
    p.add_argument("--max-seconds", type=float, help="the time bound of the chaos phase")
    p.add_argument("--reaper", choices=("auto", "worker", "loop"), default="worker",
                   help="who reaps expired leases: the preloaded background worker (the "
                        "default: a missing worker fails the run), or a loop in the harness "
                        "calling jobcap.reap_jobs(); auto: the worker when this build has it")
    p.add_argument("--no-server-restart", dest="server_restart", action="store_false")
    p.add_argument("--citus", action="store_true",
                   help="on a Citus cluster (a coordinator and two worker nodes; needs Citus in "
                        "the install, test/citus/build): the workers connect to the coordinator, "
                        "the server restarted is the worker node holding the queue's shard")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--keep", action="store_true", help="keep the cluster directory and logs")
    p.add_argument("--quiet-progress", action="store_true",
                   help="progress every 5 s on its own line, even on a terminal")
    args = p.parse_args()
    short = args.short
    defaults = {"jobs": 800 if short else 5000, "py_workers": 2 if short else 3,
                "node_workers": 2 if short else 3, "enqueue_seconds": 12.0 if short else 75.0,
                "max_seconds": 60.0 if short else 170.0}
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.seed is None:
        args.seed = random.randrange(1 << 30)
    args.lease, args.timeout = 3.0, 2.0
    args.batch, args.concurrency, args.txn, args.work_ms = 5, 4, 25, 20
    args.poison, args.killer, args.hanger, args.flaky = 0.02, 0.005, 0.01, 0.06
    args.children = 0.1
    args.min_each = 5
    args.kill_every = 3.0 if short else 4.0
    args.bindir = os.environ.get("JOBCAP_PG_BINDIR") or ""
    if not args.bindir:
        raise SystemExit("JOBCAP_PG_BINDIR is not set: run this through test/chaos/run")
    log(f"seed {args.seed}")
    # Stopped from outside, it still stops its workers and its cluster (run's finally).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
