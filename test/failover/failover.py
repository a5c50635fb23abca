"""jobcap across a primary failover: pg_auto_failover (Debian's pg-auto-failover-cli and
postgresql-15-auto-failover) runs a monitor, a primary and a synchronous secondary on this
machine; Python and Node chaos workers (test/chaos/worker.py, worker.js) connect with a
multi-host conninfo (target_session_attrs=read-write); in the middle of the run the primary's
pg_autoctl and postgres are SIGKILLed and the monitor promotes the secondary. Run it with
test/failover/run (which builds the private install first) or test/run failover.

The audit: test/chaos's SQL audit on the promoted node, and a ledger kept outside the database
(the harness's acknowledged enqueues; each claim a handler was given and each settlement a
worker was told committed, appended by the workers) checked against it:
  enqueues lost      an enqueue whose COMMIT was acknowledged, missing on the promoted node
  claims lost        a claim a handler ran under, whose fence the promoted node has nowhere
                     (neither the job's fence nor one in its history, jobcap.job_errors)
  fences twice       one (job, fence) handed to two handler runs
  completions lost   a success a worker was told of, not succeeded at that fence with its effect
  over cap           attempts > max_attempts
and that the failover happened (the promoted node is the other one), that the promoted node's
background worker reaped leases expired after the promotion, and that every worker process
started before the kill settled jobs after it, by itself (none is restarted).
"""
from __future__ import annotations

import argparse
import collections
import os
import pwd
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "chaos"))
import psycopg  # noqa: E402
from psycopg.types.json import Jsonb  # noqa: E402

import chaos  # noqa: E402


ENQUEUE = chaos.ENQUEUE.rstrip() + "\nRETURNING job_id\n"

# What the monitor waits for before failing over, shortened so a run takes seconds, not a
# minute (pg_auto_failover's defaults: 5 s checks, 20 s unhealthy, 30 s demote timeout).
MONITOR_SETTINGS = {
    "pgautofailover.health_check_period": "1000",
    "pgautofailover.health_check_timeout": "1000",
    "pgautofailover.health_check_max_retries": "1",
    "pgautofailover.health_check_retry_delay": "500",
    "pgautofailover.node_considered_unhealthy_timeout": "3000",
    "pgautofailover.primary_demote_timeout": "3000",
}


def log(msg: str) -> None:
    chaos.log(msg)


class Node:
    """A pg_autoctl process (monitor or keeper) and the postgres it runs, as the postgres user."""

    def __init__(self, ha, name: str, port: int, bindir: str):
        self.ha = ha
        self.name = name
        self.port = port
        self.bindir = bindir
        self.pgdata = os.path.join(ha.dir, name)
        self.logfile = os.path.join(ha.dir, f"{name}.log")
        self.proc = None

    def conninfo(self, db="postgres") -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname={db} connect_timeout=3"

    def start(self, args: list) -> None:
        out = open(self.logfile, "a")
        self.proc = subprocess.Popen(
            ["runuser", "-u", "postgres", "--", "env", *self.ha.env, "pg_autoctl", *args],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True) if self.ha.root else subprocess.Popen(
            ["env", *self.ha.env, "pg_autoctl", *args], stdout=out, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True)
        out.close()

    def postmaster(self):
        try:
            with open(os.path.join(self.pgdata, "postmaster.pid")) as f:
                return int(f.readline())
        except (OSError, ValueError):
            return None

    def kill(self) -> int:
        """SIGKILL to pg_autoctl (its process group) and to the postmaster; how many signals."""
        sent = 0
        pm = self.postmaster()
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
                sent += 1
            except ProcessLookupError:
                pass
            self.proc.wait()
        if pm is not None:
            try:
                os.kill(pm, signal.SIGKILL)
                sent += 1
            except ProcessLookupError:
                pass
        return sent

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(30)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        pm = self.postmaster()
        if pm is not None:
            try:
                os.kill(pm, signal.SIGKILL)
            except ProcessLookupError:
                pass


class HA:
    """The monitor and two nodes, in a temporary directory of their own."""

    def __init__(self, bindir: str, base_port: int):
        self.dir = tempfile.mkdtemp(prefix="jobcap-failover-")
        self.root = os.geteuid() == 0
        if self.root:
            pw = pwd.getpwnam("postgres")
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)
        # pg_autoctl keeps its configuration and state under the XDG directories: ours only.
        self.env = [f"XDG_CONFIG_HOME={self.dir}/config", f"XDG_DATA_HOME={self.dir}/data",
                    f"XDG_RUNTIME_DIR={self.dir}/run", f"PATH={bindir}:/usr/bin:/bin",
                    "PG_AUTOCTL_DEBUG=0"]
        # The monitor needs only pg_auto_failover: the system's PostgreSQL of the same major (the
        # private install's bindir is the system's under build/tmp_install). The nodes run
        # jobcap from the private install.
        system = bindir.split("/tmp_install", 1)[-1] if "/tmp_install/" in bindir else bindir
        self.monitor = Node(self, "monitor", base_port, system)
        self.nodes = [Node(self, "node1", base_port + 1, bindir),
                      Node(self, "node2", base_port + 2, bindir)]
        self.bindir = bindir

    def monitor_uri(self) -> str:
        return (f"postgres://autoctl_node@127.0.0.1:{self.monitor.port}/pg_auto_failover"
                "?sslmode=disable")

    def conninfo(self) -> str:
        return ("host=" + ",".join("127.0.0.1" for _ in self.nodes) + " port="
                + ",".join(str(n.port) for n in self.nodes)
                + " user=postgres dbname=postgres target_session_attrs=read-write connect_timeout=3")

    def connection(self) -> dict:
        return {"host": ",".join("127.0.0.1" for _ in self.nodes),
                "port": ",".join(str(n.port) for n in self.nodes), "user": "postgres",
                "database": "postgres", "target_session_attrs": "read-write",
                "connectionTimeoutMillis": 3000}

    def run_as(self, cmd: list, check=True) -> str:
        if self.root:
            cmd = ["runuser", "-u", "postgres", "--", "env", *self.env, *cmd]
        else:
            cmd = ["env", *self.env, *cmd]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd[-6:])} failed:\n{done.stdout}{done.stderr}")
        return done.stdout

    def wait(self, what: str, test, seconds: float) -> None:
        end = time.monotonic() + seconds
        while True:
            try:
                if test():
                    return
            except (psycopg.Error, RuntimeError):
                pass
            if time.monotonic() > end:
                raise RuntimeError(f"timed out waiting for {what}; logs in {self.dir}")
            time.sleep(0.3)

    def states(self) -> dict:
        with psycopg.connect(self.monitor.conninfo("pg_auto_failover"), autocommit=True) as c:
            return dict(c.execute("SELECT nodename, reportedstate::text || '/' || goalstate::text"
                                  " FROM pgautofailover.node").fetchall())

    def state_of(self, node: Node) -> str:
        return self.states().get(node.name, "")

    def setup(self) -> None:
        m = self.monitor
        for d in ("config", "data", "run"):
            os.makedirs(os.path.join(self.dir, d))
            if self.root:
                shutil.chown(os.path.join(self.dir, d), "postgres", "postgres")
        m.start(["create", "monitor", "--pgdata", m.pgdata, "--pgport", str(m.port),
                 "--hostname", "127.0.0.1", "--auth", "trust", "--no-ssl",
                 "--pgctl", os.path.join(m.bindir, "pg_ctl"), "--run"])
        self.wait("the monitor", lambda: psycopg.connect(m.conninfo("pg_auto_failover")).close()
                  or True, 60)
        with psycopg.connect(m.conninfo("pg_auto_failover"), autocommit=True) as c:
            for k, v in MONITOR_SETTINGS.items():
                c.execute(f"ALTER SYSTEM SET {k} = '{v}'")
            c.execute("SELECT pg_reload_conf()")
        # The primary's cluster is made here, so it starts with jobcap preloaded; the secondary
        # is pg_basebackup's copy of it (postgresql.conf and postgresql.auto.conf with it).
        n1 = self.nodes[0]
        self.run_as([os.path.join(self.bindir, "initdb"), "-D", n1.pgdata, "-U", "postgres",
                     "-A", "trust", "--no-sync", "-E", "UTF8", "--locale=C"])
        with open(os.path.join(n1.pgdata, "postgresql.conf"), "a") as f:
            f.write("shared_preload_libraries = 'jobcap'\njobcap.reap_interval = '200ms'\n"
                    "max_connections = 60\nshared_buffers = 32MB\nfsync = off\n"
                    "log_min_messages = warning\nlog_line_prefix = '%m [%p] '\n"
                    "wal_keep_size = '256MB'\n")
        for i, n in enumerate(self.nodes):
            n.start(["create", "postgres", "--pgdata", n.pgdata, "--pgport", str(n.port),
                     "--hostname", "127.0.0.1", "--name", n.name, "--auth", "trust", "--no-ssl",
                     "--monitor", self.monitor_uri(), "--pgctl", os.path.join(n.bindir, "pg_ctl"),
                     "--run"])
            # Generous: on a loaded 2-core machine the secondary's pg_basebackup and catch-up
            # took over 120 s once (a CI run beside benchmarks); a hang still ends the run.
            if i == 0:
                self.wait("node1 single", lambda: self.state_of(n1).startswith("single/"), 180)
            else:
                self.wait("node1 primary and node2 secondary",
                          lambda: self.state_of(n1) == "primary/primary"
                          and self.state_of(n) == "secondary/secondary", 300)

    def primary(self):
        with psycopg.connect(self.conninfo(), autocommit=True) as c:
            port = c.execute("SELECT current_setting('port')::int").fetchone()[0]
        return next(n for n in self.nodes if n.port == port)

    def stop(self) -> None:
        for n in self.nodes:
            n.stop()
        self.monitor.stop()


def read_ledger(path: str):
    claims = collections.Counter()
    settled = []
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                parts = line.split()
                if len(parts) != 4:
                    continue
                what, job, fence, worker = parts[0], int(parts[1]), int(parts[2]), parts[3]
                if what == "claim":
                    claims[(job, fence)] += 1
                else:
                    settled.append((what, job, fence, worker))
    return claims, settled


def run(args) -> int:
    rng = random.Random(args.seed)
    random.seed(args.seed)
    started = time.monotonic()
    ha = HA(args.bindir, args.port)
    ledger_path = os.path.join(ha.dir, "ledger")
    open(ledger_path, "w").close()
    os.chmod(ledger_path, 0o666)
    worker_log = open(os.path.join(ha.dir, "workers.log"), "w")
    fleet = None
    db = None
    try:
        log(f"jobcap failover: pg_auto_failover monitor :{ha.monitor.port}, node1 :{ha.nodes[0].port}"
            f" (primary), node2 :{ha.nodes[1].port} (secondary); {ha.dir}")
        ha.setup()
        old = ha.primary()
        db = chaos.Db(ha.conninfo(), "failover harness")
        conn = db.get()
        sync = conn.execute("SHOW synchronous_standby_names").fetchone()[0]
        if not sync:
            raise RuntimeError("no synchronous standby: synchronous_standby_names is empty")
        conn.execute(chaos.SCHEMA)
        conn.execute("SELECT jobcap.create_queue('chaos', max_attempts => 20, lease => %s,"
                     " backoff_base => '100 ms', backoff_max => '1 s', notify => true)",
                     (f"{args.lease} s",))
        log(f"  set up in {time.monotonic() - started:.1f}s: primary {old.name}, "
            f"synchronous_standby_names = {sync}")
        jobs = chaos.plan(args, rng)
        kinds = collections.Counter(j["kind"] for j in jobs)
        log(f"  {len(jobs)} jobs ({', '.join(f'{kinds[k]} {k}' for k in chaos.KINDS)}), "
            f"{args.py_workers} Python + {args.node_workers} Node workers, lease {args.lease:g}s")

        class Target:   # what chaos.Fleet asks of a cluster
            conninfo = ha.conninfo()
            connection = ha.connection()
        fleet = chaos.Fleet(Target, args, worker_log)
        fleet.env["CHAOS_LEDGER"] = ledger_path
        fleet.start_all()
        t0 = time.monotonic()
        E = args.enqueue_seconds
        deadline = t0 + args.max_seconds
        batches = [jobs[i:i + args.txn] for i in range(0, len(jobs), args.txn)]
        acked = set()            # job ids whose enqueue COMMIT we saw
        unknown = 0              # batches whose COMMIT failed with the outcome unknown
        next_batch = 0
        kill_at = t0 + E * args.kill_at
        killed_at = promoted_at = None
        kills = failovers = 0
        new = None
        counts = {}
        last_poll = 0.0
        finished = False
        while time.monotonic() < deadline:
            now = time.monotonic()
            try:
                while next_batch < len(batches) and now >= t0 + E * next_batch / len(batches):
                    batch = batches[next_batch]
                    c = db.get()
                    with c.transaction():
                        ids = [r[0] for r in c.execute(ENQUEUE, (Jsonb(
                            [{"kind": j["kind"], "cap": j["cap"], "payload": j["payload"]}
                             for j in batch]),)).fetchall()]
                    acked.update(ids)
                    next_batch += 1
            except psycopg.OperationalError:
                unknown += 1  # retried: if it did commit, its jobs are recorded all the same
                db.close()
            if killed_at is None and now >= kill_at:
                kills += old.kill()
                killed_at = time.monotonic()
                log(f"[{killed_at - t0:6.1f}s] SIGKILL {old.name}'s pg_autoctl and postgres "
                    f"(the primary)")
            if killed_at is not None and promoted_at is None:
                try:
                    other = next(n for n in ha.nodes if n is not old)
                    if ha.state_of(other) in ("wait_primary/wait_primary", "primary/primary"):
                        promoted_at = time.monotonic()
                        failovers += 1
                        new = other
                        with open(ledger_path, "a") as f:
                            f.write("promoted\n")
                        log(f"[{promoted_at - t0:6.1f}s] the monitor promoted {other.name} "
                            f"({promoted_at - killed_at:.1f}s after the kill)")
                except psycopg.Error:
                    pass
            fleet.tend(restarting=False)
            if now - last_poll >= 0.5:
                last_poll = now
                try:
                    counts = dict(db.get().execute(
                        "SELECT state::text, count(*) FROM jobcap.jobs WHERE queue = 'chaos'"
                        " GROUP BY state").fetchall())
                except psycopg.OperationalError:
                    db.close()
                if time.monotonic() - getattr(run, "said", 0) >= 5:
                    run.said = time.monotonic()
                    log(f"[{now - t0:6.1f}s] acknowledged {len(acked)}/{len(jobs)} | "
                        f"succeeded {counts.get('succeeded', 0)} dead {counts.get('dead', 0)} "
                        f"running {counts.get('running', 0)} pending {counts.get('pending', 0)}"
                        f" | workers {len(fleet.alive())}")
                if next_batch == len(batches) and promoted_at is not None and counts and \
                        counts.get("pending", 0) + counts.get("running", 0) == 0:
                    finished = True
                    break
            time.sleep(0.05)
        elapsed = time.monotonic() - t0
        if not finished:
            log(f"time bound of {args.max_seconds:g}s reached before every job was settled")
        fleet.stop_all()
        conn = db.get()
        if args.plant:
            plant(conn, ledger_path, args.plant)
        result = chaos.audit(db)
        info = chaos.details(db)
        served = conn.execute("SELECT current_setting('port')::int").fetchone()[0]
        claims, settled = read_ledger(ledger_path)
        final = dict(((j, (s, f)) for j, s, f in conn.execute(
            "SELECT job_id, state::text, fence FROM jobcap.jobs WHERE queue = 'chaos'")))
        effects = {(j, f) for j, f in conn.execute("SELECT job_id, fence FROM effects")}
        enq_lost = sum(1 for j in acked if j not in final)
        # A claim leaves its fence behind: the job's own, or its history's (job_errors) once the
        # attempt ended badly (an error, a crash, a lease reaped).
        ended = {(j, f) for j, f in conn.execute(
            "SELECT job_id, fence FROM jobcap.job_errors WHERE queue = 'chaos'")}
        claims_lost = sum(1 for (j, f) in claims
                          if (j not in final or final[j][1] != f) and (j, f) not in ended)
        twice = sum(1 for n in claims.values() if n > 1)
        done_lost = sum(1 for what, j, f, _ in settled if what == "succeeded" and
                        (final.get(j) != ("succeeded", f) or (j, f) not in effects))
        dead_lost = sum(1 for what, j, f, _ in settled if what == "dead" and
                        (final.get(j) or ("", 0))[0] != "dead")
        reaped_after = 0
        bgworker = 0
        if promoted_at is not None:
            wall_promoted = time.time() - (time.monotonic() - promoted_at)
            reaped_after = conn.execute(
                "SELECT count(*) FROM jobcap.job_errors WHERE queue = 'chaos' AND"
                " kind = 'lease_expired' AND at > to_timestamp(%s)", (wall_promoted,)).fetchone()[0]
            bgworker = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE backend_type"
                                    " LIKE 'jobcap%%'").fetchone()[0]
        # Every worker process (none is restarted) settled jobs after the promotion.
        quiet = []
        if promoted_at is not None:
            late = {w for what, j, f, w in settled_after(ledger_path)}
            quiet = sorted(n for n in fleet.names.values() if n not in late)
        rows = []

        def fault(label, count):
            rows.append((label, count, "0", count == 0))

        def need(label, count, ok):
            rows.append((label, count, "> 0" if ok is None else ok[1], count > 0 if ok is None
                         else ok[0]))
        fault("enqueues acknowledged, missing after the failover", enq_lost)
        fault("claims a handler ran, fence missing after the failover", claims_lost)
        fault("fences handed to two handler runs", twice)
        fault("successes reported, not succeeded at that fence with effect", done_lost)
        fault("deaths reported, not dead after the failover", dead_lost)
        fault("jobs lost (neither succeeded, dead nor cancelled)", result["lost"])
        fault("unexpected jobs (not enqueued, or wrong final state)", result["unexpected"])
        fault("effects applied twice", result["twice"])
        fault("stale completions accepted", result["stale_accepted"]
              + result["stale_effects_accepted"])
        fault("succeeded jobs without their effect", result["no_effect"])
        fault("jobs with attempts > max_attempts", result["over_cap"])
        fault("jobs stuck running without a live lease", result["stuck"])
        fault("workers that crashed or did not stop on SIGTERM", len(fleet.crashes))
        fault("workers that settled nothing after the promotion", len(quiet))
        need("failovers (the other node serves the audit)", failovers,
             (failovers == 1 and new is not None and served == new.port, "1"))
        need("leases the promoted node's background worker reaped", reaped_after, None)
        need("jobcap background workers on the promoted node", bgworker, None)
        need("claims in the ledger", len(claims), None)
        log("")
        total = sum(info["kinds"].values())
        log(f"jobcap failover audit: {total} jobs, {args.py_workers} Python + {args.node_workers}"
            f" Node workers, {elapsed:.1f}s of run ({time.monotonic() - started:.1f}s wall);"
            f" enqueue batches retried after an error: {unknown}")
        width = max(len(r[0]) for r in rows)
        log(f"  {'check':<{width}}  {'count':>6}  {'want':>6}  verdict")
        for label, count, want, ok in rows:
            log(f"  {label:<{width}}  {count:>6}  {want:>6}  {'ok' if ok else 'FAIL'}")
        for crash in fleet.crashes:
            log(f"  worker trouble: {crash}")
        if quiet:
            log(f"  quiet after the promotion: {', '.join(quiet)}")
        lost = enq_lost + claims_lost + twice + done_lost + dead_lost + result["lost"]
        passed = finished and all(ok for *_, ok in rows)
        log(f"figures: jobs {total}, kills {kills}, failovers {failovers}, lost {lost}"
            f" ({'PASS' if passed else 'FAIL'})")
        return 0 if passed else 1
    finally:
        chaos.teardown(fleet, worker_log, db, ha.stop, ha.dir, args.keep)


def settled_after(path: str):
    """The settlements written after the promotion: the harness writes a 'promoted' line."""
    seen = False
    out = []
    with open(path) as f:
        for line in f:
            parts = line.split()
            if parts and parts[0] == "promoted":
                seen = True
            elif seen and len(parts) == 4 and parts[0] in ("succeeded", "dead"):
                out.append((parts[0], int(parts[1]), int(parts[2]), parts[3]))
    return out


def plant(conn, ledger_path: str, what: str) -> None:
    """A fault planted after the run, to show the audit counts it."""
    _, settled = read_ledger(ledger_path)
    job, fence = next((j, f) for w, j, f, _ in reversed(settled) if w == "succeeded")
    if what == "lost-completion":
        # As if the completion had committed on the old primary only: the job back to running
        # under its fence, its effect gone.
        conn.execute("DELETE FROM effects WHERE job_id = %s", (job,))
        conn.execute("UPDATE jobcap.jobs SET state = 'running', lease_expires_at = now() +"
                     " interval '1 hour', finished_at = NULL WHERE job_id = %s", (job,))
    elif what == "fence-twice":
        # As if a claim had committed on the old primary only and its fence were given again.
        with open(ledger_path, "a") as f:
            f.write(f"claim {job} {fence} planted\n")
    log(f"planted {what} on job {job} (fence {fence})")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=2000)
    p.add_argument("--py-workers", type=int, default=2)
    p.add_argument("--node-workers", type=int, default=2)
    p.add_argument("--enqueue-seconds", type=float, default=30.0)
    p.add_argument("--max-seconds", type=float, default=120.0)
    p.add_argument("--kill-at", type=float, default=0.3,
                   help="when the primary is killed, as a share of --enqueue-seconds")
    p.add_argument("--port", type=int, default=26040,
                   help="the monitor's port; the nodes take the next two")
    p.add_argument("--plant", choices=("lost-completion", "fence-twice"),
                   help="plant a fault after the run: the audit must fail")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--keep", action="store_true")
    args = p.parse_args()
    if args.seed is None:
        args.seed = random.randrange(1 << 30)
    args.lease, args.timeout = 3.0, 2.0
    args.batch, args.concurrency, args.txn, args.work_ms = 5, 3, 25, 20
    args.poison, args.killer, args.hanger, args.flaky = 0.02, 0.005, 0.01, 0.06
    args.min_each = 5
    args.bindir = os.environ.get("JOBCAP_PG_BINDIR") or ""
    if not args.bindir:
        raise SystemExit("JOBCAP_PG_BINDIR is not set: run this through test/failover/run")
    log(f"seed {args.seed}")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
