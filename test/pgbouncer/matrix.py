"""jobcap's clients through PgBouncer (Debian's, 1.18): each client in each pool mode.

usage: matrix.py [--clients python,node,celery,django-q] [--modes session,transaction,statement]
                 [--clients-dir DIR] [--keep]

A throwaway server (jobcap preloaded, its background worker reaping) and one PgBouncer on the
loopback with one database per pool mode (session, transaction, statement; the transaction and
statement pools have 3 server connections, so the clients' transactions move between them).
For each client and mode: the client's worker is started against the pooler, N jobs are
enqueued through the pooler, and each job writes an effect (table effects, not unique on
purpose); then, with the worker idle, one more job is enqueued and the time it takes to run is
the wake-up (a poll when the worker does not LISTEN). Then a job that hangs on its first
attempt is enqueued, and the worker is SIGKILLed (its whole process group) while it runs it; a
new worker is started, and the job must be retried: its lease lapses, the reaper counts the
attempt (one job_errors row, lease_expired), and the second attempt succeeds with one effect.
The worker is stopped with SIGTERM.

The Python and Node workers then run one more hanging job, which is cancelled (cancel_job on a
direct connection): the worker must say it stopped the handler within 5 s (LISTEN where it
listens, its job_result polls where it does not: docs/workflows.md), and the job must end
cancelled after its one attempt.

A cell is "works" when every job succeeded with exactly one effect, the killed job with 2
attempts and its lapsed lease counted, the cancelled job stopped in time (Python and Node), and
the worker stopped cleanly (exit 0), "refused" when the worker exited at start with the message naming the pool
mode to use and claimed nothing. Each cell must be what EXPECTED says; the matrix is printed
(the wake-up's time and whether the worker listened or polled) and the exit status is 0 only
when every cell is as expected. --clients-dir runs another checkout's clients (what they did
before; docs/pgbouncer.md says what each client does through a pooler).
"""
from __future__ import annotations

import argparse
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "clients", "python", "tests"))
import psycopg  # noqa: E402
from psycopg.types.json import Jsonb  # noqa: E402

from pgserver import Server  # noqa: E402

# "session+listen": session pooling, the Python and Node workers with listen=True.
MODES = ("session", "session+listen", "transaction", "statement")
CLIENTS = ("python", "node", "celery", "django-q")
N = 20
# What each client does in each pool mode (see docs/pgbouncer.md). The worker loops run a job's
# writes and its completion in one transaction, which statement pooling refuses: they refuse to
# start there. The Celery transport and the Django-Q broker run single statements in autocommit
# only; Django-Q's cluster saves its results in transactions (Django's update_or_create).
EXPECTED = {
    ("python", "session"): "works", ("python", "session+listen"): "works",
    ("python", "transaction"): "works", ("python", "statement"): "refused",
    ("node", "session"): "works", ("node", "session+listen"): "works",
    ("node", "transaction"): "works", ("node", "statement"): "refused",
    ("celery", "session"): "works", ("celery", "transaction"): "works",
    ("celery", "statement"): "works",
    ("django-q", "session"): "works", ("django-q", "transaction"): "works",
    ("django-q", "statement"): "refused",
}
REFUSAL = re.compile(r"pool_mode = transaction")
# Celery's prefork pool, terminating at the worker's warm shutdown, drains each child's inqueue
# and raises EOFError on one at end of file (celery 5.2's asynpool _help_stuff_finish, seen once
# in a cell whose pool child had been SIGKILLed); multiprocessing's finalizer prints it and the
# worker still exits 0. It is the pool's, not the broker's: left out of the log's scan, and said.
POOL_EOF = re.compile(r"Traceback \(most recent call last\):(?:(?!Traceback).)*?_help_stuff_finish"
                      r"(?:(?!Traceback).)*?EOFError: Ran out of input", re.S)


def log(msg: str) -> None:
    print(msg, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PgBouncer:
    """Debian's pgbouncer on 127.0.0.1, one database per pool mode, trust authentication."""

    def __init__(self, server: Server):
        self.server = server
        self.port = free_port()
        self.dir = os.path.join(server.dir, "pgbouncer")
        os.mkdir(self.dir)
        self.ini = os.path.join(self.dir, "pgbouncer.ini")
        self.logfile = os.path.join(self.dir, "pgbouncer.log")
        self.pidfile = os.path.join(self.dir, "pgbouncer.pid")
        target = f"host={server.dir} port={server.port} dbname=postgres"
        with open(os.path.join(self.dir, "users.txt"), "w") as f:
            f.write('"postgres" ""\n')
        with open(self.ini, "w") as f:
            f.write("[databases]\n"
                    f"session = {target} pool_mode=session pool_size=40\n"
                    f"transaction = {target} pool_mode=transaction pool_size=3\n"
                    f"statement = {target} pool_mode=statement pool_size=3\n"
                    "[pgbouncer]\n"
                    f"listen_addr = 127.0.0.1\nlisten_port = {self.port}\nunix_socket_dir =\n"
                    f"auth_type = trust\nauth_file = {self.dir}/users.txt\n"
                    f"logfile = {self.logfile}\npidfile = {self.pidfile}\n"
                    "max_client_conn = 400\nserver_login_retry = 1\n")
        if os.geteuid() == 0:
            pw = pwd.getpwnam("postgres")
            for path in (self.dir, *(os.path.join(self.dir, p) for p in os.listdir(self.dir))):
                os.chown(path, pw.pw_uid, pw.pw_gid)

    def start(self) -> "PgBouncer":
        cmd = ["pgbouncer", "-d", self.ini]
        if os.geteuid() == 0:   # pgbouncer refuses to run as root
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        subprocess.run(cmd, check=True)
        end = time.monotonic() + 10
        while not os.path.exists(self.pidfile):
            if time.monotonic() > end:
                raise RuntimeError(f"pgbouncer did not start: {self.log_tail()}")
            time.sleep(0.05)
        return self

    def conninfo(self, mode: str) -> str:
        return f"host=127.0.0.1 port={self.port} dbname={mode} user=postgres"

    def log_tail(self, n: int = 20) -> str:
        try:
            with open(self.logfile) as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return ""

    def stop(self) -> None:
        try:
            with open(self.pidfile) as f:
                pid = int(f.read().strip())
            os.kill(pid, signal.SIGTERM)
            end = time.monotonic() + 10
            while time.monotonic() < end:
                os.kill(pid, 0)
                time.sleep(0.05)
        except (OSError, ValueError):
            pass


class Run:
    def __init__(self, args):
        self.args = args
        self.server = Server(settings={"shared_preload_libraries": "'jobcap'",
                                       "jobcap.database": "'postgres'",
                                       "jobcap.reap_interval": "200", "max_connections": "200",
                                       "log_min_messages": "warning"}).start()
        self.server.psql("CREATE TABLE effects (client text NOT NULL, n int NOT NULL,"
                         " job_id bigint, fence bigint, at timestamptz DEFAULT clock_timestamp())")
        self.server.psql("CREATE TABLE starts (client text NOT NULL, n int NOT NULL)")
        self.pgb = PgBouncer(self.server).start()
        self._local = threading.local()
        self.python_dir = os.path.join(args.clients_dir, "python")
        self.node_dir = os.path.join(args.clients_dir, "node", "lib")
        # NODE_PATH: another checkout's Node client (--clients-dir) finds pg in this one's.
        self.env = dict(os.environ, PYTHONPATH=os.pathsep.join([self.python_dir, HERE]),
                        NODE_PATH=os.path.join(ROOT, "clients", "node", "node_modules"))
        self.migrated = False

    @property
    def direct(self) -> psycopg.Connection:
        """This thread's connection to the server itself (not through the pooler)."""
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = psycopg.connect(self.server.conninfo, autocommit=True)
        return conn

    def close(self) -> None:
        self.pgb.stop()
        if not self.args.keep:
            self.server.stop()
        else:
            log(f"kept {self.server.dir}")

    # --- one cell ----------------------------------------------------------------------------

    def start_client(self, client: str, mode: str, queue: str, out) -> subprocess.Popen:
        database, _, listen = mode.partition("+")
        conninfo = self.pgb.conninfo(database)
        env = dict(self.env, PGB_CONNINFO=conninfo, PGB_QUEUE=queue, PGB_HOST="127.0.0.1",
                   PGB_PORT=str(self.pgb.port), PGB_DBNAME=database,
                   DJANGO_SETTINGS_MODULE="djq_settings")
        listen = listen or "default"
        if client == "python":
            cmd = [sys.executable, os.path.join(HERE, "py_worker.py"), conninfo, queue, listen,
                   self.python_dir]
        elif client == "node":
            url = f"postgresql://postgres@127.0.0.1:{self.pgb.port}/{database}"
            cmd = ["node", os.path.join(HERE, "node_worker.js"), url, queue, listen,
                   self.node_dir]
        elif client == "celery":
            cmd = [sys.executable, "-m", "celery", "-A", "celery_app", "worker", "-P", "prefork",
                   "-c", "2", "--without-gossip", "--without-mingle", "--without-heartbeat",
                   "-l", "info", "-Q", queue, "-n", f"{queue}@%h"]
        else:
            cmd = [sys.executable, "-m", "django", "qcluster"]
        return subprocess.Popen(cmd, cwd=HERE, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)

    def enqueue(self, client: str, mode: str, queue: str, numbers, hang: bool = False) -> None:
        database = mode.partition("+")[0]
        conninfo = self.pgb.conninfo(database)
        env = dict(self.env, PGB_CONNINFO=conninfo, PGB_QUEUE=queue, PGB_HOST="127.0.0.1",
                   PGB_PORT=str(self.pgb.port), PGB_DBNAME=database,
                   DJANGO_SETTINGS_MODULE="djq_settings")
        numbers = list(numbers)
        if client in ("python", "node"):
            with psycopg.connect(conninfo, autocommit=True, prepare_threshold=None) as conn:
                conn.execute("SELECT jobcap.enqueue_jobs(%s, %s::jsonb[])",
                             (queue, [Jsonb({"n": n, "hang": hang}) for n in numbers]))
        elif client == "celery":
            code = ("import celery_app\n"
                    f"for n in {numbers!r}:\n    celery_app.effect.delay(n, hang={hang!r})\n")
            subprocess.run([sys.executable, "-c", code], cwd=HERE, env=env, check=True,
                           capture_output=True, timeout=60)
        else:
            code = ("from django_q.tasks import async_task\n"
                    f"for n in {numbers!r}:\n"
                    f"    async_task('djq_tasks.effect', n, hang={hang!r})\n")
            subprocess.run([sys.executable, "-m", "django", "shell", "-c", code], cwd=HERE,
                           env=env, check=True, capture_output=True, timeout=60)

    def effects(self, client: str) -> tuple:
        return self.direct.execute("SELECT count(*), count(DISTINCT n) FROM effects"
                                   " WHERE client = %s", (client,)).fetchone()

    def starts(self, short: str) -> int:
        return self.direct.execute("SELECT count(*) FROM starts WHERE client = %s",
                                   (short,)).fetchone()[0]

    def jobs(self, queue: str) -> dict:
        return dict(self.direct.execute("SELECT state::text, count(*) FROM jobcap.jobs"
                                        " WHERE queue = %s GROUP BY state", (queue,)).fetchall())

    def cell(self, client: str, mode: str) -> dict:
        queue = f"pgb_{client}_{mode}".replace("-", "_").replace("+", "_")
        short = {"python": "py", "node": "node", "celery": "celery", "django-q": "djq"}[client]
        self.direct.execute("DELETE FROM effects WHERE client = %s", (short,))
        self.direct.execute("DELETE FROM starts WHERE client = %s", (short,))
        if client in ("python", "node"):
            self.direct.execute("SELECT jobcap.create_queue(%s, max_attempts => 3,"
                                " backoff_base => '0', backoff_max => '0', notify => true)",
                                (queue,))
        if client == "django-q" and not self.migrated:
            env = dict(self.env, PGB_HOST=self.server.dir, PGB_PORT=str(self.server.port),
                       PGB_DBNAME="postgres", PGB_QUEUE=queue,
                       DJANGO_SETTINGS_MODULE="djq_settings")
            subprocess.run([sys.executable, "-m", "django", "migrate", "-v", "0"], cwd=HERE,
                           env=env, check=True)
            self.migrated = True
        out_path = os.path.join(self.server.dir, f"{queue}.log")
        result = {"verdict": "FAILED", "why": "", "wake": None, "listened": None}
        with open(out_path, "w+") as out:
            self._local.proc = self.start_client(client, mode, queue, out)
            try:
                self._exercise(client, mode, queue, short, result, out)
            finally:
                proc = self._local.proc
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGTERM)
                    try:
                        proc.wait(30)
                    except subprocess.TimeoutExpired:
                        os.killpg(proc.pid, signal.SIGKILL)
                        proc.wait()
                        result["verdict"] = "FAILED"
                        result["why"] += " (did not stop within 30 s of SIGTERM)"
                    else:
                        if proc.returncode != 0 and result["verdict"] == "works":
                            result["verdict"] = "FAILED"
                            result["why"] += f" (exit {proc.returncode} on SIGTERM)"
            out.flush()
            out.seek(0)
            text = out.read()
        result["log"] = out_path
        result["text"] = text
        if result["verdict"] == "refused" and not REFUSAL.search(text):
            result["verdict"] = "FAILED"
            result["why"] += " without saying which pool mode to use"

        if result["verdict"] == "works" and client in ("python", "node"):
            # Through the pooler the workers poll, unless told to LISTEN (session pooling).
            result["listened"] = bool(re.search(r"connected, listening", text))
            if result["listened"] != mode.endswith("+listen"):
                result["verdict"] = "FAILED"
                result["why"] += (" (it LISTENed)" if result["listened"] else
                                  " (it did not LISTEN)")
        elif result["verdict"] == "works" and client == "celery":
            result["listened"] = "no LISTEN, polling" not in text
            if result["listened"]:
                result["verdict"] = "FAILED"
                result["why"] += " (it did not say it polls)"
        scanned = text
        if client == "celery" and POOL_EOF.search(text):
            scanned = POOL_EOF.sub("", text)
            result["why"] += " (celery's pool raised EOFError in _help_stuff_finish at shutdown)"
        for bad in ("prepared statement", "Traceback", "uncaught"):
            if bad in scanned and result["verdict"] == "works":
                result["verdict"] = "FAILED"
                result["why"] += f" (its log has {bad!r})"
        return result

    def _exercise(self, client, mode, queue, short, result, out) -> None:
        proc = self._local.proc
        # The workers connect at start (the Python and Node ones refuse then); Celery and
        # Django-Q connect when they first poll.
        end = time.monotonic() + 8
        while time.monotonic() < end and proc.poll() is None:
            time.sleep(0.1)
        if proc.poll() is not None:
            claimed = sum(self.jobs(queue).values())
            result["verdict"] = "refused" if proc.returncode != 0 and claimed == 0 else "FAILED"
            result["why"] = f"exited {proc.returncode} at start"
            return
        self.enqueue(client, mode, queue, range(N))
        end = time.monotonic() + 60
        while time.monotonic() < end and self.effects(short)[0] < N and proc.poll() is None:
            time.sleep(0.1)
        if proc.poll() is not None:
            result["why"] = f"exited {proc.returncode} while it worked"
            return
        # Idle: the next job's wake-up (a notification, or the next poll).
        time.sleep(2)
        t0 = time.monotonic()
        self.enqueue(client, mode, queue, [N])
        end = time.monotonic() + 30
        while time.monotonic() < end and self.effects(short)[0] < N + 1:
            time.sleep(0.02)
        result["wake"] = time.monotonic() - t0
        # Every job settled (the last completion may trail its effect a little).
        end = time.monotonic() + 10
        while time.monotonic() < end and set(self.jobs(queue)) - {"succeeded"}:
            time.sleep(0.1)
        count, distinct = self.effects(short)
        states = self.jobs(queue)
        ok = count == N + 1 and distinct == N + 1 and states == {"succeeded": N + 1}
        result["why"] = f"effects {count} ({distinct} distinct) of {N + 1}, jobs {states}"
        if not ok:
            return
        # A worker SIGKILLed with a job in hand (its handler hangs on the first attempt).
        total = N + 2
        self.enqueue(client, mode, queue, [N + 1], hang=True)
        end = time.monotonic() + 30
        while time.monotonic() < end and not (
                self.jobs(queue).get("running") and
                (client in ("python", "node") or self.starts(short) >= 1)):
            time.sleep(0.05)
        if not self.jobs(queue).get("running"):
            result["why"] = "the hanging job did not start"
            return
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        t0 = time.monotonic()
        out.write("--- SIGKILLed; a new worker ---\n")
        out.flush()
        self._local.proc = self.start_client(client, mode, queue, out)
        end = time.monotonic() + 60
        while time.monotonic() < end and (self.effects(short)[0] < total or
                                          set(self.jobs(queue)) - {"succeeded"}):
            time.sleep(0.1)
        count, distinct = self.effects(short)
        states = self.jobs(queue)
        attempts, lapsed = self.direct.execute(
            "SELECT j.attempts, (SELECT count(*) FROM jobcap.job_errors e WHERE e.job_id = j.job_id"
            " AND e.kind = 'lease_expired' AND e.attempt = 1) FROM jobcap.jobs j"
            " WHERE j.queue = %s ORDER BY j.job_id DESC LIMIT 1", (queue,)).fetchone()
        others = self.direct.execute(
            "SELECT count(*) FROM jobcap.jobs WHERE queue = %s AND attempts <> 1",
            (queue,)).fetchone()[0]
        ok = (count == total and distinct == total and states == {"succeeded": total}
              and attempts == 2 and lapsed == 1 and others == 1)
        result["verdict"] = "works" if ok else "FAILED"
        result["kill"] = time.monotonic() - t0
        result["why"] += (f"; killed: effects {count} ({distinct} distinct) of {total}, jobs "
                          f"{states}, the killed job's attempts {attempts} (lapsed leases "
                          f"counted {lapsed}; other jobs not at 1 attempt: {others - 1}), retried "
                          f"in {result['kill']:.1f}s")
        if ok and client in ("python", "node"):
            self._cancel(mode, queue, result, out)

    def _cancel(self, mode, queue, result, out) -> None:
        """A running job cancelled from another session: its handler (hanging on its first
        attempt) must be stopped within 5 s, the job cancelled after one attempt."""
        conninfo = self.pgb.conninfo(mode.partition("+")[0])
        with psycopg.connect(conninfo, autocommit=True, prepare_threshold=None) as conn:
            job_id = conn.execute("SELECT jobcap.enqueue_job(%s, %s)",
                                  (queue, Jsonb({"n": 10000, "hang": True}))).fetchone()[0]
        end = time.monotonic() + 30
        while time.monotonic() < end and self.jobs(queue).get("running") is None:
            time.sleep(0.05)
        time.sleep(0.3)   # the handler is in its hang
        t0 = time.monotonic()
        self.direct.execute("SELECT jobcap.cancel_job(%s)", (job_id,))
        stopped = re.compile(rf"job {job_id}\b[^\n]*(the handler was stopped|handler stopped)")
        end = t0 + 10
        found = False
        while time.monotonic() < end and not found:
            out.flush()
            out.seek(0)
            found = bool(stopped.search(out.read()))
            if not found:
                time.sleep(0.05)
        took = time.monotonic() - t0
        state, attempts = self.direct.execute("SELECT state::text, attempts FROM jobcap.jobs"
                                              " WHERE job_id = %s", (job_id,)).fetchone()
        result["cancel"] = took if found else None
        ok = found and took < 5 and (state, attempts) == ("cancelled", 1)
        result["why"] += (f"; cancelled: handler stopped in {took:.1f}s" if found else
                          "; cancelled: the worker did not say it stopped the handler"
                          ) + f", job {state} after {attempts} attempt(s)"
        if not ok:
            result["verdict"] = "FAILED"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", default=",".join(CLIENTS))
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--clients-dir", default=os.path.join(ROOT, "clients"))
    p.add_argument("--keep", action="store_true")
    args = p.parse_args()
    clients = args.clients.split(",")
    modes = args.modes.split(",")
    cells_of = {c: [m for m in modes if (c, m) in EXPECTED] for c in clients}
    if not shutil.which("pgbouncer"):
        raise SystemExit("pgbouncer is not installed (apt-get install pgbouncer)")
    version = subprocess.run(["pgbouncer", "--version"], capture_output=True,
                             text=True).stdout.splitlines()[0]
    run = Run(args)
    results = {}
    try:
        log(f"{version}; clients from {args.clients_dir}; {N} jobs per cell")
        lock = threading.Lock()

        def cells(client):
            # One client's cells in turn; the clients at once (their queues, effects and
            # processes are their own), to keep the matrix short.
            for mode in cells_of[client]:
                t0 = time.monotonic()
                try:
                    r = run.cell(client, mode)
                except Exception as error:   # reported as the cell's failure
                    r = {"verdict": "FAILED", "why": repr(error), "text": ""}
                results[client, mode] = r
                with lock:
                    log(f"  {client:9} {mode:12} {r['verdict']:8} {time.monotonic() - t0:5.1f}s"
                        f"  {r['why']}")
                    if r["verdict"] == "FAILED" or r["verdict"] != EXPECTED[client, mode]:
                        for line in r["text"].splitlines()[-15:]:
                            log(f"      | {line}")

        threads = [threading.Thread(target=cells, args=(c,)) for c in clients]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        run.close()
    log("")
    log(f"{'client':10}" + "".join(f"{m:34}" for m in modes))
    failed = 0
    for client in clients:
        cells = []
        for mode in modes:
            if (client, mode) not in EXPECTED:
                cells.append(f"{'-':34}")
                continue
            r = results[client, mode]
            text = r["verdict"]
            if r["verdict"] == "works":
                text += (f" ({'LISTEN' if r['listened'] else 'polls'}, wake-up "
                         f"{r['wake']:.2f}s)")
            if r["verdict"] != EXPECTED[client, mode]:
                text += f" [want {EXPECTED[client, mode]}]"
                failed += 1
            cells.append(f"{text:34}")
        log(f"{client:10}" + "".join(cells))
    log("PASS" if failed == 0 else f"FAIL: {failed} cell(s) not as expected")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
