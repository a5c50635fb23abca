"""A chaos worker in Python: the jobcap Python client running the chaos kinds.

usage: worker.py CONNINFO NAME   (settings in the environment: CHAOS_LEASE, CHAOS_TIMEOUT,
CHAOS_BATCH, seconds and jobs). Every handler writes its effect in the job's transaction, so it
commits with complete_job or not at all. Stale fences and hanger steps go to the events table.
"""
import os
import signal
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "clients", "python"))
import psycopg  # noqa: E402
import jobcap  # noqa: E402

conninfo, name = sys.argv[1], sys.argv[2]
lease = float(os.environ.get("CHAOS_LEASE", "3"))
timeout = float(os.environ.get("CHAOS_TIMEOUT", "2"))
batch = int(os.environ.get("CHAOS_BATCH", "5"))
# The failover run (test/failover) keeps a ledger outside the database: every claim a handler
# was given and every settlement the worker was told committed, one line each (O_APPEND).
ledger_path = os.environ.get("CHAOS_LEDGER")
side = None  # autocommit connection for events and for the hanger's moves outside its job


def side_conn():
    global side
    if side is None or side.closed or side.broken:
        side = psycopg.connect(conninfo, autocommit=True, application_name=f"chaos side {name}")
    return side


def event(job, what):
    try:
        side_conn().execute("INSERT INTO events (worker, job_id, fence, event) VALUES"
                            " (%s, %s, %s, %s)", (name, job.id, job.fence, what))
    except psycopg.Error:
        pass  # the server may be restarting; events are counted at least-once-ish


def ledger(what, job):
    if ledger_path:
        with open(ledger_path, "a") as f:
            f.write(f"{what} {job.id} {job.fence} {name}\n")


def effect(conn, job):
    conn.execute("INSERT INTO effects (job_id, fence, worker) VALUES (%s, %s, %s)",
                 (job.id, job.fence, name))


def hang(job):
    """Runs past its lease: the lease expires under it (as the tests expire one), and it waits,
    within its own timeout, for the reaper to take the job back."""
    conn = side_conn()
    conn.execute("UPDATE jobcap.jobs SET lease_expires_at = now() - interval '1 second'"
                 " WHERE job_id = %s AND fence = %s AND state = 'running'", (job.id, job.fence))
    end = time.monotonic() + timeout * 0.7
    while time.monotonic() < end:
        row = conn.execute("SELECT state = 'running' AND fence = %s FROM jobcap.jobs"
                           " WHERE job_id = %s", (job.fence, job.id)).fetchone()
        if not row[0]:
            break
        time.sleep(0.05)
    else:
        event(job, "hanger_not_reaped")
        return
    event(job, "hanger_reaped")
    # An effect under the stale fence, guarded as a careful handler guards it: rejected.
    try:
        with conn.transaction():
            effect(conn, job)
            jobcap.assert_fence(conn, job.id, job.fence)
        event(job, "stale_effect_accepted")
    except jobcap.StaleFence:
        event(job, "stale_effect_rejected")


def handle(job):
    ledger("claim", job)
    kind = job.payload["kind"]
    if kind == "killer":
        effect(job.conn, job)  # uncommitted: it must vanish with the process
        os.kill(os.getpid(), signal.SIGKILL)
    if kind == "poison":
        raise RuntimeError(f"poison job {job.id} cannot be processed")
    if kind == "flaky" and job.attempt <= job.payload["fail_times"]:
        raise RuntimeError(f"flaky job {job.id} failed on attempt {job.attempt}")
    if kind == "hanger" and job.attempt <= job.payload["hang_attempts"]:
        hang(job)
    time.sleep(job.payload.get("work_ms", 0) / 1000)
    effect(job.conn, job)


def settled(job, outcome, error):
    if outcome in ("succeeded", "dead"):
        ledger(outcome, job)
    if outcome == "stale":
        event(job, f"stale:{getattr(error, 'operation', None) or 'handler'}")


try:
    jobcap.Worker(conninfo, "chaos", handle, name=name, batch=batch, lease=lease,
                  timeout=timeout, poll_min=0.05, poll_max=1.0, on_settled=settled).run()
except BaseException:
    import traceback
    print(f"worker {name}: uncaught {traceback.format_exc()}", flush=True)
    sys.exit(1)
