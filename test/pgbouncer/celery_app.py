"""A Celery app on the jobcap transport through the pooler ($PGB_CONNINFO, queue $PGB_QUEUE).
Each task writes its effect in one autocommit statement (the app's own work, not the
transport's). A task with hang set hangs the first time it starts (table starts counts the
starts, in autocommit: the matrix SIGKILLs the worker then)."""
import os
import time

import psycopg
from celery import Celery

from jobcap.contrib.kombu import fence_of

CONNINFO = os.environ["PGB_CONNINFO"]
app = Celery("jobcap_pgbouncer", broker_url="jobcap://")
app.conf.update(
    broker_transport_options={"conninfo": CONNINFO, "visibility_timeout": 4.0,
                              "max_attempts": 3, "polling_interval": 0.5},
    task_acks_late=True, task_reject_on_worker_lost=True,
    task_acks_on_failure_or_timeout=False, worker_prefetch_multiplier=1, worker_enable_remote_control=False,
    worker_send_task_events=False, result_backend="disabled://",
    task_default_queue=os.environ["PGB_QUEUE"], broker_connection_retry=True)


@app.task(bind=True)
def effect(self, n, hang=False):
    job_id, fence = fence_of(self.request)
    with psycopg.connect(CONNINFO, autocommit=True, prepare_threshold=None) as conn:
        if hang:
            conn.execute("INSERT INTO starts (client, n) VALUES ('celery', %s)", (n,))
            if conn.execute("SELECT count(*) FROM starts WHERE client = 'celery' AND n = %s",
                            (n,)).fetchone()[0] == 1:
                time.sleep(600)
        conn.execute("INSERT INTO effects (client, n, job_id, fence) VALUES ('celery', %s, %s, %s)",
                     (n, job_id, fence))
