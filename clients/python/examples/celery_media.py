"""The postmortem's media pipeline as a Celery app on jobcap (used by `make demo`).

    JOBCAP_CONNINFO="host=... dbname=app" celery -A celery_media worker -P prefork -c 2 \\
        --without-gossip --without-mingle --without-heartbeat

decode(file) stands for the decoder: a corrupt file makes it hang until the hard timeout kills
it, which is a SIGKILL of its process, on every attempt. On jobcap each attempt is counted when
it is claimed, so the corrupt file is dead after the queue's max_attempts while good files flow.
"""
import os
import signal
import time

import psycopg
from celery import Celery

import jobcap
import jobcap.contrib.kombu  # registers jobcap://
from jobcap.contrib.kombu import fence_of

CONNINFO = os.environ["JOBCAP_CONNINFO"]

app = Celery("media", broker_url="jobcap://")
app.conf.update(
    broker_transport_options={"conninfo": CONNINFO, "visibility_timeout": 2,
                              "polling_interval": 0.1},
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    task_acks_on_failure_or_timeout=False,
    worker_enable_remote_control=False,
    worker_prefetch_multiplier=1,
    task_default_queue="decode",
    worker_lost_wait=1,   # report a killed pool process after 1 s (10 s by default)
)


@app.task(bind=True)
def decode(self, path):
    if "corrupt" in path:
        # the decoder makes no progress; the hard timeout's SIGKILL ends it, every time
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.2)
    job_id, fence = fence_of(self.request)
    with psycopg.connect(CONNINFO) as conn:   # the effect commits only under a current lease
        jobcap.assert_fence(conn, job_id, fence)
        conn.execute("INSERT INTO decoded (path, job_id, fence) VALUES (%s, %s, %s)",
                     (path, job_id, fence))
