"""The worker loop: claim jobs, run each under a deadline, settle it, repeat.

Isolated (the default, ``isolate=True``): the process that calls run() is a supervisor. It owns
the claims, the leases and the heartbeats of the jobs it holds, and runs the handlers in a pool
of ``concurrency`` processes forked when run() starts (os.fork), each with a connection of its
own that lives as long as the process: a job's handler, its writes through job.conn and its
completion run in one transaction in the pool process that runs it. A handler that SIGKILLs,
segfaults or exits its process costs nothing to the other jobs held: the supervisor sees the
process die, records the attempt at once with jobcap.crash_job ("killed by signal N", history
kind 'crashed') and forks a replacement; the jobs not started yet are run as usual. It holds
at most ``concurrency + prefetch`` claimed jobs (defaults 1 and 0), and on stop() or SIGTERM
gives the unstarted ones back with jobcap.release_job (pending again, their attempts not
counted) while the running ones finish. A handler that ignores its timeout is SIGKILLed by the
supervisor before the lease runs out and recorded as a crash.

In-process (``isolate=False``): one Worker is one connection doing the work (claims, and each
job's transaction) plus one side connection for heartbeats. Jobs of a batch run one after
another in the thread that called run(); a supervisor thread keeps the leases of the jobs still
waiting in the batch alive and ends a handler that will not stop.

Settling. A job whose handler wrote through job.conn completes in its own transaction, with
those writes (in-process, the last job of a batch completes with jobcap.complete_and_claim, which
claims the next batch in the same transaction). A job whose handler returned without a
statement in its transaction has nothing to commit with its completion: it is completed later,
together with the others that finished meanwhile and in one transaction with the next claim:
jobcap.complete_and_claim for one job, jobcap.complete_jobs for more, each with its own fence.
complete_jobs is all or nothing, so when it raises a stale fence (JC001) the batch rolls back
and each of its jobs is completed on its own: a stale fence costs its job only (outcome
"stale"). Isolated, the pool process reports such a job to the supervisor, which completes it
with the next claim; in-process, the jobs of a batch are completed with the next claim, or
sooner when one has waited ``settle_window`` seconds when the next handler starts. A job
waiting to be completed keeps its lease by heartbeats, as a job waiting to start does.

The deadline. A job's handler must finish `timeout` seconds after its lease was last granted
(claim or heartbeat), and timeout < lease: the handler is stopped while the lease is still
ours, so no second worker can be running the same job. Past the deadline the handler gets
JobTimeout; a handler still running (lease - timeout) / 2 later is beyond help, and the process
exits with status 70 before its lease runs out (exit_on_hang). The lease then expires and the
reaper counts the attempt, exactly as for a crash.
"""
from __future__ import annotations

import collections
import ctypes
import json
import datetime as dt
import logging
import os
import select
import signal
import socket
import threading
import time
import traceback
from typing import Any, Callable, Deque, Iterator, List, Optional, Tuple

import psycopg

from . import pooling, sql
from .errors import (HandlerCrashed, JobCancelled, JobTimeout, StaleFence, as_stale, is_stale,
                     translate)

log = logging.getLogger("jobcap")

COLUMNS = "job_id, fence, attempt, max_attempts, payload, lease_expires_at"
CLAIM = f"SELECT {COLUMNS} FROM jobcap.claim_job(%s, %s, %s, %s)"
# Without an output these call the declarations 0.1.0 has too (six and two arguments).
COMPLETE_AND_CLAIM = f"SELECT {COLUMNS} FROM jobcap.complete_and_claim(%s, %s, %s, %s, %s, %s)"
COMPLETE_AND_CLAIM_OUTPUT = (f"SELECT {COLUMNS} FROM jobcap.complete_and_claim(%s, %s, %s, %s,"
                             " %s, %s, %s::jsonb)")
COMPLETE_JOBS = "SELECT jobcap.complete_jobs(%s::bigint[], %s::bigint[])"
COMPLETE_JOBS_OUTPUT = "SELECT jobcap.complete_jobs(%s::bigint[], %s::bigint[], %s::jsonb[])"
COMPLETE_OUTPUT = "SELECT jobcap.complete_job(%s, %s, %s::jsonb)"
COMPLETE = "SELECT jobcap.complete_job(%s, %s)"
MAX_BATCH = 10000  # complete_jobs takes at most this many jobs per call

HANG_EXIT_STATUS = 70

#: The channel on which the server tells the worker holding a job that its attempt ended while
#: it ran (cancel_job, max_run_time); payload {"job_id": n, "fence": f, "reason": r}.
CANCEL_CHANNEL = "jobcap_cancel"
#: Isolated: how long a pool process has to stop a cancelled handler before it is SIGKILLed.
CANCEL_GRACE = 1.0
# The signals that tell a pool process its running job ended on the server, by reason.
_CANCEL_SIGNALS = {"cancelled": signal.SIGUSR1, "timed_out": signal.SIGUSR2}
# Without LISTEN: which of the running jobs were cancelled (job_result polling).
POLL_CANCELLED = ("SELECT j.job_id, r.state::text FROM pg_catalog.unnest(%s::bigint[]) AS j(job_id)"
                  " CROSS JOIN LATERAL jobcap.job_result(j.job_id) AS r"
                  " WHERE r.state = 'cancelled'")

# Connections a forked process inherited from its supervisor: kept referenced and never closed
# in the child (closing one would end the supervisor's session on the shared socket); the child
# leaves with os._exit, which runs no finalizer.
_inherited: list = []

# A job finished without a statement in its transaction, waiting to be completed: the job and
# its output as JSON text (None for none).
Finished = Tuple["Job", Optional[str]]


class _ConnectionLost(Exception):
    """The work connection broke; the batch is abandoned to the reaper."""


class Job:
    """A claimed job, as the handler sees it.

    ``conn`` is the worker's connection with the job's transaction open: write through it and
    the writes commit together with complete_job, or not at all. Do not commit or roll back
    yourself. ``fence`` is the lease generation: hand it downstream as an idempotency key.
    Set ``output`` (anything JSON) to keep a result with the job (jobs.output, readable by the
    enqueuing side, at most jobcap.max_output_bytes).
    """

    def __init__(self, worker: "Worker", row: tuple, granted_at: float):
        self.id, self.fence, self.attempt, self.max_attempts, self.payload, \
            self.lease_expires_at = row
        self.conn: Optional[psycopg.Connection] = None
        self.output: Any = None
        self.lost = False
        #: Set when the job's attempt ended on the server while the handler ran (cancel_job, or
        #: max_run_time: ``cancel_reason`` says which); the handler gets JobCancelled as well.
        self.cancelled = threading.Event()
        self.cancel_reason: Optional[str] = None
        self._worker = worker
        self._granted_at = granted_at  # monotonic time at or before the server granted the lease

    @property
    def last_attempt(self) -> bool:
        """True when a failure now makes the job dead."""
        return self.attempt >= self.max_attempts

    def execute(self, query: Any, params: Any = None) -> psycopg.Cursor:
        """Runs a statement in the job's transaction."""
        assert self.conn is not None, "the job is not running"
        with translate(None, self.id, self.fence):
            return self.conn.execute(query, params)

    def assert_fence(self) -> None:
        """Raises StaleFence unless the lease is current, and holds the job row to commit.

        Call it in the job's transaction before writes that must not happen twice: the reaper
        skips the locked row, so writes committed with it committed under a current lease.
        """
        assert self.conn is not None, "the job is not running"
        sql.assert_fence(self.conn, self.id, self.fence)

    def heartbeat(self) -> dt.datetime:
        """Extends the lease by its length from now, and the handler's deadline with it.

        Runs on the side connection (outside the job's transaction), so the extension is
        visible to the reaper at once. Raises StaleFence when the lease is already gone.
        """
        return self._worker._heartbeat(self, running=True)

    def _message(self) -> dict:
        """The job as the supervisor hands it to a pool process."""
        expires = self.lease_expires_at
        return {"id": self.id, "fence": self.fence, "attempt": self.attempt,
                "max_attempts": self.max_attempts, "payload": self.payload,
                "lease_expires_at": None if expires is None else expires.isoformat(),
                "granted_at": self._granted_at}

    @classmethod
    def _from_message(cls, worker: "Worker", m: dict) -> "Job":
        expires = m["lease_expires_at"]
        row = (m["id"], m["fence"], m["attempt"], m["max_attempts"], m["payload"],
               None if expires is None else dt.datetime.fromisoformat(expires))
        return cls(worker, row, m["granted_at"])

    def __repr__(self) -> str:
        return f"<Job {self.id} fence {self.fence} attempt {self.attempt}/{self.max_attempts}>"


Handler = Callable[[Job], None]
Settled = Callable[[Job, str, Optional[BaseException]], None]


class Worker:
    """Runs ``handler(job)`` for the jobs of one queue until stop() or SIGTERM.

    Outcomes, reported to ``on_settled(job, outcome, error)`` when given: "succeeded", "retry"
    (failed, will be retried after backoff), "dead" (failed at its cap), "stale" (the lease
    was lost: the job's writes rolled back and the job is someone else's) and "released"
    (held, not started, given back on stop).
    """

    def __init__(self, conninfo: str, queue: str, handler: Handler, *,
                 name: Optional[str] = None, batch: Optional[int] = None,
                 lease: float = 60.0, timeout: Optional[float] = None, poll_min: float = 0.05,
                 poll_max: float = 5.0, on_settled: Optional[Settled] = None,
                 exit_on_hang: bool = True, isolate: bool = True, concurrency: int = 1,
                 prefetch: Optional[int] = None, settle_window: float = 0.05,
                 listen: Optional[bool] = None, cancel_poll: float = 1.0):
        if batch is not None and batch < 1:
            raise ValueError("batch must be at least 1")
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if not isolate and concurrency != 1:
            raise ValueError("concurrency above 1 needs isolate=True")
        if prefetch is None:
            # batch, from before prefetch existed: the jobs held at once.
            prefetch = 0 if batch is None else max(batch - concurrency, 0)
        if prefetch < 0:
            raise ValueError("prefetch must not be negative")
        if lease <= 0:
            raise ValueError("lease must be positive")
        if timeout is None:
            timeout = lease * 0.8
        if not 0 < timeout < lease:
            raise ValueError(f"timeout ({timeout}s) must be positive and shorter than the "
                             f"lease ({lease}s): the handler must stop while the lease is ours")
        if not 0 < poll_min <= poll_max:
            raise ValueError("poll_min must be positive and at most poll_max")
        if not 0 <= settle_window < lease / 3:
            raise ValueError("settle_window must be at least 0 and under a third of the lease")
        self.conninfo = conninfo
        self.queue = queue
        self.handler = handler
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
        self.isolate = isolate
        self.concurrency = concurrency
        self.prefetch = prefetch
        # In-process, one claim takes the whole batch; isolated, at most concurrency + prefetch
        # jobs are held at once.
        self.batch = batch if batch is not None else concurrency + prefetch
        self.lease = float(lease)
        self.timeout = float(timeout)
        self.grace = (self.lease - self.timeout) / 2
        # A job that waited longer than this to start is heartbeated first, so that at least
        # 95% of its timeout fits (a heartbeat per job would cost a commit per job).
        self._renew_after = min(self.lease / 3, self.timeout / 20)
        self.poll_min = poll_min
        self.poll_max = poll_max
        self.on_settled = on_settled
        self.exit_on_hang = exit_on_hang
        self.settle_window = settle_window
        # LISTEN for wake-ups: None, unless the connection goes through a pooler (pooling.py),
        # where a transaction pooler would drop the notifications: the loop polls then.
        self.listen = listen
        # Without LISTEN, how often the running jobs' states are read to find the cancelled.
        if cancel_poll <= 0:
            raise ValueError("cancel_poll must be positive")
        self.cancel_poll = cancel_poll
        self._listening = False                 # the claim connection LISTENs (isolated)
        self._cancel_notes: List[Tuple[int, int, str]] = []  # (job_id, fence, reason) to apply
        self._cancel_polled = 0.0               # monotonic time of the last poll without LISTEN
        self._cancel_poll_ok = True             # false once job_result is missing or refused
        # False once complete_jobs was refused (0A000: on a Citus cluster, which routes only
        # calls naming one job's shard): from then on each job is completed on its own, with no
        # refused try per batch first.
        self._batch_ok = True
        self._cancel_poll_due = False           # poll once now (a new LISTEN)
        self._side_listening: Optional[psycopg.Connection] = None  # in-process: side LISTENs
        self._cancel_reason: Optional[str] = None  # in-process: the running job was cancelled

        self._conn: Optional[psycopg.Connection] = None
        self._side: Optional[psycopg.Connection] = None
        self._side_lock = threading.Lock()
        self._lock = threading.Lock()           # guards the fields the supervisor reads
        self._waiting: Deque[Job] = collections.deque()
        self._finished: List[Finished] = []     # finished, to be completed in a batch
        self._finished_since = 0.0              # monotonic time the oldest of them finished
        self._current: Optional[Job] = None
        self._deadline = 0.0
        self._interrupted = False
        self._in_handler = False
        self._thread_id = 0
        self._use_alarm = False
        self._stopping = threading.Event()
        self._done = threading.Event()
        self._woken = False
        self._procs: dict = {}                  # isolated: pid -> _Proc, the pool
        self._spawn_at = 0.0                    # isolated: when a dead pool process is replaced
        self._spawn_backoff = 0.0
        self._in_child = False
        self._report_fd = -1
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        os.set_blocking(self._wake_r, False)

    # --- public -----------------------------------------------------------------------------

    def stop(self) -> None:
        """Asks the loop to stop: it finishes the jobs it holds, claims no more, and returns.

        Safe from a signal handler or another thread.
        """
        self._stopping.set()
        try:
            os.write(self._wake_w, b"s")
        except OSError:
            pass

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def run(self, handle_signals: bool = True) -> None:
        """The loop. In the main thread it also takes SIGTERM and SIGINT as stop()."""
        self._thread_id = threading.get_ident()
        self._use_alarm = threading.current_thread() is threading.main_thread()
        saved = {}
        if self._use_alarm:
            saved[signal.SIGALRM] = signal.signal(signal.SIGALRM, self._on_alarm)
            if handle_signals:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    saved[sig] = signal.signal(sig, self._on_stop_signal)
        self._done.clear()
        supervisor = threading.Thread(target=self._supervise, name="jobcap-supervisor",
                                      daemon=True)
        supervisor.start()
        try:
            if self.isolate:
                self._loop_isolated()
            else:
                self._loop()
        finally:
            self._done.set()
            supervisor.join()
            self._disconnect()
            if self._use_alarm:
                signal.setitimer(signal.ITIMER_REAL, 0)
            for sig, old in saved.items():
                signal.signal(sig, old)
            log.info("worker %s stopped", self.name)

    # --- the loop ---------------------------------------------------------------------------

    def _loop(self) -> None:
        poll = self.poll_min
        retry = 0.2
        while not self._stopping.is_set():
            try:
                if self._conn is None:
                    self._connect()
                jobs = self._settle(self.batch)
                retry = 0.2
            except psycopg.OperationalError as error:
                log.warning("worker %s: database unavailable (%s); retrying in %.1fs",
                            self.name, _first_line(error), retry)
                self._disconnect()
                self._sleep(retry)
                retry = min(retry * 2, 5.0)
                continue
            if jobs:
                poll = self.poll_min
                try:
                    self._work(jobs)
                except _ConnectionLost as lost:
                    log.warning("worker %s: connection lost during a batch (%s); its jobs "
                                "go back when their leases expire", self.name, lost)
                    self._disconnect()
                continue
            try:
                if not self._wait(poll):
                    poll = min(poll * 2, self.poll_max)
            except psycopg.OperationalError:
                self._disconnect()
        self._settle_at_stop()

    def _connect(self) -> None:
        app = f"jobcap worker {self.name}"[:63]
        # Through a pooler in statement pooling this raises PoolModeError: not retried.
        self._conn = pooling.connect(self.conninfo, transactions=True, autocommit=False,
                                     application_name=app)
        self._woken = False
        self._listening = bool(self.listen or (self.listen is None and not self._conn.pooled))
        if self._listening:
            self._conn.add_notify_handler(self._on_notify)
            self._conn.execute("LISTEN jobcap")
            if self.isolate:  # in-process, the side connection listens (_watch_cancels)
                self._conn.execute(f"LISTEN {CANCEL_CHANNEL}")
                self._cancel_poll_due = True
            self._conn.commit()
            if not self.isolate:
                # Listening before the first claim: a job claimed later cannot have been
                # cancelled before, so no notification for it can be missed.
                with self._side_lock:
                    try:
                        self._side_listen()
                    except psycopg.OperationalError:
                        pass  # again in _watch_cancels
            log.info("worker %s: connected, listening for queue %s", self.name, self.queue)
        else:
            log.info("worker %s: connected through a pooler, polling queue %s (every %gs to "
                     "%gs; listen=True to LISTEN under session pooling)", self.name, self.queue,
                     self.poll_min, self.poll_max)

    def _disconnect(self) -> None:
        conn, self._conn = self._conn, None
        with self._side_lock:
            side, self._side = self._side, None
        for c in (conn, side):
            if c is not None:
                try:
                    c.close()
                except Exception:
                    pass

    def _replace_connection(self, conn) -> None:
        """After a handler was interrupted (timeout, cancellation): cancels what `conn` may still
        run, drops the connections and with them the job's transaction, and connects afresh."""
        try:
            conn.cancel()
        except Exception:
            pass
        self._disconnect()
        try:
            if self._in_child:
                self._connect_job()
            else:
                self._connect()
        except psycopg.OperationalError as error:
            raise _ConnectionLost(error) from error

    def _claim(self, count: Optional[int] = None) -> list:
        sent = time.monotonic()
        rows = self._execute_alone(CLAIM, (self.queue, self.name, count or self.batch,
                                           sql.interval(self.lease)))
        return [Job(self, row, sent) for row in rows]

    def _wait(self, timeout: float) -> bool:
        """Sleeps until a wake-up for our queue, stop(), or the timeout. True when woken."""
        conn = self._conn
        assert conn is not None
        end = time.monotonic() + timeout
        while not self._stopping.is_set():
            if self._woken:
                self._woken = False
                return True
            left = end - time.monotonic()
            if left <= 0:
                return False
            ready, _, _ = select.select([conn.fileno(), self._wake_r], [], [], left)
            if self._wake_r in ready:
                self._drain_wake_pipe()
            if conn.fileno() in ready:
                for channel, payload in _notifications(conn):
                    if channel == "jobcap" and payload == self.queue:
                        self._woken = True
        return False

    def _on_notify(self, note: psycopg.Notify) -> None:
        if note.channel == "jobcap" and note.payload == self.queue:
            self._woken = True
        elif note.channel == CANCEL_CHANNEL:
            self._note_cancel(note.payload)

    def _note_cancel(self, payload: str) -> None:
        """Keeps a notification of an attempt ended on the server, to be applied by the thread
        that owns the running jobs."""
        try:
            message = json.loads(payload)
            note = (int(message["job_id"]), int(message["fence"]),
                    str(message.get("reason", "cancelled")))
        except (ValueError, KeyError, TypeError):
            log.warning("worker %s: unreadable %s payload %r", self.name, CANCEL_CHANNEL, payload)
            return
        with self._lock:
            self._cancel_notes.append(note)

    def _take_cancel_notes(self) -> List[Tuple[int, int, str]]:
        with self._lock:
            notes, self._cancel_notes = self._cancel_notes, []
        return notes

    def _poll_cancelled(self, conn: psycopg.Connection, jobs: List[Job]) -> None:
        """Without LISTEN (through a transaction pooler): reads the states of the running jobs
        every cancel_poll seconds and notes the cancelled ones; once, too, after a new LISTEN
        (a notification sent while the worker reconnected is lost). job_result is 0.3.0's: on
        a database still at 0.2.0 the worker learns a cancellation at its next fenced call."""
        now = time.monotonic()
        due = self._cancel_poll_due or now - self._cancel_polled >= self.cancel_poll
        if not jobs or not self._cancel_poll_ok or not due:
            return
        self._cancel_polled = now
        self._cancel_poll_due = False
        autocommit = conn.autocommit
        try:
            conn.autocommit = True
            rows = conn.execute(POLL_CANCELLED, ([job.id for job in jobs],)).fetchall()
        except (psycopg.errors.UndefinedFunction, psycopg.errors.FeatureNotSupported):
            # A database at 0.2.0, or a distributed install (Citus) where job_result is
            # refused: polling cannot work; the handler learns at its next fenced call.
            self._cancel_poll_ok = False
            return
        except psycopg.OperationalError:
            raise
        except psycopg.Error as error:
            log.info("worker %s: reading the running jobs' states failed (%s)", self.name,
                     _first_line(error))
            return
        finally:
            if not conn.closed and not conn.broken:
                try:
                    conn.autocommit = autocommit
                except psycopg.Error:
                    pass
        fences = {job.id: job.fence for job in jobs}
        with self._lock:
            self._cancel_notes.extend((job_id, fences[job_id], "cancelled")
                                      for job_id, _ in rows)

    def _drain_wake_pipe(self) -> None:
        try:
            while os.read(self._wake_r, 64):
                pass
        except OSError:
            pass

    def _sleep(self, seconds: float) -> None:
        if not self._stopping.is_set():
            select.select([self._wake_r], [], [], seconds)
            self._drain_wake_pipe()

    # --- settling in batches ----------------------------------------------------------------

    def _defer(self, job: Job, output: Optional[str]) -> None:
        """A job finished with nothing in its transaction: complete it with the next batch."""
        if self._in_child:
            self._report({"outcome": "done", "output": output})
            return
        with self._lock:
            if not self._finished:
                self._finished_since = time.monotonic()
            self._finished.append((job, output))

    def _settle(self, claim: int) -> list:
        """Completes the finished jobs waiting for it and claims up to `claim` more, in one
        statement (its own transaction: one round trip, one commit) on the work connection;
        returns the jobs claimed.

        A stale fence in the batch (complete_jobs is all or nothing) or any other error of the
        statement rolls it back, and each job is then settled on its own: a job's stale fence
        or error never costs the others. A lost connection puts the jobs back, to be completed
        after the reconnect, and raises.
        """
        with self._lock:
            done, self._finished = self._finished, []
        current = []
        for job, output in done:
            if job.lost:  # a heartbeat found its lease gone
                self._settled(job, "stale", job.lost if isinstance(job.lost, StaleFence) else None)
            else:
                current.append((job, output))
        if not current:
            return self._claim(claim) if claim else []
        sent = time.monotonic()
        lease = sql.interval(self.lease)
        rows: list = []
        for at in range(0, len(current), MAX_BATCH):
            part = current[at:at + MAX_BATCH]
            last = at + MAX_BATCH >= len(current)
            count = claim if last else 0
            outputs = [output for _, output in part]
            with_output = any(output is not None for output in outputs)
            if len(part) == 1 and count:
                (job, output), = part
                if output is None:
                    query, params = COMPLETE_AND_CLAIM, (job.id, job.fence, self.queue,
                                                         self.name, count, lease)
                else:
                    query, params = COMPLETE_AND_CLAIM_OUTPUT, (job.id, job.fence, self.queue,
                                                                self.name, count, lease, output)
            else:
                params = ([job.id for job, _ in part], [job.fence for job, _ in part])
                if with_output:
                    params += (outputs,)
                query = COMPLETE_JOBS_OUTPUT if with_output else COMPLETE_JOBS
                if count:
                    # The claim's batch depends on the completion's result, so the claim runs
                    # after it (once: a materialised CTE), in the same statement.
                    query = (f"WITH done(n) AS MATERIALIZED ({query}) SELECT c.* FROM done"
                             f" CROSS JOIN LATERAL jobcap.claim_job(%s, %s, %s + 0 * done.n, %s)"
                             f" AS c")
                    params += (self.queue, self.name, count, lease)
            batched = query not in (COMPLETE_AND_CLAIM, COMPLETE_AND_CLAIM_OUTPUT)
            alone = batched and not self._batch_ok
            if not alone:
                try:
                    result = self._execute_alone(query, params)
                except psycopg.OperationalError:
                    self._put_back(current[at:])
                    raise
                except psycopg.errors.FeatureNotSupported as error:
                    alone = True
                    if batched:
                        self._batch_ok = False
                        log.info("worker %s: complete_jobs is refused here (%s); completing "
                                 "each job on its own from now on", self.name,
                                 _first_line(error))
                except psycopg.Error as error:
                    alone = True
                    log.info("worker %s: completing %d jobs together failed (%s); completing "
                             "each on its own", self.name, len(part), _first_line(error))
            if alone:
                try:
                    self._complete_each(part)
                except psycopg.OperationalError:
                    self._put_back(current[at + MAX_BATCH:])  # _complete_each put back its own
                    raise
                if not last:
                    continue
                return self._claim(claim) if claim else []
            if count:
                rows = result
            for job, _ in part:
                self._settled(job, "succeeded", None)
        return [Job(self, row, sent) for row in rows]

    def _execute_alone(self, query: str, params: tuple) -> list:
        """Runs one statement in a transaction of its own (autocommit: no BEGIN and COMMIT round
        trips); returns its rows. The connection must be idle: it is, between jobs."""
        conn = self._conn
        assert conn is not None
        conn.autocommit = True
        try:
            cur = conn.execute(query, params)
            return cur.fetchall() if cur.description else []
        finally:
            if not conn.closed and not conn.broken:
                try:
                    conn.autocommit = False
                except psycopg.Error:
                    pass

    def _put_back(self, done: List[Finished]) -> None:
        with self._lock:
            if done and not self._finished:
                self._finished_since = time.monotonic()
            self._finished[:0] = done

    def _rollback_or_put_back(self, conn: psycopg.Connection, done: List[Finished],
                              error: BaseException) -> None:
        try:
            conn.rollback()
        except psycopg.Error as lost:
            self._put_back(done)
            raise psycopg.OperationalError(f"rollback failed: {lost}") from error

    def _complete_each(self, done: List[Finished]) -> None:
        """Completes each job in its own transaction: a stale fence is that job's outcome, an
        error fails that job as a failed completion in its own transaction would have."""
        conn = self._conn
        assert conn is not None
        for n, (job, output) in enumerate(done):
            try:
                with translate("complete_job", job.id, job.fence):
                    if output is None:
                        state = conn.execute(COMPLETE, (job.id, job.fence)).fetchone()[0]
                    else:
                        state = conn.execute(COMPLETE_OUTPUT,
                                             (job.id, job.fence, output)).fetchone()[0]
                conn.commit()
            except StaleFence as stale:
                self._rollback_or_put_back(conn, done[n + 1:], stale)
                log.info("worker %s: job %d fence %d is stale (%s)", self.name, job.id,
                         job.fence, stale)
                self._settled(job, "stale", stale)
                continue
            except psycopg.OperationalError:
                self._put_back(done[n:])
                raise
            except psycopg.Error as error:
                self._rollback_or_put_back(conn, done[n + 1:], error)
                try:
                    state = sql.fail(conn, job.id, job.fence, _error_text(error))
                    conn.commit()
                except StaleFence as stale:
                    self._rollback_or_put_back(conn, done[n + 1:], stale)
                    self._settled(job, "stale", stale)
                    continue
                except psycopg.OperationalError:
                    self._put_back(done[n + 1:])
                    raise
                self._settled(job, "retry" if state == "pending" else state, error)
                continue
            self._settled(job, state, None)

    def _settle_at_stop(self) -> None:
        """Completes what finished, once, as the loop ends; what cannot be completed now goes
        back when its lease expires."""
        with self._lock:
            left = len(self._finished)
        if not left:
            return
        try:
            if self._conn is None:
                self._connect()
            self._settle(0)
        except psycopg.Error as error:
            log.warning("worker %s: could not complete %d finished jobs (%s); they go back "
                        "when their leases expire", self.name, left, _first_line(error))
            with self._lock:
                self._finished = []

    # --- one batch --------------------------------------------------------------------------

    def _work(self, jobs: list) -> None:
        with self._lock:
            self._waiting.extend(jobs)
        try:
            while True:
                if self._stopping.is_set():
                    self._release_waiting()
                    return
                with self._lock:
                    if not self._waiting:
                        return
                    job = self._waiting.popleft()
                    done_since = self._finished_since if self._finished else None
                    last = not self._waiting and not self._finished
                if job.lost:
                    self._settle_lost(job)
                    continue
                if done_since is not None and time.monotonic() - done_since >= self.settle_window:
                    try:
                        self._settle(0)
                    except psycopg.OperationalError as error:
                        raise _ConnectionLost(error) from error
                if time.monotonic() - job._granted_at > self._renew_after:
                    # It waited behind the others: renew its lease so the full timeout fits.
                    try:
                        self._heartbeat(job, running=False)
                    except StaleFence as stale:
                        self._settled(job, "stale", stale)
                        continue
                    except psycopg.OperationalError:
                        pass  # the side connection; the job's deadline still holds
                claim = self.batch if last and not self._stopping.is_set() else 0
                more = self._run_one(job, claim)
                if more:
                    with self._lock:
                        self._waiting.extend(more)
        finally:
            with self._lock:
                self._waiting.clear()

    def _run_one(self, job: Job, claim: int = 0) -> list:
        """Runs one job in its transaction on the work connection and settles it (in-process,
        or in a pool process). claim > 0 (in-process, the batch's last job): a completion in the
        job's transaction claims that many more with it; returns them."""
        conn = self._conn
        assert conn is not None
        job.conn = conn
        try:
            self._start(job)
            try:
                self.handler(job)
            finally:
                self._finish_handler()
            if conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
                # Nothing to commit with the completion: it joins the next batch.
                self._defer(job, None if job.output is None else json.dumps(job.output))
                return []
            if claim and not self._stopping.is_set():
                sent = time.monotonic()
                with translate("complete_and_claim", job.id, job.fence):
                    if job.output is None:
                        rows = conn.execute(COMPLETE_AND_CLAIM, (
                            job.id, job.fence, self.queue, self.name, claim,
                            sql.interval(self.lease))).fetchall()
                    else:
                        rows = conn.execute(COMPLETE_AND_CLAIM_OUTPUT, (
                            job.id, job.fence, self.queue, self.name, claim,
                            sql.interval(self.lease), json.dumps(job.output))).fetchall()
                conn.commit()
                self._settled(job, "succeeded", None)
                return [Job(self, row, sent) for row in rows]
            state = sql.complete(conn, job.id, job.fence, job.output)
            conn.commit()
            self._settled(job, state, None)
        except JobTimeout as timeout:
            self._finish_handler()
            # The interrupted statement may still be in flight: cancel it and drop the
            # connection, and with it the job's transaction, rather than trust its state.
            self._replace_connection(conn)
            self._fail(job, f"JobTimeout: handler ran past its {self.timeout:g}s timeout",
                       timeout)
        except JobCancelled as cancelled:
            self._finish_handler()
            # The attempt already ended on the server (its fence is stale): drop the connection
            # and the job's transaction with it, neither completing nor failing the job.
            self._replace_connection(conn)
            if job.cancel_reason is not None:
                cancelled.reason = job.cancel_reason
            log.info("worker %s: job %d fence %d ended on the server while its handler ran "
                     "(%s); the handler was stopped", self.name, job.id, job.fence,
                     cancelled.reason)
            self._settled(job, "cancelled", cancelled)
        except Exception as error:
            if self._conn is None or conn.broken or conn.closed:
                raise _ConnectionLost(error) from error
            self._rollback(conn)
            if is_stale(error):
                stale = error if isinstance(error, StaleFence) else \
                    as_stale(error, None, job.id, job.fence)
                log.info("worker %s: job %d fence %d is stale (%s); its writes rolled back",
                         self.name, job.id, job.fence, stale)
                self._settled(job, "stale", stale)
            else:
                self._fail(job, _error_text(error), error)
        except BaseException:
            # KeyboardInterrupt, SystemExit: leave the job to its lease.
            self._finish_handler()
            self._rollback(conn)
            raise
        finally:
            job.conn = None
        return []

    def _settle_lost(self, job: Job) -> None:
        """A held job whose lease a heartbeat found gone, or that was cancelled before it
        started."""
        if isinstance(job.lost, JobCancelled):
            self._settled(job, "cancelled", job.lost)
        else:
            self._settled(job, "stale", job.lost if isinstance(job.lost, StaleFence) else None)

    def _fail(self, job: Job, text: str, error: BaseException) -> None:
        conn = self._conn
        assert conn is not None
        try:
            state = sql.fail(conn, job.id, job.fence, text)
            conn.commit()
            self._settled(job, "retry" if state == "pending" else state, error)
        except StaleFence as stale:
            self._rollback(conn)
            self._settled(job, "stale", stale)
        except psycopg.OperationalError as lost:
            raise _ConnectionLost(lost) from lost

    def _rollback(self, conn: psycopg.Connection) -> None:
        try:
            conn.rollback()
        except psycopg.Error as error:
            raise _ConnectionLost(error) from error

    def _settled(self, job: Job, outcome: str, error: Optional[BaseException]) -> None:
        if self._in_child:
            self._report({"outcome": outcome, "error": None if error is None else _error_text(error),
                          "type": None if error is None else type(error).__name__,
                          "operation": getattr(error, "operation", None),
                          "reason": getattr(error, "reason", None)})
            return
        if outcome == "succeeded":
            log.debug("worker %s: job %d succeeded", self.name, job.id)
        elif outcome not in ("stale", "released", "cancelled"):
            log.info("worker %s: job %d attempt %d/%d failed (%s): %s", self.name, job.id,
                     job.attempt, job.max_attempts, outcome,
                     _first_line(error))
        if self.on_settled is not None:
            try:
                self.on_settled(job, outcome, error)
            except Exception:
                log.exception("worker %s: on_settled raised", self.name)

    # --- deadlines and leases ---------------------------------------------------------------

    def _start(self, job: Job) -> None:
        with self._lock:
            self._current = job
            self._interrupted = False
            self._cancel_reason = None
            self._in_handler = True
            self._deadline = job._granted_at + self.timeout
        self._arm()

    def _finish_handler(self) -> None:
        with self._lock:
            self._in_handler = False
            self._current = None
        if self._use_alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)

    def _arm(self) -> None:
        if self._use_alarm and self._in_handler:
            signal.setitimer(signal.ITIMER_REAL, max(self._deadline - time.monotonic(), 0.001))

    def _on_alarm(self, signum: int, frame: Any) -> None:
        if self._in_handler and self._cancel_reason is not None and not self._interrupted:
            self._interrupted = True
            raise JobCancelled(reason=self._cancel_reason)
        if self._in_handler and not self._interrupted:
            if time.monotonic() < self._deadline:
                self._arm()  # a heartbeat moved the deadline
                return
            self._interrupted = True
            raise JobTimeout(f"job ran past its {self.timeout:g}s timeout")

    def _on_stop_signal(self, signum: int, frame: Any) -> None:
        log.info("worker %s: %s, finishing the jobs it holds", self.name,
                 signal.Signals(signum).name)
        self.stop()
        # A second signal stops at once (the held jobs go back when their leases expire).
        signal.signal(signum, signal.SIG_DFL)

    def _heartbeat(self, job: Job, running: bool) -> dt.datetime:
        with self._side_lock:
            for again in (True, False):
                fresh = self._side is None or self._side.closed
                try:
                    if fresh:
                        self._side = pooling.connect(
                            self.conninfo, autocommit=True,
                            application_name=f"jobcap side {self.name}"[:63])
                    sent = time.monotonic()
                    expires = sql.heartbeat(self._side, job.id, job.fence)
                    break
                except StaleFence:
                    raise
                except BaseException as error:
                    # Lost, or interrupted mid-statement (JobTimeout): do not trust it again.
                    if self._side is not None:
                        self._side.close()
                    self._side = None
                    # A connection kept since an earlier heartbeat may have died meanwhile (a
                    # server restart): one more try on a new one (a heartbeat may repeat).
                    if not (again and not fresh and isinstance(error, psycopg.OperationalError)):
                        raise
        job.lease_expires_at = expires
        job._granted_at = sent
        if self._in_child:
            self._report({"heartbeat": sent})
        if running:
            with self._lock:
                if self._current is job:
                    self._deadline = sent + self.timeout
            self._arm()
        return expires

    def _on_cancel_signal(self, signum: int, frame: Any) -> None:
        """A pool process: the supervisor says the running job ended on the server."""
        reason = "timed_out" if signum == _CANCEL_SIGNALS["timed_out"] else "cancelled"
        job = self._current
        if job is not None:
            job.cancel_reason = reason
            job.cancelled.set()
        if self._in_handler and not self._interrupted:
            self._interrupted = True
            raise JobCancelled(reason=reason)

    def _cancel_current(self, job_id: int, fence: int, reason: str) -> None:
        """In-process: stops the running handler if it runs that attempt, and drops a held job
        that was cancelled before it started."""
        with self._lock:
            current = self._current
            if current is not None and (current.id, current.fence) == (job_id, fence):
                current.cancel_reason = reason
                current.cancelled.set()
                if self._in_handler and not self._interrupted:
                    self._cancel_reason = reason
                    if not self._use_alarm:
                        self._interrupted = True
                        ctypes.pythonapi.PyThreadState_SetAsyncExc(
                            ctypes.c_ulong(self._thread_id), ctypes.py_object(JobCancelled))
            for job in self._waiting:
                if (job.id, job.fence) == (job_id, fence) and not job.lost:
                    job.lost = JobCancelled(reason=reason)
        if self._use_alarm and self._cancel_reason is not None:
            signal.setitimer(signal.ITIMER_REAL, 0.001)  # _on_alarm raises it in the handler

    def _side_listen(self) -> Tuple[psycopg.Connection, bool]:
        """In-process, with _side_lock held: the side connection, LISTENing on jobcap_cancel
        unless it goes through a pooler; returns it and whether it listens."""
        if self._side is None or self._side.closed:
            self._side = pooling.connect(self.conninfo, autocommit=True,
                                         application_name=f"jobcap side {self.name}"[:63])
        side = self._side
        listen = bool(self.listen or (self.listen is None and not side.pooled))
        if listen and self._side_listening is not side:
            side.add_notify_handler(self._on_notify)
            side.execute(f"LISTEN {CANCEL_CHANNEL}")
            self._side_listening = side
            self._cancel_poll_due = True
        return side, listen

    def _watch_cancels(self) -> None:
        """In-process, from the supervisor thread: the side connection LISTENs on jobcap_cancel
        (the work connection sits in the job's transaction, where no notification arrives)
        or, through a transaction pooler, polls the running job's state."""
        with self._lock:
            current = self._current
        if current is None and not self._cancel_notes:
            return
        with self._side_lock:
            try:
                side, listen = self._side_listen()
                if listen:
                    ready, _, _ = select.select([side.fileno()], [], [], 0)
                    if ready:
                        for channel, payload in _notifications(side):
                            if channel == CANCEL_CHANNEL:
                                self._note_cancel(payload)
                if current is not None and (not listen or self._cancel_poll_due):
                    self._poll_cancelled(side, [current])
            except psycopg.Error as error:
                log.warning("worker %s: watching for cancellations failed (%s)", self.name,
                            _first_line(error))
                if self._side is not None:
                    self._side.close()
                self._side = None
        for job_id, fence, reason in self._take_cancel_notes():
            self._cancel_current(job_id, fence, reason)

    def _supervise(self) -> None:
        tick = min(0.25, self.grace / 2)
        last = time.monotonic()
        resumed = last
        while not self._done.wait(tick):
            now = time.monotonic()
            if now - last > tick * 4 + 1:
                resumed = now  # the process was frozen (SIGSTOP, a VM pause): grant the grace anew
            last = now
            if not self.isolate:
                self._watch_cancels()
            with self._lock:
                current, deadline = self._current, self._deadline
                interrupted = self._interrupted
                waiting = list(self._waiting) + [job for job, _ in self._finished]
            if current is not None and now >= deadline:
                if not self._use_alarm and not interrupted:
                    with self._lock:  # still in that handler: _finish_handler takes this lock
                        if self._in_handler and self._current is current:
                            self._interrupted = True
                            ctypes.pythonapi.PyThreadState_SetAsyncExc(
                                ctypes.c_ulong(self._thread_id), ctypes.py_object(JobTimeout))
                if self.exit_on_hang and now >= max(deadline, resumed) + self.grace:
                    log.critical("worker %s: job %d ignored its timeout; exiting before its "
                                 "lease runs out", self.name, current.id)
                    logging.shutdown()
                    os._exit(HANG_EXIT_STATUS)
            for job in waiting:
                if job.lost or now - job._granted_at < self.lease / 3:
                    continue
                try:
                    self._heartbeat(job, running=False)
                except StaleFence as stale:
                    job.lost = stale
                except psycopg.Error as error:
                    log.warning("worker %s: heartbeat of job %d failed: %s", self.name, job.id,
                                error)

    # --- isolated: a supervisor and a pool of processes ----------------------------------------

    def _loop_isolated(self) -> None:
        poll = self.poll_min
        retry = 0.2
        claim_at = 0.0  # monotonic time of the next claim while there is room
        db_at = 0.0     # after a failed attempt: the next time the database is tried
        self._spawn_backoff = 0.0
        try:
            self._fill_pool()
            while True:
                now = time.monotonic()
                if self._stopping.is_set():
                    self._release_waiting()
                    if not self._busy():
                        self._settle_at_stop()
                        return
                    if self._finished and now >= db_at:
                        try:
                            if self._conn is None:
                                self._connect()
                            self._settle(0)
                        except psycopg.OperationalError as error:
                            self._database_unavailable(error, retry)
                            db_at = now + retry
                            retry = min(retry * 2, 5.0)
                else:
                    self._dispatch()  # idle processes get work before the round trip below
                    room = (self.concurrency + self.prefetch - len(self._waiting)
                            - self._running())
                    claim = room if room > 0 and now >= claim_at else 0
                    if (claim or self._finished) and now >= db_at:
                        try:
                            if self._conn is None:
                                self._connect()
                            jobs = self._settle(claim)
                            retry = 0.2
                        except psycopg.OperationalError as error:
                            self._database_unavailable(error, retry)
                            jobs = []
                            db_at = now + retry
                            retry = min(retry * 2, 5.0)
                        else:
                            if jobs:
                                poll = self.poll_min
                                claim_at = 0.0
                            elif claim:
                                claim_at = now + poll
                                poll = min(poll * 2, self.poll_max)
                        with self._lock:
                            self._waiting.extend(jobs)
                    self._dispatch()
                    self._fill_pool()
                next_at = max(claim_at, db_at) if not self._finished else db_at
                if self._pump(next_at):
                    claim_at, poll = 0.0, self.poll_min  # a job was enqueued, or one finished
        finally:
            self._empty_pool()

    def _database_unavailable(self, error: BaseException, retry: float) -> None:
        log.warning("worker %s: database unavailable (%s); retrying in %.1fs", self.name,
                    _first_line(error), retry)
        self._disconnect()

    def _running(self) -> int:
        return sum(1 for proc in self._procs.values() if proc.job is not None)

    def _busy(self) -> bool:
        return any(proc.job is not None for proc in self._procs.values())

    def _fill_pool(self) -> None:
        """Forks pool processes up to concurrency (at start, and to replace the dead)."""
        if self._stopping.is_set() or time.monotonic() < self._spawn_at:
            return
        while len(self._procs) < self.concurrency:
            self._fork()

    def _fork(self) -> None:
        cmd_r, cmd_w = os.pipe()
        report_r, report_w = os.pipe()
        logging_flush()
        pid = os.fork()
        if pid == 0:  # the pool process: never returns
            status = 1
            try:
                os.close(cmd_w)
                os.close(report_r)
                status = self._pool_main(cmd_r, report_w)
            except BaseException:
                pass
            finally:
                os._exit(status)
        os.close(cmd_r)
        os.close(report_w)
        os.set_blocking(report_r, False)
        self._procs[pid] = _Proc(pid, cmd_w, report_r)

    def _dispatch(self) -> None:
        """Hands waiting jobs to idle pool processes."""
        for proc in list(self._procs.values()):
            if proc.job is not None or proc.dead:
                continue
            job = self._next_job()
            if job is None:
                return
            data = (json.dumps(job._message()) + "\n").encode()
            proc.job = job
            proc.deadline = job._granted_at + self.timeout
            proc.killed = False
            proc.cancelled = None
            try:
                while data:
                    data = data[os.write(proc.cmd_fd, data):]
            except OSError:
                # The process is gone (its exit is handled by _pump): the job never reached it.
                proc.job = None
                proc.dead = True
                with self._lock:
                    self._waiting.appendleft(job)

    def _next_job(self) -> Optional[Job]:
        """The next waiting job that may start, its lease renewed if it waited long."""
        while not self._stopping.is_set():
            with self._lock:
                if not self._waiting:
                    return None
                job = self._waiting.popleft()
            if job.lost:
                self._settle_lost(job)
                continue
            if time.monotonic() - job._granted_at > self._renew_after:
                # It waited behind others: renew its lease so the full timeout fits.
                try:
                    self._heartbeat(job, running=False)
                except StaleFence as stale:
                    self._settled(job, "stale", stale)
                    continue
                except psycopg.OperationalError:
                    pass  # the side connection; the job's deadline still holds
            return job
        return None

    def _pool_main(self, cmd_fd: int, report_fd: int) -> int:
        """A pool process: runs the jobs the supervisor sends, one at a time, each in its
        transaction on this process's connection, and reports each outcome."""
        _die_with_parent()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)  # the supervisor decides when to stop
        signal.signal(signal.SIGALRM, self._on_alarm)
        for sig in _CANCEL_SIGNALS.values():
            signal.signal(sig, self._on_cancel_signal)
        # The supervisor's pipes to the other pool processes: a copy held here would keep a
        # process the supervisor let go from seeing the end of its command pipe.
        for proc in self._procs.values():
            for fd in (proc.cmd_fd, proc.report_fd):
                try:
                    os.close(fd)
                except OSError:
                    pass
        _inherited.extend(c for c in (self._conn, self._side) if c is not None)
        self._conn = self._side = None
        self._lock = threading.Lock()  # another thread of the parent may have held these
        self._side_lock = threading.Lock()
        self._waiting = collections.deque()
        self._finished = []
        self._procs = {}
        self._in_child = True
        self._use_alarm = True
        self._report_fd = report_fd
        self.exit_on_hang = False  # the supervisor ends a process that ignores its timeout
        try:
            self._connect_job()
        except psycopg.OperationalError:
            pass  # tried again when a job comes
        buffer = b""
        while True:
            while b"\n" not in buffer:
                chunk = os.read(cmd_fd, 65536)
                if not chunk:
                    return 0  # the supervisor let this process go
                buffer += chunk
            line, buffer = buffer.split(b"\n", 1)
            job = Job._from_message(self, json.loads(line))
            try:
                self._ready_connection()
            except psycopg.OperationalError as error:
                self._report({"outcome": "unstarted", "error": _first_line(error)})
                continue
            try:
                self._run_one(job)
            except (_ConnectionLost, psycopg.OperationalError) as lost:
                self._report({"outcome": "lost", "error": str(lost)})
                self._close_job_connection()
            except BaseException:
                return 1  # SystemExit or the like: the supervisor records the exit as a crash

    def _connect_job(self) -> None:
        app = f"jobcap job {self.name}"[:63]
        self._conn = pooling.connect(self.conninfo, autocommit=False, application_name=app)

    def _close_job_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:
                pass

    def _ready_connection(self) -> None:
        """Makes sure the pool process's connection is usable before a handler gets it."""
        conn = self._conn
        if conn is not None and not conn.closed and not conn.broken:
            # An idle connection has nothing to read unless the server ended it (a restart, a
            # terminated backend) or sent a notice: find out now rather than in the handler.
            ready, _, _ = select.select([conn.fileno()], [], [], 0)
            if not ready:
                return
            try:
                conn.execute("SELECT 1")
                conn.rollback()
                return
            except psycopg.Error:
                pass
        self._close_job_connection()
        self._connect_job()

    def _report(self, message: dict) -> None:
        data = (json.dumps(message) + "\n").encode()
        while data:
            data = data[os.write(self._report_fd, data):]

    def _pump(self, next_at: float) -> bool:
        """Waits for a pool process's report or exit, a wake-up, stop(), or next_at (the next
        claim or retry); handles what came. True when it is time to claim again at once."""
        conn = self._conn
        fds = [self._wake_r] + [proc.report_fd for proc in self._procs.values()]
        if conn is not None and not self._stopping.is_set():
            fds.append(conn.fileno())
        now = time.monotonic()
        if self._finished:
            wait = max(next_at - now, 0)
        elif self._waiting and not self._stopping.is_set() and any(
                proc.job is None and not proc.dead for proc in self._procs.values()):
            wait = 0.0
        else:
            wait = 0.25
            if next_at and not self._stopping.is_set():
                wait = min(wait, max(next_at - now, 0))
        if len(self._procs) < self.concurrency and not self._stopping.is_set():
            wait = min(wait, max(self._spawn_at - now, 0))
        for proc in self._procs.values():
            if proc.job is not None and not proc.killed:
                wait = min(wait, max(proc.deadline + self.grace - now, 0.001))
                if proc.cancelled:
                    wait = min(wait, max(proc.cancel_at - now, 0.001))
        if self._cancel_notes:
            wait = 0.0
        elif conn is not None and not self._listening and self._busy():
            wait = min(wait, max(self._cancel_polled + self.cancel_poll - now, 0.001))
        ready, _, _ = select.select(fds, [], [], max(wait, 0))
        woken = False
        if self._wake_r in ready:
            self._drain_wake_pipe()
        if conn is not None and conn.fileno() in ready:
            try:
                for channel, payload in _notifications(conn):
                    if channel == "jobcap" and payload == self.queue:
                        woken = True
                    elif channel == CANCEL_CHANNEL:
                        self._note_cancel(payload)
            except psycopg.Error:
                self._disconnect()
        if conn is not None and self._conn is conn and (not self._listening
                                                        or self._cancel_poll_due):
            try:
                self._poll_cancelled(conn, [proc.job for proc in self._procs.values()
                                            if proc.job is not None and not proc.cancelled])
            except psycopg.Error:
                self._disconnect()
        self._apply_cancels()
        for pid, proc in list(self._procs.items()):
            if proc.report_fd in ready:
                ended = self._read_reports(proc)
                if ended:
                    self._reap(pid, proc)
                woken = True
        now = time.monotonic()
        for pid, proc in self._procs.items():
            if proc.job is not None and not proc.killed and proc.cancelled and now >= proc.cancel_at:
                log.warning("worker %s: job %d was cancelled and its handler did not stop within "
                            "%gs; killing its process", self.name, proc.job.id, CANCEL_GRACE)
                proc.killed = True
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if proc.job is not None and not proc.killed and now >= proc.deadline + self.grace:
                log.critical("worker %s: job %d ignored its timeout; killing its process before "
                             "its lease runs out", self.name, proc.job.id)
                proc.killed = True
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        return woken

    def _apply_cancels(self) -> None:
        """Isolated: signals the pool process running each attempt that ended on the server,
        and drops the held jobs that were cancelled before they started."""
        notes = self._take_cancel_notes()
        if not notes:
            return
        now = time.monotonic()
        for job_id, fence, reason in notes:
            for pid, proc in self._procs.items():
                job = proc.job
                if job is None or proc.cancelled or (job.id, job.fence) != (job_id, fence):
                    continue
                proc.cancelled = reason
                proc.cancel_at = now + CANCEL_GRACE
                try:
                    os.kill(pid, _CANCEL_SIGNALS.get(reason, signal.SIGUSR1))
                except ProcessLookupError:
                    pass
            with self._lock:
                for job in self._waiting:
                    if (job.id, job.fence) == (job_id, fence) and not job.lost:
                        job.lost = JobCancelled(reason=reason)

    def _read_reports(self, proc: "_Proc") -> bool:
        """Handles what a pool process wrote; True at end of file (the process is gone)."""
        ended = False
        while True:
            try:
                chunk = os.read(proc.report_fd, 65536)
            except BlockingIOError:
                break
            if not chunk:
                ended = True
                break
            proc.buffer += chunk
        while b"\n" in proc.buffer:
            line, proc.buffer = proc.buffer.split(b"\n", 1)
            message = json.loads(line)
            job = proc.job
            if job is None:
                continue
            if "heartbeat" in message:
                proc.deadline = message["heartbeat"] + self.timeout
                job._granted_at = message["heartbeat"]
                continue
            proc.job = None
            outcome = message["outcome"]
            if outcome == "done":
                with self._lock:
                    if not self._finished:
                        self._finished_since = time.monotonic()
                    self._finished.append((job, message["output"]))
            elif outcome == "lost":
                log.warning("worker %s: job %d lost its connection (%s); it goes back when its "
                            "lease expires", self.name, job.id, message.get("error"))
            elif outcome == "unstarted":
                log.warning("worker %s: job %d could not start (%s); giving it back", self.name,
                            job.id, message.get("error"))
                self._release(job)
            else:
                self._settled(job, outcome, _child_error(job, message))
        return ended

    def _reap(self, pid: int, proc: "_Proc") -> None:
        """A pool process ended: its job, if it had one, is recorded as a crash."""
        del self._procs[pid]
        os.close(proc.report_fd)
        try:
            os.close(proc.cmd_fd)
        except OSError:
            pass
        _, status = os.waitpid(pid, 0)
        job = proc.job
        now = time.monotonic()
        if job is None and now - proc.started < 1.0:
            # Died idle, at once: something kills the pool's processes; do not fork in a loop.
            self._spawn_backoff = min(max(self._spawn_backoff * 2, 0.1), 5.0)
            self._spawn_at = now + self._spawn_backoff
        elif job is not None:
            self._spawn_backoff = 0.0
        if job is None:
            how = (f"signal {_signal_name(os.WTERMSIG(status))}" if os.WIFSIGNALED(status)
                   else f"status {os.WEXITSTATUS(status)}")
            log.warning("worker %s: pool process %d ended between jobs (%s); replacing it",
                        self.name, pid, how)
            return
        if proc.cancelled:
            # Killed for not stopping, or ended on its own: the attempt already ended on the
            # server, so there is no crash to record.
            self._settled(job, "cancelled", JobCancelled(
                f"the job's attempt ended on the server ({proc.cancelled}) and its process "
                f"ended ({_exit_text(status)})", reason=proc.cancelled))
            return
        text = _exit_text(status)
        if os.WIFSIGNALED(status) and proc.killed:
            text += f": the handler ignored its {self.timeout:g}s timeout"
        self._crash(job, text)

    def _empty_pool(self) -> None:
        """Lets every pool process go (end of its command pipe) and waits for each."""
        for proc in self._procs.values():
            try:
                os.close(proc.cmd_fd)
            except OSError:
                pass
        end = time.monotonic() + 5.0
        for pid, proc in list(self._procs.items()):
            while True:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    break
                if time.monotonic() > end:
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                    break
                time.sleep(0.01)
            try:
                os.close(proc.report_fd)
            except OSError:
                pass
        self._procs = {}

    def _crash(self, job: Job, text: str) -> None:
        error = HandlerCrashed(text)
        try:
            if self._conn is None:
                self._connect()
            with translate("crash_job", job.id, job.fence):
                state = self._conn.execute("SELECT jobcap.crash_job(%s, %s, %s)",
                                           (job.id, job.fence, text)).fetchone()[0]
            self._conn.commit()
        except StaleFence as stale:
            self._rollback_quietly()
            self._settled(job, "stale", stale)
            return
        except psycopg.Error as lost:
            log.warning("worker %s: could not record the crash of job %d (%s); it goes back "
                        "when its lease expires", self.name, job.id, _first_line(lost))
            self._disconnect()
            return
        self._settled(job, "retry" if state == "pending" else state, error)

    def _release_waiting(self) -> None:
        """Gives back the jobs held but not started: pending again, their attempts not counted."""
        with self._lock:
            jobs = list(self._waiting)
            self._waiting.clear()
        for job in jobs:
            if not job.lost:
                self._release(job)

    def _release(self, job: Job) -> None:
        try:
            if self._conn is None:
                self._connect()
            with translate("release_job", job.id, job.fence):
                self._conn.execute("SELECT jobcap.release_job(%s, %s)", (job.id, job.fence))
            self._conn.commit()
            self._settled(job, "released", None)
        except StaleFence as stale:
            self._rollback_quietly()
            self._settled(job, "stale", stale)
        except psycopg.Error as error:
            log.warning("worker %s: could not release job %d (%s); it goes back when its "
                        "lease expires", self.name, job.id, _first_line(error))
            self._disconnect()

    def _rollback_quietly(self) -> None:
        try:
            if self._conn is not None:
                self._conn.rollback()
        except psycopg.Error:
            self._disconnect()


class _Proc:
    """A pool process, as the supervisor sees it."""

    def __init__(self, pid: int, cmd_fd: int, report_fd: int):
        self.pid = pid
        self.cmd_fd = cmd_fd
        self.report_fd = report_fd
        self.started = time.monotonic()
        self.buffer = b""
        self.job: Optional[Job] = None  # the job it runs
        self.deadline = 0.0
        self.killed = False
        self.dead = False
        self.cancelled: Optional[str] = None  # the reason its running job ended on the server
        self.cancel_at = 0.0                  # monotonic time it is killed if still running


def _exit_text(status: int) -> str:
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        return f"killed by signal {number} ({_signal_name(number)})"
    return f"exited with status {os.WEXITSTATUS(status)} without settling the job"


def _child_error(job: Job, message: dict) -> Optional[BaseException]:
    text = message.get("error")
    if text is None:
        return None
    if message["outcome"] == "stale":
        return StaleFence(text.splitlines()[0].removeprefix("StaleFence: "), job_id=job.id, fence=job.fence,
                          operation=message.get("operation"))
    if message.get("type") == "JobTimeout":
        return JobTimeout(text)
    if message["outcome"] == "cancelled":
        return JobCancelled(text.splitlines()[0].removeprefix("JobCancelled: "),
                            reason=message.get("reason") or "cancelled")
    return HandlerError(text, message.get("type"))


class HandlerError(Exception):
    """An exception a handler raised in its child process, as text (its type's name kept)."""

    def __init__(self, text: str, type_name: Optional[str] = None):
        super().__init__(text)
        self.type_name = type_name


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return "unknown"


def logging_flush() -> None:
    for handler in logging.getLogger().handlers + log.handlers:
        try:
            handler.flush()
        except Exception:
            pass


_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """Linux: the child gets SIGKILL when its supervisor dies, leaving no orphan handler."""
    try:
        # The process's own symbols include libc's (find_library would run ldconfig per fork).
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _notifications(conn: psycopg.Connection) -> Iterator[Tuple[str, str]]:
    """The notifications that arrived on conn's socket (select() said it is readable), as
    (channel, payload); raises OperationalError when the server closed the connection."""
    conn.pgconn.consume_input()
    if conn.pgconn.status != psycopg.pq.ConnStatus.OK:
        raise psycopg.OperationalError("the server closed the connection")
    while True:
        note = conn.pgconn.notifies()
        if note is None:
            return
        yield note.relname.decode(), note.extra.decode()


def _first_line(error: Optional[BaseException]) -> str:
    if error is None:
        return ""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__


def _error_text(error: BaseException) -> str:
    """The text kept in the job's history: the exception first, then where it came from."""
    head = f"{type(error).__name__}: {error}"
    trace = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    return f"{head}\n{trace}"
