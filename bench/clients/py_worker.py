"""A jobcap Python worker with a trivial handler, for bench/clients/run.

usage: py_worker.py CONNINFO QUEUE MODE [OPTION=VALUE ...]
  MODE isolated (the default mode: a pool of processes) or inprocess; options are the Worker's
  (concurrency, prefetch, batch), integers. SIGTERM stops it as it stops any worker.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "clients", "python"))
import jobcap  # noqa: E402

conninfo, queue, mode = sys.argv[1:4]
options = {k: int(v) for k, v in (a.split("=", 1) for a in sys.argv[4:])}


def handle(job):
    pass


jobcap.Worker(conninfo, queue, handle, isolate=mode == "isolated", lease=300, poll_max=1.0,
              **options).run()
