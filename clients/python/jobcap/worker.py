"""The worker loop: claim a batch, run each job under a deadline, settle it, repeat.

One Worker is one connection doing the work (claims, and each job's transaction) plus one side
connection for heartbeats. Jobs of a batch run one after another in the thread that called
run(); a supervisor thread keeps the leases of the jobs still waiting in the batch alive and
ends a handler that will not stop.

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
import datetime as dt
import logging
import os
import select
import signal
import socket
import threading
import time
import traceback
from typing import Any, Callable, Deque, Optional

import psycopg

from . import sql
from .errors import JobTimeout, StaleFence, as_stale, is_stale, translate

log = logging.getLogger("jobcap")

CLAIM = ("SELECT job_id, fence, attempt, max_attempts, payload, lease_expires_at"
         " FROM jobcap.claim_job(%s, %s, %s, %s)")

HANG_EXIT_STATUS = 70


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

    def __repr__(self) -> str:
        return f"<Job {self.id} fence {self.fence} attempt {self.attempt}/{self.max_attempts}>"


Handler = Callable[[Job], None]
Settled = Callable[[Job, str, Optional[BaseException]], None]


class Worker:
    """Runs ``handler(job)`` for the jobs of one queue until stop() or SIGTERM.

    Outcomes, reported to ``on_settled(job, outcome, error)`` when given: "succeeded", "retry"
    (failed, will be retried after backoff), "dead" (failed at its cap) and "stale" (the lease
    was lost: the job's writes rolled back and the job is someone else's).
    """

    def __init__(self, conninfo: str, queue: str, handler: Handler, *,
                 name: Optional[str] = None, batch: int = 1, lease: float = 60.0,
                 timeout: Optional[float] = None, poll_min: float = 0.05,
                 poll_max: float = 5.0, on_settled: Optional[Settled] = None,
                 exit_on_hang: bool = True):
        if batch < 1:
            raise ValueError("batch must be at least 1")
        if lease <= 0:
            raise ValueError("lease must be positive")
        if timeout is None:
            timeout = lease * 0.8
        if not 0 < timeout < lease:
            raise ValueError(f"timeout ({timeout}s) must be positive and shorter than the "
                             f"lease ({lease}s): the handler must stop while the lease is ours")
        if not 0 < poll_min <= poll_max:
            raise ValueError("poll_min must be positive and at most poll_max")
        self.conninfo = conninfo
        self.queue = queue
        self.handler = handler
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
        self.batch = batch
        self.lease = float(lease)
        self.timeout = float(timeout)
        self.grace = (self.lease - self.timeout) / 2
        self.poll_min = poll_min
        self.poll_max = poll_max
        self.on_settled = on_settled
        self.exit_on_hang = exit_on_hang

        self._conn: Optional[psycopg.Connection] = None
        self._side: Optional[psycopg.Connection] = None
        self._side_lock = threading.Lock()
        self._lock = threading.Lock()           # guards the fields the supervisor reads
        self._waiting: Deque[Job] = collections.deque()
        self._current: Optional[Job] = None
        self._deadline = 0.0
        self._interrupted = False
        self._in_handler = False
        self._thread_id = 0
        self._use_alarm = False
        self._stopping = threading.Event()
        self._done = threading.Event()
        self._woken = False
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
                jobs = self._claim()
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

    def _connect(self) -> None:
        app = f"jobcap worker {self.name}"[:63]
        self._conn = psycopg.connect(self.conninfo, autocommit=False, application_name=app)
        self._conn.add_notify_handler(self._on_notify)
        self._conn.execute("LISTEN jobcap")
        self._conn.commit()
        self._woken = False
        log.info("worker %s: connected, listening for queue %s", self.name, self.queue)

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

    def _claim(self) -> list:
        assert self._conn is not None
        sent = time.monotonic()
        rows = self._conn.execute(CLAIM, (self.queue, self.name, self.batch,
                                          sql.interval(self.lease))).fetchall()
        self._conn.commit()
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
                conn.pgconn.consume_input()
                if conn.pgconn.status != psycopg.pq.ConnStatus.OK:
                    raise psycopg.OperationalError("the server closed the connection")
                while True:
                    note = conn.pgconn.notifies()
                    if note is None:
                        break
                    if note.relname == b"jobcap" and note.extra.decode() == self.queue:
                        self._woken = True
        return False

    def _on_notify(self, note: psycopg.Notify) -> None:
        if note.channel == "jobcap" and note.payload == self.queue:
            self._woken = True

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

    # --- one batch --------------------------------------------------------------------------

    def _work(self, jobs: list) -> None:
        with self._lock:
            self._waiting.extend(jobs)
        try:
            first = True
            while True:
                with self._lock:
                    if not self._waiting:
                        return
                    job = self._waiting.popleft()
                if job.lost:
                    self._settled(job, "stale", job.lost if isinstance(job.lost, StaleFence)
                                  else None)
                    continue
                if not first:
                    # It waited behind the others: renew its lease so the full timeout fits.
                    try:
                        self._heartbeat(job, running=False)
                    except StaleFence as stale:
                        self._settled(job, "stale", stale)
                        continue
                    except psycopg.OperationalError:
                        pass  # the side connection; the job's deadline still holds
                first = False
                self._run_one(job)
        finally:
            with self._lock:
                self._waiting.clear()

    def _run_one(self, job: Job) -> None:
        conn = self._conn
        assert conn is not None
        job.conn = conn
        try:
            self._start(job)
            try:
                self.handler(job)
            finally:
                self._finish_handler()
            state = sql.complete(conn, job.id, job.fence, job.output)
            conn.commit()
            self._settled(job, state, None)
        except JobTimeout as timeout:
            self._finish_handler()
            # The interrupted statement may still be in flight: cancel it and drop the
            # connection, and with it the job's transaction, rather than trust its state.
            try:
                conn.cancel()
            except Exception:
                pass
            self._disconnect()
            try:
                self._connect()
            except psycopg.OperationalError as error:
                raise _ConnectionLost(error) from error
            self._fail(job, f"JobTimeout: handler ran past its {self.timeout:g}s timeout",
                       timeout)
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
        if outcome == "succeeded":
            log.debug("worker %s: job %d succeeded", self.name, job.id)
        elif outcome != "stale":
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
            try:
                if self._side is None or self._side.closed:
                    self._side = psycopg.connect(self.conninfo, autocommit=True,
                                                 application_name=f"jobcap side {self.name}"[:63])
                sent = time.monotonic()
                expires = sql.heartbeat(self._side, job.id, job.fence)
            except StaleFence:
                raise
            except BaseException:
                # Lost, or interrupted mid-statement (JobTimeout): do not trust it again.
                if self._side is not None:
                    self._side.close()
                self._side = None
                raise
        job.lease_expires_at = expires
        job._granted_at = sent
        if running:
            with self._lock:
                if self._current is job:
                    self._deadline = sent + self.timeout
            self._arm()
        return expires

    def _supervise(self) -> None:
        tick = min(0.25, self.grace / 2)
        last = time.monotonic()
        resumed = last
        while not self._done.wait(tick):
            now = time.monotonic()
            if now - last > tick * 4 + 1:
                resumed = now  # the process was frozen (SIGSTOP, a VM pause): grant the grace anew
            last = now
            with self._lock:
                current, deadline = self._current, self._deadline
                interrupted = self._interrupted
                waiting = list(self._waiting)
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
