"""The Celery app the adapter tests run a real `celery worker` (prefork) for.

Its broker is the jobcap transport on the test server named by $JOBCAP_TEST_CONNINFO; tasks
record what they did in table effects, each write under assert_fence in its own transaction.
"""
import os
import signal
import time

import psycopg
from celery import Celery

import jobcap
from jobcap.contrib.kombu import fence_of

CONNINFO = os.environ["JOBCAP_TEST_CONNINFO"]

app = Celery("jobcap_test", broker_url="jobcap://")
app.conf.update(
    broker_transport_options={
        "conninfo": CONNINFO, "visibility_timeout": float(os.environ.get("JOBCAP_TEST_LEASE", 3)),
        "max_attempts": 3, "backoff_base": 0, "backoff_max": 0,
        "polling_interval": float(os.environ.get("JOBCAP_TEST_POLL", 0.1))},
    task_acks_late=not os.environ.get("JOBCAP_TEST_ACKS_EARLY"),
    task_reject_on_worker_lost=True,
    task_acks_on_failure_or_timeout=False,
    worker_prefetch_multiplier=int(os.environ.get("JOBCAP_TEST_PREFETCH", 1)),
    worker_enable_remote_control=bool(os.environ.get("JOBCAP_TEST_REMOTE_CONTROL")),
    worker_send_task_events=False,
    result_backend=os.environ.get("JOBCAP_TEST_RESULTS", "disabled://"),
    task_default_queue="celery",
    broker_connection_retry=True,
    broker_connection_max_retries=None,
)


def record(request, what):
    """One effects row, committed only under a current lease."""
    job_id, fence = fence_of(request)
    with psycopg.connect(CONNINFO) as conn:
        jobcap.assert_fence(conn, job_id, fence)
        conn.execute("INSERT INTO effects (job_id, fence, attempt, what) VALUES (%s, %s, %s, %s)",
                     (job_id, fence, request.jobcap_attempt, what))


@app.task(bind=True)
def ok(self, what):
    record(self.request, what)
    return what


@app.task(bind=True)
def boom(self, what):
    raise ValueError(f"cannot process {what}")


@app.task(bind=True, max_retries=None)
def flaky(self, what, succeed_on):
    """Retries (self.retry) until attempt succeed_on; retries are counted by jobcap."""
    if self.request.jobcap_attempt < succeed_on:
        raise self.retry(countdown=0.2)
    record(self.request, what)


@app.task(bind=True, time_limit=1)
def slow(self, what):
    time.sleep(30)


@app.task(bind=True, soft_time_limit=0.5)
def soft(self, what):
    time.sleep(30)


@app.task(bind=True)
def suicide(self, what):
    """The corrupt file: its decoder process is SIGKILLed on every attempt."""
    with psycopg.connect(CONNINFO) as conn:
        conn.execute("INSERT INTO effects (job_id, fence, attempt, what) VALUES (%s, %s, %s, %s)",
                     (*fence_of(self.request), self.request.jobcap_attempt, what + " started"))
    os.kill(os.getpid(), signal.SIGKILL)


@app.task(bind=True)
def sleepy(self, what, seconds):
    time.sleep(seconds)
    record(self.request, what)


@app.task(bind=True, acks_late=False)
def early_ack(self, what):
    record(self.request, what)


@app.task(bind=True)
def marked(self, what, seconds):
    """Says it started (outside any fence), works for a while, then records under its fence."""
    with psycopg.connect(CONNINFO, autocommit=True) as conn:
        conn.execute("INSERT INTO effects (job_id, fence, attempt, what) VALUES (%s, %s, %s, %s)",
                     (*fence_of(self.request), self.request.jobcap_attempt, what + " started"))
    time.sleep(seconds)
    record(self.request, what)


@app.task(bind=True)
def chord_done(self, results):
    record(self.request, "chord done: " + ",".join(sorted(map(str, results))))
