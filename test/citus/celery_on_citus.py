"""Celery on a Citus cluster: a real `celery worker` (prefork, acks late) on the jobcap transport,
connected to the coordinator of a coordinator and two worker nodes, runs 300 tasks. Each must
succeed at its first attempt with one effect, and none may be left running.

Celery's event loop acks the tasks that finished in one turn of the loop together, in one
complete_jobs. A cluster refuses that call (0A000: Citus routes only a call that names one job's
shard); the transport re-raised the refusal, the tasks were never completed, and they ran again
once their leases lapsed. It now completes each on its own from the first refusal on.

    JOBCAP_PG_BINDIR=$(test/citus/build | tail -1) python3 test/citus/celery_on_citus.py

(run by `test/run citus`). The cluster is the chaos harness's (test/chaos/chaos.py --citus).
"""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
sys.path.insert(0, os.path.join(ROOT, "test", "chaos"))
sys.path.insert(0, os.path.join(ROOT, "clients", "python"))
import psycopg  # noqa: E402
from chaos import CitusCluster  # noqa: E402

TASKS = 300
LEASE = 4.0

APP = '''
import os
import time
import psycopg
from celery import Celery
from jobcap.contrib.kombu import fence_of

CONNINFO = os.environ["CITUS_CONNINFO"]
app = Celery("on_citus", broker_url="jobcap://")
app.conf.update(
    broker_transport_options={"conninfo": CONNINFO, "visibility_timeout": %(lease)s,
                              "max_attempts": 3, "polling_interval": 0.05},
    task_acks_late=True, task_reject_on_worker_lost=True,
    task_acks_on_failure_or_timeout=False, worker_prefetch_multiplier=4, worker_enable_remote_control=False,
    worker_send_task_events=False, result_backend="disabled://", task_default_queue="on_citus")


@app.task(bind=True)
def record(self, n):
    # Done on a 100 ms tick of the clock: the two pool processes finish together, so their
    # acks fall in one turn of the loop and the batch is tried (quick tasks finishing at random
    # moments were acked one by one through a whole run on a loaded machine).
    time.sleep(0.1 - time.time() %% 0.1)
    job_id, fence = fence_of(self.request)
    with psycopg.connect(CONNINFO, autocommit=True) as conn:
        conn.execute("INSERT INTO effects (job_id, fence, n) VALUES (%%s, %%s, %%s)",
                     (job_id, fence, n))
''' % {"lease": LEASE}


def main() -> int:
    bindir = os.environ.get("JOBCAP_PG_BINDIR")
    if not bindir:
        raise SystemExit("JOBCAP_PG_BINDIR is not set: the private install with Citus "
                         "(test/citus/build | tail -1)")
    workdir = tempfile.mkdtemp(prefix="jobcap-celery-citus-")
    os.chmod(workdir, 0o755)
    cluster = CitusCluster(bindir, workdir)
    worker = None
    ok = False
    try:
        cluster.init({})
        cluster.start()
        with psycopg.connect(cluster.conninfo, autocommit=True) as conn:
            cluster.distribute(conn)
            conn.execute("CREATE TABLE effects (job_id bigint, fence bigint, n int)")
        with open(os.path.join(workdir, "on_citus.py"), "w") as f:
            f.write(APP)
        env = dict(os.environ, CITUS_CONNINFO=cluster.conninfo,
                   PYTHONPATH=os.pathsep.join([workdir, os.path.abspath(
                       os.path.join(ROOT, "clients", "python"))]))
        # The queue is made by the first publish; the worker starts on it.
        sys.path.insert(0, workdir)
        os.environ["CITUS_CONNINFO"] = cluster.conninfo
        import on_citus  # noqa: E402
        on_citus.record.delay(0)
        log = open(os.path.join(workdir, "celery.log"), "w+")
        worker = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "on_citus", "worker", "-P", "prefork", "-c", "2",
             "--without-gossip", "--without-mingle", "--without-heartbeat", "-l", "info"],
            cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        for n in range(1, TASKS):
            on_citus.record.delay(n)
        with psycopg.connect(cluster.conninfo, autocommit=True) as conn:
            def counts():
                return conn.execute(
                    "SELECT count(*) FILTER (WHERE state = 'succeeded'),"
                    "       count(*) FILTER (WHERE state = 'running'), count(*),"
                    "       max(attempts)"
                    "  FROM jobcap.jobs WHERE queue = 'on_citus'").fetchone()
            end = time.monotonic() + 120
            while counts()[0] < TASKS and time.monotonic() < end and worker.poll() is None:
                time.sleep(0.2)
            # Past a lease more: a task that was run but not completed shows as a second attempt.
            time.sleep(LEASE + 2)
            succeeded, running, total, max_attempts = counts()
            effects, twice = conn.execute(
                "SELECT count(*), count(*) - count(DISTINCT job_id) FROM effects").fetchone()
        log.seek(0)
        out = log.read()
        refused = out.count("complete_jobs is refused here")
        print(f"celery on citus: {total} tasks, {succeeded} succeeded, {running} running, "
              f"max attempts {max_attempts}, {effects} effects ({twice} of a job run twice), "
              f"complete_jobs refused {refused} time(s) then not sent")
        checks = [("every task enqueued", total == TASKS),
                  ("every task succeeded", succeeded == TASKS),
                  ("none left running", running == 0),
                  ("each at its first attempt", max_attempts == 1),
                  ("one effect per task", effects == TASKS and twice == 0),
                  # Several acks in one turn of the loop (prefetch 4, quick tasks): the batch
                  # was tried, refused, and the transport went on one by one.
                  ("complete_jobs tried and refused, once per pool process or fewer",
                   1 <= refused <= 3)]
        for name, passed in checks:
            print(f"{'ok' if passed else 'not ok'} - {name}")
        ok = all(passed for _, passed in checks)
        if not ok:
            print(out[-4000:])
    finally:
        if worker is not None and worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
            try:
                worker.wait(20)
            except subprocess.TimeoutExpired:
                pass
        if worker is not None:
            try:
                os.killpg(worker.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        cluster.stop()
        if ok:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"kept {workdir}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
