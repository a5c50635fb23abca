"""Runs Django-Q's own test suite (Debian's python3-django-q, in place: every test file of
django_q/tests) on Django-Q's Redis broker and on the jobcap broker, with the same settings
(djq_settings.py: the same PostgreSQL server, CACHES left at Django's default), and compares
them: the jobcap broker must pass every test the Redis broker passes.

    python3 run_django_q_suite.py [--broker jobcap|redis|both] [--once] [pytest arguments]

--broker both (the default) runs Redis first, then jobcap, on one throwaway PostgreSQL server
(a test database each), and fails when a test that passed on Redis did not pass on jobcap, or
when either run has an unexpected outcome. Redis runs on a throwaway redis-server on 127.0.0.1
(Debian's redis-server). Debian's redis-server and python3-croniter (test_scheduler.py's cron
schedules) are installed with apt-get when missing and we are root. Prints pytest's
summary with the reason of every skip and expected failure (-rsx, see djq_plugin.py) and a
table of each test's outcome per run.

The jobcap suite then runs a second time against the same server (not with --once), as a
developer runs it twice in a row: the second run's pytest-django drops the first run's test
database and creates it again while jobcap's background worker serves it (jobcap.database =
'*'): the worker leaves a database that is being dropped, and the second run must give the same
outcomes as the first.
"""
import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

from common import HERE, start_server

SUITE = "/usr/lib/python3/dist-packages/django_q/tests"
# Django-Q's whole suite; DJQ_FILES="test_cluster.py ..." runs some of its files.
FILES = os.environ.get("DJQ_FILES", "test_admin.py test_brokers.py test_cached.py "
                       "test_cluster.py test_commands.py test_monitor.py "
                       "test_scheduler.py").split()
REDIS_SERVER = "/usr/bin/redis-server"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


DEBIAN_PACKAGES = ("redis-server", "python3-croniter")


def debian_packages():
    missing = [p for p in DEBIAN_PACKAGES if subprocess.run(
        ["dpkg-query", "-W", "-f=${Status}", p], capture_output=True,
        text=True).stdout != "install ok installed"]
    if not missing:
        return
    if os.geteuid() != 0:
        raise RuntimeError(f"missing Debian packages: apt-get install {' '.join(missing)}")
    subprocess.run(["apt-get", "install", "-y", "-q", *missing], check=True,
                   env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"),
                   stdout=subprocess.DEVNULL)


class RedisServer:
    """A redis-server of its own on loopback, without persistence, removed at the end."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="jobcap-redis-")
        self.port = free_port()
        self.proc = subprocess.Popen(
            [REDIS_SERVER, "--bind", "127.0.0.1", "--port", str(self.port), "--save", "",
             "--appendonly", "no", "--dir", self.dir, "--logfile", os.path.join(self.dir, "log")])
        end = time.monotonic() + 20
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                pass
            if time.monotonic() > end or self.proc.poll() is not None:
                self.stop()
                raise RuntimeError("redis-server did not start")
            time.sleep(0.1)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


def run_suite(broker: str, server, redis, pytest_args, label: str):
    """One pytest run; returns (exit status, {test id: outcome}, its output)."""
    outcomes = os.path.join(server.dir, f"outcomes-{label}.json")
    env = dict(os.environ,
               PYTHONPATH=os.pathsep.join([os.path.join(HERE, "..", ".."), HERE]),
               DJANGO_SETTINGS_MODULE="djq_settings", JOBCAP_TEST_HOST=server.dir,
               JOBCAP_TEST_PORT=str(server.port), JOBCAP_TEST_BROKER=broker,
               JOBCAP_TEST_DATABASE=f"test_djq_{broker}", JOBCAP_DJQ_OUTCOMES=outcomes)
    if redis is not None:
        env["JOBCAP_TEST_REDIS_PORT"] = str(redis.port)
    cmd = [sys.executable, "-m", "pytest", "-p", "djq_plugin", "-p", "no:cacheprovider",
           "-rsx", "-v", "-o", "faulthandler_timeout=120", "--rootdir", SUITE, *pytest_args,
           *[os.path.join(SUITE, f) for f in FILES]]
    print(f"\n=== Django-Q's suite: {label}", flush=True)
    proc = subprocess.Popen(cmd, cwd=HERE, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    output = []
    for line in proc.stdout:
        print(line, end="", flush=True)
        output.append(line)
    status = proc.wait()
    try:
        with open(outcomes) as f:
            return status, json.load(f), "".join(output)
    except OSError:
        return status, {}, "".join(output)


def compare(runs) -> bool:
    """Prints one line per test with its outcome in each run; True when no run fell short
    of the first run's passes."""
    labels = list(runs)
    tests = sorted({t for _, outcomes, _ in runs.values() for t in outcomes})
    width = max([len(t) for t in tests] + [10])
    print("\n=== outcomes per test\n" + "test".ljust(width) + "".join(
        f"  {label:>12}" for label in labels))
    ok = True
    for test in tests:
        row = [runs[label][1].get(test, "-") for label in labels]
        worse = row[0] == "passed" and any(
            r not in ("passed", "other broker") for r in row[1:])
        ok &= not worse
        print(test.ljust(width) + "".join(f"  {r:>12}" for r in row)
              + (f"   <- passed on {labels[0]} only" if worse else ""))
    for label in labels:
        counts = {}
        for outcome in runs[label][1].values():
            counts[outcome] = counts.get(outcome, 0) + 1
        print(f"{label}: " + ", ".join(f"{n} {o}" for o, n in sorted(counts.items()))
              + f" (pytest exit status {runs[label][0]})")
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--broker", choices=("jobcap", "redis", "both"), default="both")
    parser.add_argument("--once", action="store_true")
    args, pytest_args = parser.parse_known_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))   # stop the servers on the way out
    debian_packages()
    server = start_server(**{"jobcap.database": "'*'"})
    redis = None
    runs = {}
    try:
        if args.broker in ("redis", "both"):
            redis = RedisServer()
            runs["redis"] = run_suite("redis", server, redis, pytest_args, "redis")
        if args.broker in ("jobcap", "both"):
            runs["jobcap"] = run_suite("jobcap", server, None, pytest_args, "jobcap")
        again = None
        if not args.once and "jobcap" in runs:
            again = run_suite("jobcap", server, None, pytest_args, "jobcap, again")
            runs["jobcap, again"] = again
        ok = compare({k: v for k, v in runs.items() if v is not again})
        ok &= all(run[0] == 0 for run in runs.values())
        if again is not None:
            ok &= compare({"jobcap": runs["jobcap"], "jobcap, again": again})
        return 0 if ok else 1
    finally:
        if redis is not None:
            redis.stop()
        server.stop()


if __name__ == "__main__":
    sys.exit(main())
