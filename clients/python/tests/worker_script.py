"""A worker process for the tests that need a real main thread and real signals.

usage: worker_script.py CONNINFO QUEUE MODE   (environment: LEASE, TIMEOUT, ISOLATE=0 for the
in-process mode, PREFETCH, CONCURRENCY)
  slow     each job writes an effect, then sleeps 1 s (SIGTERM must let it finish)
  sleeper  each job sleeps 30 s (the main thread's timer must interrupt it)
  hang     each job swallows JobTimeout and keeps going (the process must exit, status 70)
  light    each job does nothing in its transaction (it is completed in a batch)
  cancel   each job writes an effect, prints "started ID", sleeps 30 s unless its payload is
           {"quick": true}; every outcome is printed as "settled ID OUTCOME" (LISTEN=0: the
           worker does not LISTEN and polls for cancellations every CANCEL_POLL seconds)
"""
import logging
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import jobcap  # noqa: E402

conninfo, queue, mode = sys.argv[1:4]
logging.basicConfig(level=logging.INFO, format="%(message)s")


def handle(job: jobcap.Job) -> None:
    if mode == "light":
        time.sleep(0.002)
        return
    job.execute("INSERT INTO effects (job_id, fence) VALUES (%s, %s)", (job.id, job.fence))
    if mode == "cancel":
        print(f"started {job.id}", flush=True)
        if not (job.payload or {}).get("quick"):
            time.sleep(30)
    elif mode == "slow":
        print(f"started {job.id}", flush=True)
        time.sleep(1.0)
    elif mode == "sleeper":
        time.sleep(30)
    elif mode == "hang":
        while True:
            try:
                time.sleep(30)
            except BaseException:  # the kind of handler the hard exit is for
                pass


lease = float(os.environ.get("LEASE", "5"))
timeout = float(os.environ.get("TIMEOUT", "3"))
isolate = os.environ.get("ISOLATE", "1") == "1"
prefetch = int(os.environ.get("PREFETCH", "0"))
concurrency = int(os.environ.get("CONCURRENCY", "1"))
listen = {"0": False, "1": True}.get(os.environ.get("LISTEN", ""))
cancel_poll = float(os.environ.get("CANCEL_POLL", "1"))


def settled(job, outcome, error):
    print(f"settled {job.id} {outcome}", flush=True)


jobcap.Worker(conninfo, queue, handle, lease=lease, timeout=timeout, poll_max=0.2,
              isolate=isolate, prefetch=prefetch, concurrency=concurrency, listen=listen,
              cancel_poll=cancel_poll, on_settled=settled if mode == "cancel" else None).run()
print("exited cleanly", flush=True)
