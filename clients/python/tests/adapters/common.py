"""Shared by the adapter tests: one throwaway server with the reaper running every 200 ms."""
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", ".."))   # the jobcap package
sys.path.insert(0, os.path.join(HERE, ".."))         # pgserver

from pgserver import Server  # noqa: E402

REAPER = {"shared_preload_libraries": "'jobcap'", "jobcap.database": "'postgres'",
          "jobcap.reap_interval": "200"}


def start_server(**settings) -> Server:
    conf = dict(REAPER)
    conf.update(settings)
    return Server(settings=conf).start()


def wait_for(predicate, timeout=20.0, interval=0.05, what="condition"):
    end = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"{what} not met within {timeout}s")
        time.sleep(interval)
