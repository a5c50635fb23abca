"""Why Django-Q's test_recycle fails on PostgreSQL, whichever the broker (run on demand:
python3 djq_recycle_probe.py; about a minute).

test_recycle lets a Sentinel (forked pusher, worker, monitor) run three tasks for 3 s, then runs
two more in the test's own process with SAVE_LIMIT = 1 and asserts that one Success row is left.
Django-Q's pruning deletes one row per saved success, so that holds only if the Sentinel's three
results are not in the database the test counts. This runs test_recycle three ways, records the
Success rows the test's database holds right after the Sentinel ran (djq_plugin.py's probe), and
asserts what the three give:

  Redis broker, SQLite (Django-Q's own settings)   0 rows: each forked process saves into its
                                                    copy of the in-memory test database; passes
  Redis broker, PostgreSQL                          3 rows; fails (3 == 1)
  jobcap broker, PostgreSQL                         3 rows; fails (3 == 1)
"""
import os
import subprocess
import sys
import tempfile

from common import HERE, start_server
from run_django_q_suite import SUITE, RedisServer, debian_packages


def probe(server, redis, broker, sqlite=None):
    work = tempfile.mkdtemp(prefix="jobcap-probe-")
    os.chmod(work, 0o777)
    rows = os.path.join(work, "rows")
    env = dict(os.environ,
               PYTHONPATH=os.pathsep.join([os.path.join(HERE, "..", ".."), HERE]),
               DJANGO_SETTINGS_MODULE="djq_settings", JOBCAP_TEST_HOST=server.dir,
               JOBCAP_TEST_PORT=str(server.port), JOBCAP_TEST_BROKER=broker,
               JOBCAP_TEST_REDIS_PORT=str(redis.port), JOBCAP_DJQ_RECYCLE_PROBE=rows,
               JOBCAP_TEST_DATABASE=f"test_probe_{broker}_{os.getpid()}")
    if sqlite:
        env["JOBCAP_TEST_SQLITE"] = os.path.join(work, "db.sqlite3")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "djq_plugin", "-p", "no:cacheprovider", "-q",
         "--runxfail", "--rootdir", SUITE, "-k", "test_recycle",
         os.path.join(SUITE, "test_cluster.py")], cwd=HERE, env=env, capture_output=True,
        text=True)
    with open(rows) as f:
        return int(f.read()), result.returncode == 0, "assert 3 == 1" in result.stdout


def main() -> int:
    debian_packages()
    server = start_server()
    redis = RedisServer()
    try:
        got = {"redis, sqlite": probe(server, redis, "redis", sqlite=True),
               "redis, postgresql": probe(server, redis, "redis"),
               "jobcap, postgresql": probe(server, redis, "jobcap")}
    finally:
        redis.stop()
        server.stop()
    for name, (rows, passed, three) in got.items():
        print(f"{name:20} Success rows after the Sentinel: {rows}; test_recycle "
              + ("passed" if passed else "failed" + (" (assert 3 == 1)" if three else "")))
    assert got["redis, sqlite"] == (0, True, False), got
    assert got["redis, postgresql"] == (3, False, True), got
    assert got["jobcap, postgresql"] == (3, False, True), got
    return 0


if __name__ == "__main__":
    sys.exit(main())
