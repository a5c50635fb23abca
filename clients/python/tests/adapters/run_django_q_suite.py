"""Runs Django-Q's own test suite (Debian's python3-django-q, in place) against the jobcap
broker on a throwaway server: test_cluster.py and test_brokers.py.

    python3 run_django_q_suite.py [pytest arguments]

Prints pytest's summary with the reason of every skip and expected failure (-rsx, see
djq_plugin.py) and exits with pytest's status.
"""
import os
import signal
import subprocess
import sys

from common import HERE, start_server

SUITE = "/usr/lib/python3/dist-packages/django_q/tests"
FILES = ["test_cluster.py", "test_brokers.py"]


def main() -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))   # stop the server on the way out
    server = start_server(**{"jobcap.database": "'*'"})
    try:
        cache = os.path.join(server.dir, "cache")
        env = dict(os.environ, JOBCAP_TEST_CACHE_DIR=cache,
                   PYTHONPATH=os.pathsep.join([os.path.join(HERE, "..", ".."), HERE]),
                   DJANGO_SETTINGS_MODULE="djq_settings", JOBCAP_TEST_HOST=server.dir,
                   JOBCAP_TEST_PORT=str(server.port))
        cmd = [sys.executable, "-m", "pytest", "-p", "djq_plugin", "-p", "no:cacheprovider",
               "-rsx", "-v", "-o", "faulthandler_timeout=120", "--rootdir", SUITE, *sys.argv[1:],
               *[os.path.join(SUITE, f) for f in FILES]]
        return subprocess.run(cmd, cwd=HERE, env=env).returncode
    finally:
        server.stop()


if __name__ == "__main__":
    sys.exit(main())
