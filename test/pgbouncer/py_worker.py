"""The Python client's worker through the pooler: py_worker.py CONNINFO QUEUE [listen]
(isolated, two pool processes). Each job writes its effect in the job's transaction; a job
with "hang" in its payload hangs on its first attempt (the matrix SIGKILLs the worker then)."""
import logging
import sys
import time

sys.path.insert(0, sys.argv[4] if len(sys.argv) > 4 else "")
import jobcap  # noqa: E402

conninfo, queue = sys.argv[1], sys.argv[2]
listen = {"listen": True, "default": None}[sys.argv[3]]
logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")


def handle(job):
    if job.payload.get("hang") and job.attempt == 1:
        time.sleep(600)
    job.execute("INSERT INTO effects (client, n, job_id, fence) VALUES ('py', %s, %s, %s)",
                (job.payload["n"], job.id, job.fence))


options = {} if listen is None else {"listen": listen}
try:
    jobcap.Worker(conninfo, queue, handle, concurrency=2, lease=4, poll_min=0.05,
                  poll_max=1.0, **options).run()
except getattr(jobcap, "PoolModeError", ()) as error:
    print(f"refused: {error}", flush=True)
    sys.exit(3)
