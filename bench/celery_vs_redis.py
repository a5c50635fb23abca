#!/usr/bin/python3
"""Celery on jobcap beside Celery on Redis: the same trivial task, the same worker settings,
in the same run.

    bench/celery_vs_redis.py [--tasks 4000] [--rounds 3] [--concurrency 2] [--prefetch 4]

Each round, for each broker in turn: N tasks are published with no worker running (the
publish rate), then one `celery worker -P prefork` starts and drains them; the drain rate is
measured from the backlog it leaves (sampled every 20 ms) between 10% and 90% done, so the
worker's start and the last tasks' tail count for neither. The figures are the medians of the
rounds; the brokers alternate, so a disturbance of the machine falls on both.

Both servers are throwaways on Unix sockets in a temporary directory, without durability:
PostgreSQL (jobcap's private install, as the tests run it) with fsync off, and Debian's
redis-server with no snapshots and no append-only file. Both workers run with jobcap's
documented settings (acks late, reject on worker lost, no remote control, no events) and
prefetch multiplier --prefetch; the jobcap transport with its default options.

Needs the private install of test/run (it is made when missing, as test/run does), and
Debian's redis-server and python3-redis (installed with apt-get when missing, as root).
"""
import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "clients", "python"))
sys.path.insert(0, os.path.join(ROOT, "clients", "python", "tests"))

APP = r'''
import os
from celery import Celery

broker = os.environ["BENCH_BROKER"]
app = Celery("benchapp")
settings = dict(
    task_acks_late=True, task_reject_on_worker_lost=True, task_acks_on_failure_or_timeout=False,
    worker_prefetch_multiplier=int(os.environ["BENCH_PREFETCH"]),
    worker_enable_remote_control=False, worker_send_task_events=False,
    task_ignore_result=True, task_default_queue="bench", broker_connection_retry=False)
if broker == "jobcap":
    settings.update(broker_url="jobcap://", broker_transport="jobcap.contrib.kombu:Transport",
                    broker_transport_options={"conninfo": os.environ["BENCH_CONNINFO"]})
else:
    settings.update(broker_url=broker)
app.conf.update(settings)


@app.task
def noop(i):
    return None
'''


def private_bindir() -> str:
    if os.environ.get("JOBCAP_PG_BINDIR"):
        return os.environ["JOBCAP_PG_BINDIR"]
    out = subprocess.run(
        ["bash", "-c", f'source "{ROOT}/test/lib.sh" && jobcap_deps pgxs && '
                       'make -s -C "$JOBCAP_ROOT" PG_CONFIG="$PG_CONFIG" >/dev/null && '
                       'jobcap_tmp_install && echo "$TMP_BINDIR"'],
        capture_output=True, text=True, check=True).stdout
    return out.strip().splitlines()[-1]


def need_redis() -> str:
    """Debian's redis-server, and python3-redis for kombu's Redis transport."""
    missing = [] if shutil.which("redis-server") else ["redis-server"]
    try:
        import redis  # noqa: F401
    except ImportError:
        missing.append("python3-redis")
    if missing:
        if os.geteuid() != 0:
            sys.exit(f"missing: sudo apt-get install {' '.join(missing)}")
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        if subprocess.run(["apt-get", "install", "-y", "-q", *missing], env=env,
                          stdout=subprocess.DEVNULL).returncode != 0:
            subprocess.run(["apt-get", "update", "-q"], stdout=subprocess.DEVNULL, check=True)
            subprocess.run(["apt-get", "install", "-y", "-q", *missing], env=env,
                           stdout=subprocess.DEVNULL, check=True)
    return shutil.which("redis-server")


class Redis:
    def __init__(self, where: str):
        self.sock = os.path.join(where, "redis.sock")
        self.proc = subprocess.Popen(
            [need_redis(), "--port", "0", "--unixsocket", self.sock, "--unixsocketperm", "700",
             "--save", "", "--appendonly", "no", "--dir", where],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        import redis
        self.client = redis.Redis(unix_socket_path=self.sock)
        end = time.monotonic() + 20
        while True:
            try:
                self.client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > end:
                    raise
                time.sleep(0.05)
        self.url = f"redis+socket://{self.sock}"

    def backlog(self) -> int:
        return self.client.llen("bench")

    def in_flight(self) -> int:
        return self.client.hlen("unacked")

    def reset(self) -> None:
        self.client.flushall()

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


class Jobcap:
    def __init__(self, bindir: str):
        os.environ["JOBCAP_PG_BINDIR"] = bindir
        from pgserver import Server
        self.server = Server(settings={"shared_preload_libraries": "'jobcap'",
                                       "jobcap.database": "'postgres'"}).start()
        self.url = "jobcap"
        import psycopg
        self.conn = psycopg.connect(self.server.conninfo, autocommit=True)

    def backlog(self) -> int:
        try:
            return self.conn.execute("SELECT ready FROM jobcap.queue_depth('bench')"
                                     ).fetchone()[0]
        except Exception:   # not created yet
            return 0

    def in_flight(self) -> int:
        try:
            return self.conn.execute("SELECT running FROM jobcap.queue_depth('bench')"
                                     ).fetchone()[0]
        except Exception:
            return 0

    def reset(self) -> None:
        pass

    def stop(self) -> None:
        self.conn.close()
        self.server.stop()


def one_run(name, broker, work, env, tasks, concurrency):
    """Publish, then drain with a fresh worker: (publish rate, drain rate, drain seconds)."""
    broker.reset()
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-c",
                    "import sys, benchapp\n"
                    "for i in range(int(sys.argv[1])): benchapp.noop.delay(i)", str(tasks)],
                   cwd=work, env=env, check=True)
    publish = tasks / (time.monotonic() - t0)
    if broker.backlog() != tasks:
        raise SystemExit(f"{name}: {broker.backlog()} tasks queued, not {tasks}")
    log = open(os.path.join(work, f"worker-{name}.log"), "a")
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "benchapp", "worker", "-P", "prefork", "-c",
         str(concurrency), "--without-gossip", "--without-mingle", "--without-heartbeat",
         "-l", "warning"], cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True)
    samples = []
    try:
        end = time.monotonic() + 600
        while True:
            left = broker.backlog()
            now = time.monotonic()
            samples.append((now, left))
            if left == 0 and broker.in_flight() == 0:
                break
            if now > end or worker.poll() is not None:
                raise SystemExit(f"{name}: the worker did not drain the queue (see {log.name})")
            time.sleep(0.02)
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait()
        log.close()
    t10 = next(t for t, left in samples if left <= tasks * 0.9)
    t90 = next(t for t, left in samples if left <= tasks * 0.1)
    start = next(t for t, left in samples if left < tasks)
    return publish, tasks * 0.8 / (t90 - t10), samples[-1][0] - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--prefetch", type=int, default=4)
    args = parser.parse_args()
    # Stopped (SIGTERM, a timeout): unwind, so the workers and both servers stop too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    work = tempfile.mkdtemp(prefix="jobcap-bench-celery-")
    with open(os.path.join(work, "benchapp.py"), "w") as f:
        f.write(APP)
    brokers = {}
    try:
        brokers["jobcap"] = Jobcap(private_bindir())
        brokers["redis"] = Redis(work)
        results = {name: [] for name in brokers}
        pythonpath = os.pathsep.join([work, os.path.join(ROOT, "clients", "python")])
        print(f"celery worker -P prefork -c {args.concurrency}, prefetch multiplier "
              f"{args.prefetch}, {args.tasks} trivial tasks per run, {args.rounds} rounds")
        print(f"{'round':>5} {'broker':>7} {'publish/s':>10} {'drain/s':>9} {'drain s':>8}")
        for r in range(1, args.rounds + 1):
            order = ["jobcap", "redis"] if r % 2 else ["redis", "jobcap"]
            for name in order:
                env = dict(os.environ, PYTHONPATH=pythonpath, BENCH_BROKER=brokers[name].url,
                           BENCH_PREFETCH=str(args.prefetch),
                           BENCH_CONNINFO=brokers["jobcap"].server.conninfo)
                publish, drain, seconds = one_run(name, brokers[name], work, env, args.tasks,
                                                  args.concurrency)
                results[name].append((publish, drain))
                print(f"{r:>5} {name:>7} {publish:>10.0f} {drain:>9.0f} {seconds:>8.2f}",
                      flush=True)
        med = {n: (statistics.median(p for p, _ in v), statistics.median(d for _, d in v))
               for n, v in results.items()}
        print(f"median  jobcap publish {med['jobcap'][0]:.0f}/s drain {med['jobcap'][1]:.0f}/s;"
              f" redis publish {med['redis'][0]:.0f}/s drain {med['redis'][1]:.0f}/s")
        print(f"jobcap/redis: drain {med['jobcap'][1] / med['redis'][1]:.2f} (target >= 0.7), "
              f"publish {med['jobcap'][0] / med['redis'][0]:.2f}")
    finally:
        for b in brokers.values():
            b.stop()
        shutil.rmtree(work, True)


if __name__ == "__main__":
    main()
